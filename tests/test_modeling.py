"""The model's promises, proven numerically on random inputs for both LayerNorm placements."""

import json
import math
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForSeq2SeqLM,
    CompileConfig,
    DataCollatorForSeq2Seq,
    Trainer,
    TrainingArguments,
)

from conftest import VOCAB, confident_model, random_batch, tiny_config, tiny_model, tiny_tokenizer
from vanilla_transformer import (
    VanillaTransformerConfig,
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
)
from vanilla_transformer.modeling_vanilla_transformer import CACHE_FIELD, SinusoidalPositionalEncoding
from vanilla_transformer.support_vanilla_transformer import label_smoothed_cross_entropy

ATOL = 1e-5  # float32 on CPU; observed differences are about 1e-6


def logits(model, input_ids, attention_mask, decoder_input_ids, **kwargs):
    with torch.no_grad():
        return model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
                     use_cache=False, **kwargs).logits


# §3.5 positional encoding ------------------------------------------------------------------------------

def test_positional_encoding_is_the_papers_formula_at_any_length():
    d_model = 10
    positions = torch.tensor([0, 1, 2, 7, 513, 100_000])  # far past any table a model might keep
    table = SinusoidalPositionalEncoding(d_model)(positions)
    for row, pos in enumerate(positions.tolist()):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert table[row, 2 * i].item() == pytest.approx(math.sin(angle), abs=2e-3 if pos > 1000 else 1e-5)
            assert table[row, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=2e-3 if pos > 1000 else 1e-5)


def test_sequences_longer_than_any_preset_length_run():
    model = tiny_model()
    input_ids = torch.randint(4, VOCAB, (1, 1500))
    out = logits(model, input_ids, torch.ones_like(input_ids), torch.ones(1, 3, dtype=torch.long))
    assert torch.isfinite(out).all()


# §3.2 masks -------------------------------------------------------------------------------------------

def test_right_padding_does_not_change_real_tokens(normalize_before):
    model = tiny_model(normalize_before=normalize_before)
    input_ids, _, labels = random_batch(batch=1, pad_rows=False)
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
    plain = model(input_ids=input_ids, decoder_input_ids=decoder_input_ids)
    padded_ids = torch.cat([input_ids, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    padded_mask = torch.cat([torch.ones_like(input_ids), torch.zeros(1, 4, dtype=torch.long)], dim=1)
    padded_decoder = torch.cat([decoder_input_ids, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    padded = model(input_ids=padded_ids, attention_mask=padded_mask, decoder_input_ids=padded_decoder)
    length, target_length = input_ids.shape[1], decoder_input_ids.shape[1]
    torch.testing.assert_close(padded.encoder_last_hidden_state[:, :length], plain.encoder_last_hidden_state,
                               atol=ATOL, rtol=0)
    torch.testing.assert_close(padded.logits[:, :target_length], plain.logits, atol=ATOL, rtol=0)


def test_encoder_sees_the_whole_source_and_decoder_only_the_past(normalize_before):
    model = tiny_model(normalize_before=normalize_before)
    input_ids, _, labels = random_batch(batch=1, pad_rows=False)
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
    base = model(input_ids=input_ids, decoder_input_ids=decoder_input_ids)
    changed_source = input_ids.clone()
    changed_source[0, -1] = (changed_source[0, -1] + 1 - 4) % (VOCAB - 4) + 4
    after = model(input_ids=changed_source, decoder_input_ids=decoder_input_ids)
    # Not causal: the first source position reacts to a change in the last one.
    assert (after.encoder_last_hidden_state[0, 0] - base.encoder_last_hidden_state[0, 0]).abs().max() > 1e-4
    changed_target = decoder_input_ids.clone()
    changed_target[0, 3] = (changed_target[0, 3] + 1 - 4) % (VOCAB - 4) + 4
    after = model(input_ids=input_ids, decoder_input_ids=changed_target)
    # Causal: positions before the change are untouched, the changed one and later ones move.
    torch.testing.assert_close(after.logits[0, :3], base.logits[0, :3], atol=ATOL, rtol=0)
    assert (after.logits[0, 3:] - base.logits[0, 3:]).abs().max() > 1e-4


@pytest.mark.parametrize("target", ["decoder_input_ids", "decoder_inputs_embeds"])
def test_labels_of_another_shape_than_the_decoder_inputs_name_both(target):
    model = tiny_model()
    input_ids, attention_mask, labels = random_batch()
    decoder_input_ids = torch.ones(3, 4, dtype=torch.long)
    decoder_inputs = {target: decoder_input_ids if target == "decoder_input_ids"
                      else model.get_input_embeddings()(decoder_input_ids)}
    with pytest.raises(ValueError, match=rf"`labels` has shape \(3, 6\), but `{target}` has shape \(3, 4"):
        model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, **decoder_inputs)


def test_eager_and_sdpa_give_the_same_logits(normalize_before):
    model = tiny_model(normalize_before=normalize_before)
    input_ids, attention_mask, labels = random_batch()
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
    sdpa = logits(model, input_ids, attention_mask, decoder_input_ids)
    model.set_attn_implementation("eager")
    eager = logits(model, input_ids, attention_mask, decoder_input_ids)
    torch.testing.assert_close(eager, sdpa, atol=ATOL, rtol=0)


def test_attention_weights_asked_of_sdpa_come_back_empty_with_a_warning(caplog):
    """As in-tree models (MarianMTModel) do: the backend records no weights, and says that eager attention does."""
    model = tiny_model()
    input_ids, attention_mask, labels = random_batch()
    with caplog.at_level("WARNING"):
        out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, output_attentions=True)
    assert "output_attentions" in caplog.text and "eager" in caplog.text
    assert out.encoder_attentions == out.decoder_attentions == out.cross_attentions == ()


def test_attention_weights_are_returned_by_eager_attention():
    model = tiny_model()
    input_ids, attention_mask, labels = random_batch()
    model.set_attn_implementation("eager")
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, output_attentions=True)
    assert out.encoder_attentions[0].shape == (3, 4, 7, 7)
    assert out.cross_attentions[-1].shape == (3, 4, 6, 7)
    # Padded source positions get no attention.
    assert out.cross_attentions[0][2, :, :, 3:].abs().max() == 0
    torch.testing.assert_close(out.decoder_attentions[0].sum(-1), torch.ones(3, 4, 6))


# Incremental decoding ---------------------------------------------------------------------------------

def test_cached_step_by_step_decoding_equals_the_full_forward(normalize_before):
    model = tiny_model(normalize_before=normalize_before)
    input_ids, attention_mask, labels = random_batch()
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
    full = logits(model, input_ids, attention_mask, decoder_input_ids)
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
        cache, steps = None, []
        for t in range(decoder_input_ids.shape[1]):
            out = model(encoder_outputs=encoder_outputs, attention_mask=attention_mask,
                        decoder_input_ids=decoder_input_ids[:, t:t + 1], cache=cache, use_cache=True)
            cache = getattr(out, CACHE_FIELD)
            steps.append(out.logits)
    assert cache.get_seq_length() == decoder_input_ids.shape[1]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=ATOL, rtol=0)


