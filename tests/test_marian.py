"""Conversion from MarianMTModel (OPUS-MT): the converted model computes what Marian computes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, MarianConfig, MarianMTModel
from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

from conftest import VOCAB, run_without_the_package, snapshot, tiny_tokenizer
from vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.tools import marian as marian_module
from vanilla_transformer.tools.marian import convert_marian, residual_permutation
from vanilla_transformer.modeling_vanilla_transformer import SinusoidalPositionalEncoding

ROOT = Path(__file__).resolve().parents[1]
PAD = VOCAB - 1  # Marian puts pad last and decodes from it
# In float32 the matmul sums run in another order and the two position tables are rounded differently:
# observed max |Δlogit| 1.6e-5 to 2.9e-5 on logits up to ~22 (~1e-6 relative), the size of Marian's own
# eager-vs-sdpa difference (1.0e-5 to 1.7e-5). In float64 with one shared position table: 5e-14.
ATOL_FLOAT32 = 1e-4
CLI_ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}



def tiny_marian(seed=0, **overrides) -> MarianMTModel:
    """A random OPUS-MT-like model: swish, scaled embeddings, post-LN, pad = decoder start, eos = 0.

    Weights are drawn larger than Marian's init and the LayerNorm weights and biases are perturbed, so
    that the logits vary and a wrong permutation of the LayerNorm parameters could not go unnoticed.
    """
    torch.manual_seed(seed)
    config = MarianConfig(**{**dict(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, activation_function="swish",
        scale_embedding=True, dropout=0.0, max_position_embeddings=64, pad_token_id=PAD,
        decoder_start_token_id=PAD, eos_token_id=0, forced_eos_token_id=0), **overrides})
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "embed_positions" in name:
                continue
            if name.endswith("layer_norm.weight"):
                parameter.copy_(1 + 0.5 * torch.randn_like(parameter))
            elif name == "model.shared.weight":
                parameter.normal_(0, 1.0)
            elif name.endswith("weight"):
                parameter.normal_(0, 0.2)
            else:
                parameter.normal_(0, 0.1)
    model.generation_config.bad_words_ids = [[PAD]]  # as in OPUS-MT's generation_config.json
    return model


def padded_batch(seed=1):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, PAD, (4, 9), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 6:] = 0
    attention_mask[2, 3:] = 0
    input_ids[attention_mask == 0] = PAD
    decoder_input_ids = torch.randint(0, PAD, (4, 7), generator=generator)
    decoder_input_ids[:, 0] = PAD
    return input_ids, attention_mask, decoder_input_ids


def logits(model, input_ids, attention_mask, decoder_input_ids):
    with torch.no_grad():
        return model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits


@pytest.mark.parametrize("d_model", [32, 33])
def test_permuted_marian_positions_are_the_papers_interleaved_positions(d_model):
    marian = MarianSinusoidalPositionalEmbedding(512, d_model).create_weight()
    ours = SinusoidalPositionalEncoding(d_model)(torch.arange(512))
    # Marian's table is computed in float64, ours in float32: about 2e-5 apart at position 500.
    torch.testing.assert_close(ours, marian[:, residual_permutation(d_model)], atol=5e-5, rtol=0)


def test_converted_model_gives_the_same_logits():
    marian = tiny_marian()
    converted = convert_marian(marian)
    assert isinstance(converted, VanillaTransformerForConditionalGeneration)
    assert converted.config.activation_function == "swish" and not converted.config.normalize_before
    assert converted.config.decoder_start_token_id == PAD
    batch = padded_batch()
    expected, actual = logits(marian, *batch), logits(converted, *batch)
    assert expected.std() > 1  # the logits carry information, not just noise around zero
    torch.testing.assert_close(actual, expected, atol=ATOL_FLOAT32, rtol=0)


def test_the_mapping_is_exact_in_float64_given_the_same_position_table(monkeypatch):
    """Marian builds its table in float32 (even for a float64 model) and we compute ours in float32 arithmetic,
    so the tables differ by ~1e-7. Given Marian's own table, permuted, the rest of the mapping is exact."""
    marian = tiny_marian().double()
    table = MarianSinusoidalPositionalEmbedding(64, 32).create_weight().double()[:, residual_permutation(32)]
    monkeypatch.setattr(SinusoidalPositionalEncoding, "forward", lambda self, positions: table[positions])
    batch = padded_batch()
    torch.testing.assert_close(logits(convert_marian(marian), *batch), logits(marian, *batch), atol=1e-12, rtol=0)