def test_the_cache_is_also_accepted_as_past_key_values():
    model = tiny_model()
    input_ids, attention_mask, labels = random_batch()
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
    full = logits(model, input_ids, attention_mask, decoder_input_ids)
    with torch.no_grad():
        first = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids[:, :4],
                      use_cache=True)
        rest = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids[:, 4:],
                     past_key_values=getattr(first, CACHE_FIELD), use_cache=True)
    torch.testing.assert_close(rest.logits, full[:, 4:], atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "settings",
    [dict(num_beams=1), dict(num_beams=4, num_return_sequences=2), dict(do_sample=True, num_beams=1, top_k=0)],
    ids=["greedy", "beam4", "sampling"],
)
def test_generation_is_identical_with_and_without_cache(settings, normalize_before):
    model = tiny_model(normalize_before=normalize_before)
    input_ids, attention_mask, _ = random_batch()
    outputs = []
    for use_cache in (True, False):
        torch.manual_seed(123)
        outputs.append(model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=12,
                                      use_cache=use_cache, return_dict_in_generate=True, output_scores=True,
                                      **settings))
    cached, uncached = outputs
    assert cached.sequences.shape[1] > 5
    torch.testing.assert_close(cached.sequences, uncached.sequences, atol=0, rtol=0)
    torch.testing.assert_close(torch.stack(cached.scores), torch.stack(uncached.scores), atol=1e-4, rtol=0)


def test_static_cache_generates_like_the_dynamic_one():
    model = tiny_model()
    input_ids, attention_mask, _ = random_batch()
    dynamic = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=10, num_beams=3)
    static = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=10, num_beams=3,
                            cache_implementation="static")
    torch.testing.assert_close(static, dynamic, atol=0, rtol=0)


def test_static_cache_decoding_compiles_as_one_graph_and_generates_like_the_dynamic_cache():
    # generate() compiles the decoding step when the cache is static (on a GPU by default, here by request);
    # fullgraph=True fails on any graph break, e.g. a branch on the cache's length, which is a tensor there.
    model = tiny_model()
    input_ids, attention_mask, _ = random_batch()
    dynamic = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=10, num_beams=1)
    graphs = []

    def backend(graph_module, example_inputs):  # runs the captured graph as it is, and counts it
        graphs.append(graph_module)
        return graph_module.forward

    compile_config = CompileConfig(backend=backend, fullgraph=True, mode=None)
    compile_config._compile_all_devices = True  # transformers compiles on accelerators only unless told
    torch._dynamo.reset()
    compiled = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=10, num_beams=1,
                              cache_implementation="static", compile_config=compile_config)
    torch.testing.assert_close(compiled, dynamic, atol=0, rtol=0)
    assert len(graphs) == 1  # the decoding step was compiled, once, as one graph


def test_a_4d_decoder_mask_is_used_as_the_attention_mask_it_is():
    model = tiny_model()
    input_ids, attention_mask, labels = random_batch()
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
    length = decoder_input_ids.shape[1]
    # Causal, and in the first row position 2 hidden from every later query: what a 2-D mask with a hole gives.
    keep = torch.ones(3, length, dtype=torch.long)
    keep[0, 2] = 0
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    four_d = (causal & keep.bool()[:, None, None, :]) | torch.eye(length, dtype=torch.bool)
    expected = logits(model, input_ids, attention_mask, decoder_input_ids, decoder_attention_mask=keep)
    given = logits(model, input_ids, attention_mask, decoder_input_ids, decoder_attention_mask=four_d)
    plain = logits(model, input_ids, attention_mask, decoder_input_ids)
    rows_after_the_hole = slice(3, None)
    torch.testing.assert_close(given[:, rows_after_the_hole], expected[:, rows_after_the_hole], atol=ATOL, rtol=0)
    # Ignoring the 4-D mask would give the plain causal logits, which differ in the first row after the hole.
    assert (given[0, 3:] - plain[0, 3:]).abs().max() > 10 * ATOL
    torch.testing.assert_close(given[1:], plain[1:], atol=ATOL, rtol=0)


def test_a_new_model_without_a_generation_config_decodes_greedily():
    """What transformers assumes of every model: the paper's beam search is opted into, not forced."""
    model = tiny_model()
    assert model.generation_config.num_beams in (None, 1)
    assert getattr(model.generation_config, "length_penalty_type", "hf") == "hf"
    input_ids, attention_mask, _ = random_batch()
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=6,
                         return_dict_in_generate=True, output_scores=True)
    greedy = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=6, num_beams=1,
                            do_sample=False)
    assert not hasattr(out, "beam_indices") or out.beam_indices is None
    torch.testing.assert_close(out.sequences, greedy, atol=0, rtol=0)


def test_the_presets_and_the_paper_generation_config_decode_as_the_paper(tmp_path):
    from vanilla_transformer import paper_generation_config

    preset = VanillaTransformerForConditionalGeneration.from_preset("tiny", vocab_size=VOCAB)
    assert preset.config.label_smoothing == 0.1
    model = tiny_model()
    model.generation_config = paper_generation_config(model.config)
    for config in (preset.generation_config, model.generation_config):
        assert (config.num_beams, config.length_penalty, config.max_new_tokens_over_input,
                config.length_penalty_type) == (4, 0.6, 50, "gnmt")
    model.save_pretrained(tmp_path)  # carried by generation_config.json, so trained checkpoints keep it
    saved = json.loads((tmp_path / "generation_config.json").read_text())
    assert (saved["num_beams"], saved["length_penalty_type"], saved["max_new_tokens_over_input"]) == (4, "gnmt", 50)
    assert AutoModelForSeq2SeqLM.from_pretrained(tmp_path).generation_config.num_beams == 4
    input_ids, attention_mask, _ = random_batch()
    # With eos never reachable, the output stops at the budget: input length + 50 new tokens (+ start token).
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, suppress_tokens=[2])
    assert out.shape[1] == input_ids.shape[1] + 50 + 1
    assert model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=3).shape[1] == 4


# Saving and loading -----------------------------------------------------------------------------------

def test_saved_model_reloads_with_identical_logits_and_generations(tmp_path, normalize_before):
    model = tiny_model(normalize_before=normalize_before)
    model.generation_config.num_beams = 3
    input_ids, attention_mask, labels = random_batch()
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is VanillaTransformerForConditionalGeneration
    torch.testing.assert_close(logits(loaded, input_ids, attention_mask, decoder_input_ids),
                               logits(model, input_ids, attention_mask, decoder_input_ids), atol=0, rtol=0)
    generate = dict(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=10)
    torch.testing.assert_close(loaded.generate(**generate), model.generate(**generate), atol=0, rtol=0)
    assert loaded.generation_config.num_beams == 3


def test_the_shared_embedding_is_stored_once_and_stays_tied(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "pt") as weights:
        names = list(weights.keys())
    assert [n for n in names if "embed" in n or "shared" in n or "lm_head" in n] == ["model.shared.weight"]
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    shared = loaded.model.shared.weight
    assert loaded.lm_head.weight is shared
    assert loaded.model.encoder.embed_tokens.weight is shared and loaded.model.decoder.embed_tokens.weight is shared


def test_an_untied_output_projection_keeps_one_source_and_target_embedding(tmp_path):
    # §3.4 shares the embedding matrix between source and target whatever the output layer does.
    model = tiny_model(tie_word_embeddings=False)

    def matrices(m):
        return m.model.shared.weight, m.model.encoder.embed_tokens.weight, m.model.decoder.embed_tokens.weight

    shared, encoder, decoder = matrices(model)
    assert shared is encoder is decoder and model.lm_head.weight is not shared
    model.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "pt") as weights:
        stored = sorted(n for n in weights.keys() if "embed" in n or "shared" in n or "lm_head" in n)
    assert stored == ["lm_head.weight", "model.shared.weight"]
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    shared, encoder, decoder = matrices(loaded)
    assert shared is encoder is decoder and loaded.lm_head.weight is not shared
    torch.testing.assert_close(shared, model.model.shared.weight, atol=0, rtol=0)
    torch.testing.assert_close(loaded.lm_head.weight, model.lm_head.weight, atol=0, rtol=0)
    loaded.resize_token_embeddings(VOCAB + 8)
    shared, encoder, decoder = matrices(loaded)
    assert shared is encoder is decoder and shared.shape[0] == loaded.lm_head.weight.shape[0] == VOCAB + 8
    assert loaded.get_input_embeddings().weight is shared