def test_without_the_permutation_the_logits_differ(monkeypatch):
    """The control: the LayerNorm perturbation makes the permutation matter."""
    marian = tiny_marian()
    monkeypatch.setattr(marian_module, "residual_permutation", lambda d_model: torch.arange(d_model))
    batch = padded_batch()
    assert (logits(convert_marian(marian, verify=False), *batch) - logits(marian, *batch)).abs().max() > 0.1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_and_beam_search_translate_identically(seed):
    marian = tiny_marian(seed)
    converted = convert_marian(marian)
    input_ids, attention_mask, _ = padded_batch()
    for kwargs in [dict(num_beams=1), dict(num_beams=4), dict(num_beams=4, num_return_sequences=2)]:
        expected = marian.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=12, **kwargs)
        actual = converted.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=12, **kwargs)
        assert torch.equal(actual, expected), kwargs
        assert len(set(expected[:, 1:].flatten().tolist())) > 2  # not one token repeated
    # With no arguments both use Marian's generation config (our §6.1 defaults are not applied).
    assert torch.equal(converted.generate(input_ids=input_ids, attention_mask=attention_mask),
                       marian.generate(input_ids=input_ids, attention_mask=attention_mask))


@pytest.mark.parametrize("bias", ["nonzero", "zero"])
def test_an_opus_mt_logits_bias_converts_exactly(bias):
    """Every OPUS-MT checkpoint was trained with an output-layer bias (transformers' `final_logits_bias`)."""
    marian = tiny_marian()
    if bias == "nonzero":
        with torch.no_grad():
            marian.final_logits_bias.normal_(0, 2.0, generator=torch.Generator().manual_seed(3))
    converted = convert_marian(marian)
    assert converted.config.lm_head_bias == (bias == "nonzero")
    assert ("lm_head.bias" in converted.state_dict()) == (bias == "nonzero")
    batch = padded_batch()
    torch.testing.assert_close(logits(converted, *batch), logits(marian, *batch), atol=ATOL_FLOAT32, rtol=0)
    input_ids, attention_mask, _ = batch
    for beams in (1, 4):
        expected = marian.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=12, num_beams=beams)
        actual = converted.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=12,
                                    num_beams=beams)
        assert torch.equal(actual, expected), beams
    if bias == "nonzero":  # the bias decides: without it the logits move far beyond rounding
        with torch.no_grad():
            converted.lm_head.bias.zero_()
        assert (logits(converted, *batch) - logits(marian, *batch)).abs().max() > 1.0


def test_a_converted_model_with_a_logits_bias_loads_and_decodes_the_same_without_the_package(tmp_path):
    marian = tiny_marian()
    with torch.no_grad():
        marian.final_logits_bias.normal_(0, 2.0, generator=torch.Generator().manual_seed(3))
    convert_marian(marian, tmp_path / "vanilla")
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    body = """
import torch
from transformers import AutoModelForSeq2SeqLM
args = json.loads(sys.argv[1])
model = AutoModelForSeq2SeqLM.from_pretrained(args["folder"], trust_remote_code=True).eval()
ids, mask, decoder = (torch.tensor(args[k]) for k in ("input_ids", "attention_mask", "decoder_input_ids"))
with torch.no_grad():
    logits = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder).logits
    beams = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, num_beams=4)
print("RESULT " + json.dumps({"logits": logits.tolist(), "beams": beams.tolist(), "module": type(model).__module__}))
"""
    result = run_without_the_package(body, {"folder": str(tmp_path / "vanilla"), "input_ids": input_ids.tolist(),
                                            "attention_mask": attention_mask.tolist(),
                                            "decoder_input_ids": decoder_input_ids.tolist()}, tmp_path / "cwd")
    assert result["module"].startswith("transformers_modules.")
    expected = logits(marian, input_ids, attention_mask, decoder_input_ids)
    torch.testing.assert_close(torch.tensor(result["logits"]), expected, atol=ATOL_FLOAT32, rtol=0)
    assert result["beams"] == marian.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=12,
                                              num_beams=4).tolist()