def test_saved_folder_has_config_with_auto_map_and_code(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["auto_map"]["AutoModelForSeq2SeqLM"].endswith("VanillaTransformerForConditionalGeneration")
    assert config["auto_map"]["AutoModel"] == "modeling_vanilla_transformer.VanillaTransformerModel"
    assert (tmp_path / "modeling_vanilla_transformer.py").exists()
    assert (tmp_path / "configuration_vanilla_transformer.py").exists()


def test_a_truncated_checkpoint_fails_clearly(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(Exception, match="(?i)safetensor|header|deserializ|incomplete"):
        AutoModelForSeq2SeqLM.from_pretrained(tmp_path)


def test_a_checkpoint_of_another_shape_fails_clearly(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["encoder_ffn_dim"] = 128
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(Exception, match="(?i)mismatch"):
        AutoModelForSeq2SeqLM.from_pretrained(tmp_path)


def test_auto_classes_and_from_config_round_trip(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    config = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(config, VanillaTransformerConfig)
    base = AutoModel.from_pretrained(tmp_path)
    assert type(base) is VanillaTransformerModel
    torch.testing.assert_close(base.shared.weight, model.model.shared.weight, atol=0, rtol=0)
    fresh = AutoModelForSeq2SeqLM.from_config(config)
    assert type(fresh) is VanillaTransformerForConditionalGeneration
    assert fresh.lm_head.weight is fresh.model.shared.weight


def _uniform_bound(weight: torch.Tensor) -> float:
    """A uniform draw's bound, estimated from its standard deviation (bound / sqrt(3))."""
    return weight.std().item() * math.sqrt(3)


@pytest.mark.parametrize("tie_word_embeddings", [True, False])
def test_xavier_initialisation_draws_fairseqs_distributions_and_reloads_unchanged(tmp_path, tie_word_embeddings):
    d, ffn = 64, 256
    model = tiny_model(init_method="xavier", d_model=d, encoder_ffn_dim=ffn, decoder_ffn_dim=ffn, vocab_size=4000,
                       tie_word_embeddings=tie_word_embeddings)
    layer = model.model.decoder.layers[0]
    expected = {}  # weight -> Xavier-uniform bound sqrt(6 / (fan_in + fan_out)) times the gain
    for attention in (layer.self_attn, layer.encoder_attn):
        expected.update({attention.q_proj.weight: math.sqrt(6 / (2 * d) / 2), attention.k_proj.weight:
                         math.sqrt(6 / (2 * d) / 2), attention.v_proj.weight: math.sqrt(6 / (2 * d) / 2),
                         attention.out_proj.weight: math.sqrt(6 / (2 * d))})
    expected[layer.ffn.fc1.weight] = expected[layer.ffn.fc2.weight] = math.sqrt(6 / (d + ffn))
    for weight, bound in expected.items():
        assert weight.abs().max().item() <= bound
        assert _uniform_bound(weight) == pytest.approx(bound, rel=0.1)
    embeddings = [model.model.shared.weight, model.lm_head.weight]  # the output projection is an embedding too
    for weight in embeddings:
        assert weight[1:].std().item() == pytest.approx(d**-0.5, rel=0.05)
    assert model.model.shared.weight[model.config.pad_token_id].abs().max().item() == 0
    assert (model.lm_head.weight is model.model.shared.weight) == tie_word_embeddings
    biases = [m.bias for m in model.modules() if isinstance(m, torch.nn.Linear) and m.bias is not None]
    assert biases and all(bias.abs().max().item() == 0 for bias in biases)
    # Loading draws nothing: every weight comes back as saved.
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    assert loaded.config.init_method == "xavier"
    for (name, saved), (_, reloaded) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        torch.testing.assert_close(reloaded, saved, atol=0, rtol=0, msg=name)


def test_the_default_initialisation_draws_every_matrix_and_embedding_from_n_0_init_std():
    model = tiny_model(d_model=64, vocab_size=4000, init_std=0.05)
    assert model.config.init_method == "normal"
    for name, weight in model.named_parameters():
        if weight.dim() == 2:
            rows = weight[1:] if "shared" in name else weight  # the padding row is zero
            assert rows.std().item() == pytest.approx(0.05, rel=0.1), name


@pytest.mark.parametrize("init_method", ["normal", "xavier"])
def test_a_checkpoint_without_the_shared_embedding_loads_it_drawn_with_a_zero_padding_row(tmp_path, init_method):
    model = tiny_model(init_method=init_method)
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.shared.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    shared = loaded.model.shared.weight
    assert loaded.lm_head.weight is shared
    assert shared[loaded.config.pad_token_id].abs().max().item() == 0 and shared[1:].abs().max().item() > 0
    torch.testing.assert_close(loaded.model.encoder.layers[0].ffn.fc1.weight,
                               model.model.encoder.layers[0].ffn.fc1.weight, atol=0, rtol=0)


def test_resizing_the_vocabulary_keeps_every_tie():
    model = tiny_model()
    model.resize_token_embeddings(VOCAB + 16)
    shared = model.get_input_embeddings().weight
    assert shared.shape[0] == VOCAB + 16 and model.config.vocab_size == VOCAB + 16
    assert model.lm_head.weight is shared
    assert model.model.encoder.embed_tokens.weight is shared and model.model.decoder.embed_tokens.weight is shared
    out = model(input_ids=torch.tensor([[VOCAB + 10, 5]]), labels=torch.tensor([[VOCAB + 15]]))
    assert out.logits.shape[-1] == VOCAB + 16


# Training ---------------------------------------------------------------------------------------------

def test_loss_is_label_smoothed_cross_entropy_over_real_labels():
    model = tiny_model(label_smoothing=0.1)
    input_ids, attention_mask, labels = random_batch()
    labels[0, -2:] = -100
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    real = labels != -100
    log_probs = out.logits.float().log_softmax(-1)[real]
    targets = labels[real]
    nll = -log_probs.gather(-1, targets[:, None]).squeeze(-1)
    smooth = -log_probs.mean(-1)
    expected = (0.9 * nll + 0.1 * smooth).mean()
    torch.testing.assert_close(out.loss, expected, atol=1e-6, rtol=0)
    summed = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels,
                   num_items_in_batch=torch.tensor(real.sum().item() * 2))
    torch.testing.assert_close(summed.loss, expected / 2, atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [7, 1 << 17])  # one block of rows; several blocks (about a million logits each)
def test_the_loss_and_its_gradient_equal_torchs_smoothed_cross_entropy_in_float32(dtype, vocab):
    generator = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(2, 20, vocab, generator=generator)).to(dtype)
    labels = torch.randint(0, vocab, (2, 20), generator=generator)
    labels[1, 15:] = -100
    ours = logits.clone().requires_grad_()
    loss = label_smoothed_cross_entropy(ours, labels, 0.1)
    loss.backward(torch.tensor(3.0))
    reference = logits.clone().requires_grad_()
    expected = torch.nn.functional.cross_entropy(reference.float().flatten(0, 1), labels.flatten(), ignore_index=-100,
                                                 label_smoothing=0.1)
    expected.backward(torch.tensor(3.0))
    assert loss.dtype == torch.float32 and ours.grad.dtype == dtype
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-6)
    # float32: sums over 131k logits in another order; bfloat16 gradients keep 8 bits of mantissa
    tolerance = dict(atol=1e-6, rtol=3e-4) if dtype == torch.float32 else dict(atol=1e-6, rtol=8e-3)
    torch.testing.assert_close(ours.grad, reference.grad, **tolerance)
    assert ours.grad[1, 15:].abs().max() == 0


def test_collator_builds_decoder_inputs_from_labels():
    model = tiny_model()
    collator = DataCollatorForSeq2Seq(tiny_tokenizer(), model=model, label_pad_token_id=-100)
    features = [{"input_ids": [5, 6, 2], "labels": [7, 8, 2]}, {"input_ids": [9, 2], "labels": [11, 12, 13, 2]}]
    batch = collator(features, return_tensors="pt")
    assert batch["input_ids"].tolist() == [[5, 6, 2], [9, 2, 0]]
    assert batch["labels"].tolist() == [[7, 8, 2, -100], [11, 12, 13, 2]]
    assert batch["decoder_input_ids"].tolist() == [[1, 7, 8, 2], [1, 11, 12, 13]]


class _Pairs(torch.utils.data.Dataset):
    def __init__(self, n=8, seed=3):
        generator = torch.Generator().manual_seed(seed)
        self.items = []
        for i in range(n):
            src = torch.randint(4, VOCAB, (3 + i % 4,), generator=generator).tolist() + [2]
            tgt = torch.randint(4, VOCAB, (2 + i % 5,), generator=generator).tolist() + [2]
            self.items.append({"input_ids": src, "attention_mask": [1] * len(src), "labels": tgt})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def _train_one_step(tmp_path, batch_size, accumulation):
    model = tiny_model(seed=4, label_smoothing=0.1).train()
    args = TrainingArguments(output_dir=str(tmp_path / f"run{batch_size}"), per_device_train_batch_size=batch_size,
                             gradient_accumulation_steps=accumulation, max_steps=1, learning_rate=0.5,
                             # SGD: the update is the gradient itself; Adam would blow up float noise in the
                             # key biases, whose true gradient is zero (softmax ignores a per-row shift).
                             optim="sgd",
                             report_to="none", use_cpu=True, save_strategy="no", logging_strategy="no",
                             dataloader_drop_last=False, seed=0, data_seed=0)
    collator = DataCollatorForSeq2Seq(tiny_tokenizer(), model=model, label_pad_token_id=-100)

    class Sequential(Trainer):  # the same examples in the same order for both runs
        def _get_train_sampler(self, *args, **kwargs):
            return torch.utils.data.SequentialSampler(self.train_dataset)

    Sequential(model=model, args=args, train_dataset=_Pairs(), data_collator=collator).train()
    return model


def test_gradient_accumulation_2x4_trains_like_one_batch_of_8(tmp_path):
    accumulated = _train_one_step(tmp_path, batch_size=4, accumulation=2)
    whole = _train_one_step(tmp_path, batch_size=8, accumulation=1)
    untrained = tiny_model(seed=4)
    moved = max((a - u).abs().max().item() for a, u in zip(whole.parameters(), untrained.parameters()))
    assert moved > 1e-3  # the step really changed the weights
    for (name, a), b in zip(accumulated.named_parameters(), whole.parameters()):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=0, msg=name)


def test_training_with_dropout_and_gradient_checkpointing_gives_the_same_gradients():
    """Recomputed layers must draw the same dropout masks as the first pass."""
    input_ids, attention_mask, labels = random_batch()
    grads = []
    for checkpointing in (False, True):
        model = tiny_model(dropout=0.3).train()
        if checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        torch.manual_seed(5)
        model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-6, rtol=0, msg=name)


def test_gradient_checkpointing_gives_the_same_gradients(normalize_before):
    input_ids, attention_mask, labels = random_batch()
    grads = []
    for checkpointing in (False, True):
        model = tiny_model(normalize_before=normalize_before, dropout=0.0).train()
        if checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-6, rtol=0, msg=name)


def test_a_tiny_model_learns_to_copy_random_sequences():
    """The classic sanity task: after a few hundred steps greedy decoding copies unseen sequences exactly."""
    torch.manual_seed(0)
    config = tiny_config(vocab_size=14, d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128, dropout=0.0)
    model = VanillaTransformerForConditionalGeneration(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3, betas=(0.9, 0.98), eps=1e-9)
    # Post-LN needs a warm-up (§5.3): 50 steps up, then inverse square-root decay.
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min((step + 1) / 50, (50 / (step + 1)) ** 0.5))

    def batch(n, generator):
        body = torch.randint(4, 14, (n, 8), generator=generator)
        ids = torch.cat([body, torch.full((n, 1), 2)], dim=1)  # source and target end in eos
        return ids, ids.clone()

    train_generator = torch.Generator().manual_seed(1)
    model.train()
    for _ in range(300):
        input_ids, labels = batch(64, train_generator)
        loss = model(input_ids=input_ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    model.eval()
    input_ids, labels = batch(100, torch.Generator().manual_seed(99))
    out = model.generate(input_ids=input_ids, num_beams=1, max_new_tokens=9)
    exact = (out[:, 1:10] == labels).all(dim=1).float().mean().item()
    assert exact >= 0.95, f"only {exact:.0%} of unseen sequences copied exactly"


# Bad input --------------------------------------------------------------------------------------------

def test_out_of_vocabulary_ids_name_the_id():
    model = tiny_model()
    with pytest.raises(ValueError, match=f"id {VOCAB + 3}.*vocabulary"):
        model(input_ids=torch.tensor([[5, VOCAB + 3]]), decoder_input_ids=torch.tensor([[1]]))
    with pytest.raises(ValueError, match="`decoder_input_ids` holds id -7"):
        model(input_ids=torch.tensor([[5, 6]]), decoder_input_ids=torch.tensor([[1, -7]]))
    with pytest.raises(ValueError, match="labels.*id 999"):
        model(input_ids=torch.tensor([[5, 6]]), labels=torch.tensor([[999, -100]]))


def test_a_mismatched_attention_mask_is_refused():
    model = tiny_model()
    with pytest.raises(ValueError, match=r"attention_mask.*\(2, 5\).*\(2, 4\)"):
        model(input_ids=torch.ones(2, 4, dtype=torch.long) * 5, attention_mask=torch.ones(2, 5, dtype=torch.long),
              decoder_input_ids=torch.ones(2, 1, dtype=torch.long))


@pytest.mark.parametrize("shape", [(0, 5), (2, 0)])
def test_an_empty_batch_is_refused(shape):
    model = tiny_model()
    with pytest.raises(ValueError, match="empty"):
        model(input_ids=torch.zeros(shape, dtype=torch.long), decoder_input_ids=torch.ones(2, 1, dtype=torch.long))


def test_float_ids_are_refused_with_their_dtype():
    model = tiny_model()
    with pytest.raises(TypeError, match="torch.float32"):
        model(input_ids=torch.ones(1, 3), decoder_input_ids=torch.ones(1, 1, dtype=torch.long))


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_a_row_that_is_all_padding_gives_finite_outputs(implementation):
    model = tiny_model()
    model.set_attn_implementation(implementation)
    input_ids, attention_mask, labels = random_batch()
    input_ids[1], attention_mask[1] = 0, 0
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.loss)
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    generated = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=5)
    assert generated.shape == (3, 6)
    # The other rows are unaffected by the empty one.
    alone = model.generate(input_ids=input_ids[[0, 2]], attention_mask=attention_mask[[0, 2]], max_new_tokens=5)
    torch.testing.assert_close(generated[[0, 2]], alone, atol=0, rtol=0)


def test_cache_passed_twice_is_refused():
    model = tiny_model()
    input_ids, attention_mask, labels = random_batch()
    start = torch.ones(3, 1, dtype=torch.long)
    with torch.no_grad():
        one, other = (getattr(model(input_ids=input_ids, decoder_input_ids=start, use_cache=True), CACHE_FIELD)
                      for _ in range(2))
        with pytest.raises(ValueError, match="Both `past_key_values` and `cache`"):
            model(input_ids=input_ids, decoder_input_ids=start, cache=one, past_key_values=other)


def test_generation_config_survives_a_round_trip_of_custom_values(tmp_path):
    from vanilla_transformer import paper_generation_config

    model = tiny_model()
    model.generation_config = paper_generation_config(model.config)
    model.generation_config.num_beams, model.generation_config.max_new_tokens_over_input = 5, 7
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    assert loaded.generation_config.num_beams == 5 and loaded.generation_config.max_new_tokens_over_input == 7


# §6.1 beam scoring: GNMT length penalty -------------------------------------------------------------

class _HandBuiltScores:
    """Log-probabilities fixed by the prefix, so the beam search has exactly two ways to finish:
    A = [5, eos] with log P = -1.0 (|Y| = 2), and B = [6, 8, 8, 8, eos] with log P = -1.6 (|Y| = 5)."""

    def __call__(self, input_ids, scores):
        out = torch.full_like(scores, -1e4)
        for row, prefix in enumerate(input_ids[:, 1:].tolist()):
            if not prefix:
                out[row, 5], out[row, 6] = -0.5, -0.6
            elif prefix[0] == 5:
                out[row, 2], out[row, 9] = (-0.5, -3.0) if len(prefix) == 1 else (-10.0, -10.0)
            elif prefix.count(8) < 3:
                out[row, 8], out[row, 2] = -0.1, -50.0
            else:
                out[row, 2], out[row, 8] = -0.7, -50.0
        return out