def test_separate_vocabularies_are_refused():
    marian = tiny_marian(share_encoder_decoder_embeddings=False)
    with pytest.raises(ValueError, match="shared source/target vocabulary"):
        convert_marian(marian)


def test_command_line_tool_converts_a_saved_folder(tmp_path):
    marian = tiny_marian()
    marian.save_pretrained(tmp_path / "marian")
    tiny_tokenizer().save_pretrained(tmp_path / "marian")  # stands in for Marian's sentencepiece files
    command = [sys.executable, str(ROOT / "scripts" / "convert_marian_to_vanilla.py"),
               "--marian_dir", str(tmp_path / "marian"), "--output_dir", str(tmp_path / "vanilla")]
    result = subprocess.run(command, capture_output=True, text=True, env=CLI_ENV,
                            timeout=120)
    assert result.returncode == 0, result.stderr

    converted = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "vanilla").eval()
    assert converted.config.model_type == "vanilla_transformer"
    saved = {path.name for path in (tmp_path / "vanilla").iterdir()}
    assert {"tokenizer.json", "modeling_vanilla_transformer.py", "generation_config.json"} <= saved
    assert converted.generation_config.bad_words_ids == [[PAD]]
    reloaded_marian = MarianMTModel.from_pretrained(tmp_path / "marian").eval()
    batch = padded_batch()
    torch.testing.assert_close(logits(converted, *batch), logits(reloaded_marian, *batch), atol=ATOL_FLOAT32, rtol=0)
    input_ids, attention_mask, _ = batch
    assert torch.equal(converted.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=4),
                       reloaded_marian.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=4))

    with pytest.raises(ValueError, match="not empty"):  # a second run never overwrites the first
        convert_marian(tmp_path / "marian", tmp_path / "vanilla")


def test_a_wrong_conversion_is_refused_by_its_own_verification_before_anything_is_written(tmp_path, monkeypatch):
    from vanilla_transformer.tools.verification import VerificationError

    marian = tiny_marian()
    # A converter bug: the residual stream left in Marian's [sin | cos] order.
    monkeypatch.setattr(marian_module, "residual_permutation", lambda d_model: torch.arange(d_model))
    with pytest.raises(VerificationError, match=r"logits differ from the model's by up to \d.*more than the "
                                                r"tolerance 0.0001.*nothing was written"):
        convert_marian(marian, tmp_path / "wrong")
    assert not (tmp_path / "wrong").exists() and list(tmp_path.iterdir()) == []
    convert_marian(marian, tmp_path / "unchecked", verify=False)  # asked for: written without the check
    assert (tmp_path / "unchecked" / "model.safetensors").is_file()


def test_the_verification_passes_a_correct_conversion_and_reports_its_largest_difference():
    from vanilla_transformer.tools.marian import verify_against_marian

    marian = tiny_marian()
    assert 0 < verify_against_marian(marian, convert_marian(marian, verify=False)) <= ATOL_FLOAT32


@pytest.mark.parametrize("case", ["output_dir exists", "no marian_dir"])
def test_the_command_line_refuses_by_flag_and_leaves_an_existing_folder_as_it_was(tmp_path, case):
    marian_dir, output = tmp_path / "marian", tmp_path / "vanilla"
    tiny_marian().save_pretrained(marian_dir)
    output.mkdir()
    (output / "notes.txt").write_text("a user's file")
    before = snapshot(output)
    if case == "no marian_dir":
        marian_dir, output = tmp_path / "nowhere", tmp_path / "new"
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "convert_marian_to_vanilla.py"), "--marian_dir",
                             str(marian_dir), "--output_dir", str(output)], capture_output=True, text=True,
                            env=CLI_ENV, timeout=120)
    assert result.returncode == 2
    expected = f"--output_dir {output} exists and is not empty" if case == "output_dir exists" else \
        f"--marian_dir {marian_dir}: no such folder"
    assert expected in result.stderr
    assert snapshot(tmp_path / "vanilla") == before and not (tmp_path / "new").exists()