def _hand_built_beam_search(model, penalty_type):
    from transformers import LogitsProcessorList

    input_ids = torch.tensor([[5, 6, 7, 2]])
    return model.generate(input_ids=input_ids, num_beams=2, length_penalty=0.6, early_stopping="never",
                          max_new_tokens=8, length_penalty_type=penalty_type, output_scores=True,
                          return_dict_in_generate=True, logits_processor=LogitsProcessorList([_HandBuiltScores()]))


def test_gnmt_penalty_ranks_hypotheses_as_the_formula_says():
    model = tiny_model()
    short, long = [1, 5, 2], [1, 6, 8, 8, 8, 2]
    # HF: -1.0 / 2^0.6 = -0.660 < -1.6 / 5^0.6 = -0.609, so the long one wins;
    # GNMT: -1.0 / (7/6)^0.6 = -0.912 > -1.6 / (10/6)^0.6 = -1.177, so the short one wins.
    hf = _hand_built_beam_search(model, "hf")
    gnmt = _hand_built_beam_search(model, "gnmt")
    assert hf.sequences[0].tolist() == long
    assert gnmt.sequences[0].tolist()[:3] == short and set(gnmt.sequences[0].tolist()[3:]) <= {0}
    assert hf.sequences_scores.item() == pytest.approx(-1.6 / 5**0.6, abs=1e-5)
    assert gnmt.sequences_scores.item() == pytest.approx(-1.0 / (7 / 6) ** 0.6, abs=1e-5)


def test_gnmt_is_the_paper_configs_penalty_and_greedy_is_unaffected():
    from vanilla_transformer import paper_generation_config

    model = tiny_model()
    assert paper_generation_config(model.config).length_penalty_type == "gnmt"
    input_ids, attention_mask, _ = random_batch()
    greedy = [model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=1, max_new_tokens=10,
                             length_penalty_type=kind) for kind in ("gnmt", "hf")]
    torch.testing.assert_close(greedy[0], greedy[1], atol=0, rtol=0)
    with pytest.raises(ValueError, match="'bogus'"):
        model.generate(input_ids=input_ids, attention_mask=attention_mask, length_penalty_type="bogus")


@pytest.mark.parametrize("method, reads", [
    ("_update_finished_beams", {"cur_len", "decoder_prompt_len", "length_penalty"}),
    ("_check_early_stop_heuristic", {"cur_len", "decoder_prompt_len", "length_penalty", "early_stopping", "max_length"}),
])
def test_the_private_generation_methods_the_gnmt_penalty_overrides_are_still_there(method, reads):
    """The GNMT penalty overrides two private GenerationMixin methods; the day transformers renames one, this
    says which, instead of the paper's beam search silently ranking by |Y|^alpha."""
    import inspect

    import transformers
    from transformers.generation.utils import GenerationMixin

    where = f"transformers {transformers.__version__}: GenerationMixin.{method}"
    assert hasattr(GenerationMixin, method), f"{where} is gone; length_penalty_type='gnmt' overrides it"
    missing = reads - set(inspect.signature(getattr(GenerationMixin, method)).parameters)
    assert not missing, f"{where} no longer takes {sorted(missing)}, which the GNMT override reads"
    assert getattr(VanillaTransformerForConditionalGeneration, method) is not getattr(GenerationMixin, method)


def test_generate_from_two_threads_at_once_ranks_every_call_as_it_does_alone():
    """A server decodes on one model from several threads, each call with its own penalty."""
    model = confident_model(quiet_eos=False)
    with torch.no_grad():  # a louder end-of-sequence token: hypotheses end at several lengths
        model.model.shared.weight[model.config.eos_token_id] *= 2
    # A short and a long call, so that one finishes while the other still ranks its hypotheses.
    sources = {budget: random_batch(batch=8, source_length=9, seed=seed)[:2] for seed, budget in ((1, 5), (2, 12))}

    def beam_search(budget, penalty, barrier=None):
        if barrier is not None:
            barrier.wait()
        input_ids, attention_mask = sources[budget]
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=4, length_penalty=1.0,
                             max_new_tokens=budget, length_penalty_type=penalty, output_scores=True,
                             return_dict_in_generate=True)
        return out.sequences, out.sequences_scores

    alone = {(budget, penalty): beam_search(budget, penalty) for budget in sources for penalty in ("gnmt", "hf")}
    assert not torch.equal(alone[12, "gnmt"][0], alone[12, "hf"][0])  # the two penalties rank apart here
    rounds, wrong = 20, {}
    for pair in (((5, "gnmt"), (12, "gnmt")), ((5, "gnmt"), (12, "hf")), ((5, "hf"), (12, "gnmt"))):
        for _ in range(rounds):
            barrier = threading.Barrier(2)
            with ThreadPoolExecutor(2) as pool:
                results = list(pool.map(lambda call: beam_search(*call, barrier), pair))
            for call, (sequences, scores) in zip(pair, results):
                if not (torch.equal(sequences, alone[call][0]) and torch.equal(scores, alone[call][1])):
                    wrong[pair] = wrong.get(pair, 0) + 1
    assert not wrong, f"calls ranked otherwise than alone, of {2 * rounds} per pair (budget, penalty): {wrong}"


# The contracts transformers makes of every model ------------------------------------------------------

def test_config_output_attentions_and_hidden_states_are_honoured(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, output_attentions=True, output_hidden_states=True,
                                                  attn_implementation="eager").eval()
    input_ids, attention_mask, labels = random_batch()
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    layers = model.config.encoder_layers
    assert len(out.encoder_hidden_states) == len(out.decoder_hidden_states) == layers + 1
    for weights in (out.encoder_attentions, out.decoder_attentions, out.cross_attentions):
        assert len(weights) == layers and all(isinstance(w, torch.Tensor) for w in weights)
    quiet = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, output_attentions=False,
                  output_hidden_states=False)  # an argument wins over the config
    assert quiet.encoder_attentions is None and quiet.decoder_hidden_states is None


def test_hidden_states_and_attentions_are_recorded_only_when_asked_and_agree_across_backends(normalize_before):
    model = tiny_model(normalize_before=normalize_before)
    input_ids, attention_mask, labels = random_batch()
    plain = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    assert plain.encoder_hidden_states is plain.decoder_hidden_states is plain.encoder_attentions is None
    recorded = {}
    for implementation in ("eager", "sdpa"):
        model.set_attn_implementation(implementation)
        recorded[implementation] = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels,
                                         output_hidden_states=True, output_attentions=implementation == "eager")
    eager, sdpa = recorded["eager"], recorded["sdpa"]
    for name in ("encoder_hidden_states", "decoder_hidden_states"):
        assert len(getattr(eager, name)) == model.config.encoder_layers + 1
        for a, b in zip(getattr(eager, name), getattr(sdpa, name), strict=True):
            torch.testing.assert_close(a, b)
    # The first is the embedded input, the last the stack's output (after a pre-LN stack's final LayerNorm).
    torch.testing.assert_close(eager.encoder_hidden_states[-1], eager.encoder_last_hidden_state, atol=0, rtol=0)
    torch.testing.assert_close(eager.logits, plain.logits)
    assert len(eager.cross_attentions) == model.config.decoder_layers


def test_inputs_embeds_from_the_input_embeddings_give_the_outputs_of_the_ids(normalize_before):
    model = tiny_model(normalize_before=normalize_before)
    input_ids, attention_mask, labels = random_batch()
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
    embed = model.get_input_embeddings()
    from_ids = logits(model, input_ids, attention_mask, decoder_input_ids)
    with torch.no_grad():
        from_embeds = model(inputs_embeds=embed(input_ids), attention_mask=attention_mask,
                            decoder_inputs_embeds=embed(decoder_input_ids), use_cache=False).logits
    torch.testing.assert_close(from_embeds, from_ids, atol=0, rtol=0)
    assert embed is model.model.encoder.embed_tokens or embed.weight is model.model.encoder.embed_tokens.weight


def test_a_bare_config_gives_plain_cross_entropy_and_saved_configs_state_the_smoothing(tmp_path):
    model = tiny_model(label_smoothing=VanillaTransformerConfig().label_smoothing)
    input_ids, attention_mask, labels = random_batch()
    labels[0, -2:] = -100
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    expected = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    torch.testing.assert_close(out.loss, expected, atol=1e-6, rtol=0)
    for label_smoothing in (0.0, 0.1):
        tiny_model(label_smoothing=label_smoothing).save_pretrained(tmp_path / str(label_smoothing))
        saved = json.loads((tmp_path / str(label_smoothing) / "config.json").read_text())
        assert saved["label_smoothing"] == label_smoothing


def test_beam_search_caches_one_row_per_beam_in_both_attentions():
    model = tiny_model()
    input_ids, attention_mask, _ = random_batch()
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=4, num_beams=4,
                         return_dict_in_generate=True)
    cache = getattr(out, CACHE_FIELD)
    assert cache.self_attention_cache.layers[0].keys.shape[0] == 12
    assert cache.cross_attention_cache.layers[0].keys.shape[0] == 12


def test_the_old_cache_name_warns_from_5_24_on_and_is_the_name_before():
    import warnings

    model = tiny_model()
    input_ids, attention_mask, labels = random_batch()
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
    with torch.no_grad():
        first = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids[:, :3],
                      use_cache=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids[:, 3:],
                  past_key_values=getattr(first, CACHE_FIELD), use_cache=True)
    deprecated = [w for w in caught if "`past_key_values` is deprecated" in str(w.message)]
    assert len(deprecated) == (1 if CACHE_FIELD == "cache" else 0)


def test_cached_and_uncached_decoding_agree_at_every_position_padding_included():
    model = tiny_model()
    input_ids, attention_mask, labels = random_batch()
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
    decoder_attention_mask = torch.ones_like(decoder_input_ids)
    decoder_attention_mask[1, -2:] = 0  # right-padded targets
    with torch.no_grad():
        full = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
                     decoder_attention_mask=decoder_attention_mask, use_cache=False, output_hidden_states=True)
        encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
        cache, steps = None, []
        for t in range(decoder_input_ids.shape[1]):
            out = model(encoder_outputs=encoder_outputs, attention_mask=attention_mask,
                        decoder_input_ids=decoder_input_ids[:, t:t + 1],
                        decoder_attention_mask=decoder_attention_mask[:, :t + 1], cache=cache, use_cache=True,
                        output_hidden_states=True)
            cache = getattr(out, CACHE_FIELD)
            steps.append(out)
    torch.testing.assert_close(torch.cat([o.logits for o in steps], 1), full.logits, atol=ATOL, rtol=0)
    for layer, hidden in enumerate(full.decoder_hidden_states):
        torch.testing.assert_close(torch.cat([o.decoder_hidden_states[layer] for o in steps], 1), hidden,
                                   atol=ATOL, rtol=0)
    assert full.logits[1, -1].abs().sum() > 0  # padded positions are computed, not zeros


def test_decoding_reads_no_ids_back_per_step(monkeypatch):
    """Only the ids a user passes are range-checked; a check per generated token would stall a GPU."""
    import vanilla_transformer.support_vanilla_transformer as support

    checked = []
    original = support.check_token_ids
    monkeypatch.setattr(support, "check_token_ids", lambda ids, name, *a, **k: checked.append(name) or
                        original(ids, name, *a, **k))
    model = tiny_model()
    input_ids, attention_mask, _ = random_batch()
    for beams in (1, 3):
        checked.clear()
        model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=10, min_new_tokens=10,
                       num_beams=beams)
        assert checked == ["input_ids"]
    checked.clear()
    model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=3,
                   decoder_input_ids=torch.ones(3, 2, dtype=torch.long))
    assert checked == ["decoder_input_ids", "input_ids"]


# Bad input, found by trying it ------------------------------------------------------------------------

@pytest.mark.parametrize("num_items_in_batch", [None, 0])
def test_a_batch_without_labels_gives_a_zero_loss_and_zero_gradients(num_items_in_batch):
    model = tiny_model(label_smoothing=0.1).train()
    input_ids, attention_mask, labels = random_batch()
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=torch.full_like(labels, -100),
                num_items_in_batch=num_items_in_batch)
    assert out.loss.item() == 0.0
    out.loss.backward()
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("name", ["inputs_embeds", "decoder_inputs_embeds"])
def test_inputs_embeds_of_the_wrong_width_name_the_argument_and_the_width(name):
    model = tiny_model()
    input_ids, attention_mask, labels = random_batch()
    embeds = {"inputs_embeds": model.get_input_embeddings()(input_ids),
              "decoder_inputs_embeds": model.get_input_embeddings()(labels)}
    embeds[name] = embeds[name][..., :31]
    with pytest.raises(ValueError, match=rf"`{name}` must have shape \(batch, length, d_model=32\), got \(3, \d, 31\)"):
        model(attention_mask=attention_mask, **embeds)


@pytest.mark.parametrize("source", ["input_ids", "inputs_embeds", "encoder_outputs"])
@pytest.mark.parametrize("target", ["labels", "decoder_input_ids", "decoder_inputs_embeds"])
def test_a_target_batch_of_another_size_than_the_source_batch_names_the_arguments_passed(source, target):
    model = tiny_model()
    input_ids, attention_mask, _ = random_batch(batch=2)
    sources = {"input_ids": input_ids, "inputs_embeds": model.get_input_embeddings()(input_ids),
               "encoder_outputs": model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)}
    target_ids = torch.randint(4, VOCAB, (3, 5))
    targets = {"labels": target_ids, "decoder_input_ids": target_ids,
               "decoder_inputs_embeds": model.get_input_embeddings()(target_ids)}
    with pytest.raises(ValueError, match=rf"`{target}` holds 3 sequences .* but `{source}` holds 2 .*own source"):
        model(attention_mask=attention_mask, **{source: sources[source], target: targets[target]})


@pytest.mark.parametrize("source", ["input_ids", "inputs_embeds", "encoder_outputs"])
def test_a_source_mask_of_another_shape_names_the_source_argument(source):
    model = tiny_model()
    input_ids, attention_mask, labels = random_batch(batch=2)
    sources = {"input_ids": input_ids, "inputs_embeds": model.get_input_embeddings()(input_ids),
               "encoder_outputs": model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)}
    with pytest.raises(ValueError, match=rf"`attention_mask` has shape \(2, 5\), but `{source}` has shape \(2, 7"):
        model(attention_mask=attention_mask[:, :5], labels=labels[:2], **{source: sources[source]})


def test_a_decoder_mask_of_another_shape_than_the_labels_names_the_labels():
    model = tiny_model()
    input_ids, attention_mask, labels = random_batch()
    with pytest.raises(ValueError, match=r"`decoder_attention_mask` has shape \(3, 4\), but `labels` has shape \(3, 6\)"):
        model(input_ids=input_ids, attention_mask=attention_mask, labels=labels,
              decoder_attention_mask=torch.ones(3, 4, dtype=torch.long))


# An optional logits bias (lm_head_bias), for converted OPUS-MT checkpoints ------------------------------

def test_without_lm_head_bias_the_model_and_old_checkpoints_are_unchanged(tmp_path):
    model = tiny_model()
    assert model.lm_head.bias is None and "lm_head.bias" not in model.state_dict()
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["lm_head_bias"]  # as every checkpoint saved before the field existed
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded, info = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and loaded.lm_head.bias is None


def test_the_lm_head_bias_is_saved_reloaded_and_padded_with_zeros_for_new_tokens(tmp_path):
    model = tiny_model(lm_head_bias=True)
    assert torch.equal(model.lm_head.bias, torch.zeros(VOCAB))  # a new model starts unbiased
    with torch.no_grad():
        model.lm_head.bias.normal_(generator=torch.Generator().manual_seed(0))
    input_ids, attention_mask, labels = random_batch()
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
    with_bias = logits(model, input_ids, attention_mask, decoder_input_ids)
    model.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "pt") as weights:
        assert "lm_head.bias" in weights.keys()
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(logits(loaded, input_ids, attention_mask, decoder_input_ids), with_bias, atol=0, rtol=0)
    assert loaded.lm_head.weight is loaded.model.shared.weight
    old = loaded.lm_head.bias.detach().clone()
    loaded.resize_token_embeddings(VOCAB + 8)
    assert loaded.lm_head.bias.shape == (VOCAB + 8,) and loaded.lm_head.weight is loaded.model.shared.weight
    torch.testing.assert_close(loaded.lm_head.bias[:VOCAB], old, atol=0, rtol=0)
    assert not loaded.lm_head.bias[VOCAB:].any()


def test_the_training_step_compiles_as_one_forward_and_one_backward_graph_and_trains_like_eager():
    """torch.compile(fullgraph=True) fails on any graph break: nothing in the loss or the model reads a value back."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = {"forward": [], "backward": []}

    def counting(kind):
        def compiler(graph_module, example_inputs):
            graphs[kind].append(graph_module)
            return make_boxed_func(graph_module.forward)
        return compiler

    model = tiny_model(label_smoothing=0.1).train()
    input_ids, attention_mask, labels = random_batch()
    labels[0, -2:] = -100
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True,
                             backend=aot_autograd(fw_compiler=counting("forward"), bw_compiler=counting("backward")))
    losses, gradients = [], []
    for run in (compiled, model):
        model.zero_grad()
        loss = run(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        losses.append(loss.detach())
        gradients.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    assert (len(graphs["forward"]), len(graphs["backward"])) == (1, 1)
    torch.testing.assert_close(losses[0], losses[1], atol=1e-6, rtol=0)
    for name in gradients[1]:
        torch.testing.assert_close(gradients[0][name], gradients[1][name], atol=1e-6, rtol=0, msg=name)


def test_a_training_step_reads_nothing_back_from_the_device(monkeypatch):
    """On an accelerator every read-back (`bool(t)`, `.item()`, `.tolist()`, ...) waits for the device to finish all
    queued work. A training step needs none: ids are checked in the collator, padding masks are kept as they are."""
    reads = []
    for name in ("__bool__", "item", "tolist", "__int__", "__float__", "__index__", "numpy", "nonzero", "cpu"):
        original = getattr(torch.Tensor, name)

        def recording(self, *args, _name=name, _original=original, **kwargs):
            reads.append(_name)
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, recording)
    model = tiny_model(label_smoothing=0.1).train()
    input_ids, attention_mask, labels = random_batch()
    labels[1, -2:] = -100
    loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    loss.backward()
    assert reads == []
    model.eval()  # outside training the ids are still checked here, which reads them back
    model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    assert "__bool__" in reads
