"""Export to CTranslate2, the inference engine OPUS-MT users deploy with, and translate with the export.

The paper's Transformer is CTranslate2's `TransformerSpec` (post-LN or pre-LN, ReLU, shared embeddings), so
the export is a change of layout, built on CTranslate2's public spec and converter API. What does not carry
over as it is, and what the export does about it:

- Positions: CTranslate2's built-in sinusoids are [sin | cos] halves with another frequency denominator, not
  the paper's interleaved table. The export writes our table explicitly for positions 0 .. `max_positions`-1,
  which caps the length of inputs and outputs: the translation loop refuses a longer input by name rather
  than letting the engine cut it.
- CTranslate2's converter modifies the arrays it is given in place: it gets copies, never the model's tensors.
- Decoding: CTranslate2 ranks beam hypotheses by log P(Y) / |Y|^alpha (transformers' "hf" penalty) and has no
  GNMT penalty, so a model saved with the paper's `length_penalty_type="gnmt"` decodes with |Y|^alpha there;
  its length budget is absolute, so "source length + 50" is given for each batch by the translation loop
  (`tools.translation`). The export records these settings in `vanilla_transformer_export.json` and its README.
"""

import math
from pathlib import Path

import torch

from .exports import export_languages, read_export_record, require, write_export_record
from .folders import check_output_dir, load_model_and_tokenizer, staged_output_dir
from ..modeling_vanilla_transformer import SinusoidalPositionalEncoding
from ..support_vanilla_transformer import check_int
from .translation import Translator
from .verification import VerificationError, check_close, float32_reference, verification_batch

_ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "swish": "SWISH", "silu": "SWISH", "gelu_new": "GELUTanh",
                "gelu_pytorch_tanh": "GELUTanh"}


def _ctranslate2():
    return require("ctranslate2", "ctranslate2", "The CTranslate2 export and engine")


def transformer_spec(model, tokenizer, max_positions: int = 1024):
    """CTranslate2's `TransformerSpec` holding copies of `model`'s weights and the tokenizer's vocabulary."""
    _ctranslate2()
    from ctranslate2.converters.utils import fuse_linear
    from ctranslate2.specs import common_spec, transformer_spec as specs

    config = model.config
    if config.activation_function not in _ACTIVATIONS:
        raise ValueError(f"CTranslate2 has no activation {config.activation_function!r}; "
                         f"exportable: {sorted(_ACTIVATIONS)}.")
    if config.encoder_attention_heads != config.decoder_attention_heads:
        raise ValueError(f"CTranslate2's Transformer has one head count; this model has "
                         f"{config.encoder_attention_heads} (encoder) and {config.decoder_attention_heads} (decoder).")
    if len(tokenizer) > config.vocab_size:
        raise ValueError(f"The tokenizer has {len(tokenizer)} tokens, more than the model's vocab_size "
                         f"{config.vocab_size}: ids from {config.vocab_size} on would have no embedding.")
    spec = specs.TransformerSpec.from_config(
        (config.encoder_layers, config.decoder_layers), config.encoder_attention_heads,
        pre_norm=config.normalize_before, activation=getattr(common_spec.Activation, _ACTIVATIONS[config.activation_function]))

    def copy(tensor):  # the converter quantizes and reshapes in place
        return tensor.detach().to("cpu", torch.float32).clone()

    def linear(target, module):
        target.weight = copy(module.weight)
        if module.bias is not None:
            target.bias = copy(module.bias)

    def norm(target, module):
        target.gamma, target.beta = copy(module.weight), copy(module.bias)

    def attention(target, module, is_self):
        parts = [common_spec.LinearSpec() for _ in range(3)]
        for part, projection in zip(parts, (module.q_proj, module.k_proj, module.v_proj)):
            linear(part, projection)
        if is_self:
            fuse_linear(target.linear[0], parts)
        else:
            fuse_linear(target.linear[0], parts[:1])
            fuse_linear(target.linear[1], parts[1:])
        linear(target.linear[-1], module.out_proj)

    table = SinusoidalPositionalEncoding(config.d_model)(torch.arange(max_positions))
    for stack_spec, stack in ((spec.encoder, model.model.encoder), (spec.decoder, model.model.decoder)):
        stack_spec.scale_embeddings = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        stack_spec.position_encodings.encodings = table.clone()
        embeddings = stack_spec.embeddings[0] if isinstance(stack_spec.embeddings, list) else stack_spec.embeddings
        embeddings.weight = copy(model.model.shared.weight)
        if stack.layer_norm is not None:
            norm(stack_spec.layer_norm, stack.layer_norm)
        for layer_spec, layer in zip(stack_spec.layer, stack.layers):
            attention(layer_spec.self_attention, layer.self_attn, is_self=True)
            norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
            if hasattr(layer, "encoder_attn"):
                attention(layer_spec.attention, layer.encoder_attn, is_self=False)
                norm(layer_spec.attention.layer_norm, layer.encoder_attn_layer_norm)
            linear(layer_spec.ffn.linear_0, layer.ffn.fc1)
            linear(layer_spec.ffn.linear_1, layer.ffn.fc2)
            norm(layer_spec.ffn.layer_norm, layer.final_layer_norm)
    linear(spec.decoder.projection, model.lm_head)

    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    tokens += [f"<unused_{i}>" for i in range(len(tokens), config.vocab_size)]  # ids the tokenizer never makes
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    start = config.first_decoder_token_id
    spec.config.bos_token = tokens[config.bos_token_id] if config.bos_token_id is not None else tokens[start]
    spec.config.eos_token = tokens[config.eos_token_id]
    spec.config.unk_token = tokenizer.unk_token or tokens[0]
    spec.config.decoder_start_token = tokens[start]
    spec.config.layer_norm_epsilon = config.layer_norm_eps
    return spec


def export_ctranslate2(model_or_dir, output_dir, quantization: str | None = None, tokenizer=None,
                       max_positions: int = 1024, verify: bool = True, languages=None) -> Path:
    """Write a CTranslate2 model of `model_or_dir` (a model with `tokenizer`, or a saved folder) to `output_dir`,
    a new folder, with the tokenizer, the decoding settings and a README beside it. `quantization`: None (the
    weights' own float32), "int8", "int8_float16", "float16", ... as CTranslate2 accepts.

    With `verify` (the default) the float32 export first scores a fixed random batch, and a token whose
    log-probability differs from the model's by more than `VERIFY_ATOL` raises `VerificationError`; a quantized
    export is written after that check of its float32 twin (quantization error is the engine's, not a mapping's).
    The folder appears only once it is complete. `languages` ([source, target], default: the saved folder's model
    card) is recorded for the server."""
    ct2 = _ctranslate2()
    check_int("max_positions (a token and eos, a side)", max_positions, at_least=3)
    languages = export_languages(model_or_dir, languages)
    output_dir = check_output_dir(output_dir)
    model, tokenizer = load_model_and_tokenizer(model_or_dir, tokenizer)
    transformer_spec(model, tokenizer, max_positions)  # refuses what CTranslate2 cannot express, before any write

    def convert(folder, quantization):
        spec = transformer_spec(model, tokenizer, max_positions)  # the converter consumes its spec

        class VanillaTransformerConverter(ct2.converters.Converter):
            def _load(self):
                return spec

        VanillaTransformerConverter().convert(str(folder), quantization=quantization, force=True)

    with staged_output_dir(output_dir) as staging:
        if verify:
            convert(staging, None)
            verify_ctranslate2(model, tokenizer, staging, max_positions)
        if quantization is not None or not verify:
            convert(staging, quantization)
        _write_export_files(model, tokenizer, staging, output_dir.name, quantization, max_positions, languages)
    return output_dir


def verify_ctranslate2(model, tokenizer, folder, max_positions: int) -> float:
    """The largest difference between the log-probabilities that the export in `folder` and `model` give the
    tokens of a fixed random batch (each target and its eos); `VerificationError` above `VERIFY_ATOL`."""
    ct2 = _ctranslate2()
    input_ids, attention_mask, decoder_input_ids = verification_batch(model.config, max_positions - 1,
                                                                         num_tokens=len(tokenizer))
    eos = model.config.eos_token_id
    sources = [tokenizer.convert_ids_to_tokens(ids[mask.bool()].tolist()) + [tokenizer.convert_ids_to_tokens(eos)]
               for ids, mask in zip(input_ids, attention_mask)]
    targets = [tokenizer.convert_ids_to_tokens(ids[1:].tolist()) for ids in decoder_input_ids]
    scored = ct2.Translator(str(folder), device="cpu").score_batch(sources, targets)
    expected, actual = [], []
    with float32_reference(model) as reference:  # the export holds float32 weights
        for tokens, target, result in zip(sources, decoder_input_ids, scored):
            source_ids = torch.tensor([tokenizer.convert_tokens_to_ids(tokens)])
            log_probs = reference(input_ids=source_ids, decoder_input_ids=target[None]).logits[0].log_softmax(-1)
            wanted = torch.tensor([*target[1:].tolist(), eos])
            expected.append(log_probs[torch.arange(len(wanted)), wanted])
            actual.append(torch.tensor(result.log_probs))
    if any(len(a) != len(e) for a, e in zip(actual, expected)):
        raise VerificationError(f"The export scored {[len(a) for a in actual]} tokens where the model scored "
                                f"{[len(e) for e in expected]}; nothing was written.")
    return check_close(torch.cat(expected), torch.cat(actual), "The export's log-probabilities",
                       how_to_skip="--no_verify (verify=False)")


def _write_export_files(model, tokenizer, output_dir: Path, name: str, quantization, max_positions, languages):
    tokenizer.save_pretrained(output_dir)
    record = write_export_record(output_dir, model, "ctranslate2", [quantization or "float32"], languages,
                                 max_positions=max_positions)
    decoding = record["decoding"]
    gnmt = decoding["length_penalty_type"] == "gnmt"
    offset = decoding["max_new_tokens_over_input"]
    (output_dir / "README.md").write_text(f"""# CTranslate2 export of a vanilla_transformer model

Weights: {quantization or "float32"}. Translate with `vanilla_transformer.tools.ctranslate2.CTranslate2Translator` or
`scripts/translate.py --engine ctranslate2 --model {name}` (the tokenizer is in this folder); serve it with
`scripts/serve.py --model {name}{f"` ({' to '.join(languages)}, as recorded)" if languages else " --languages SOURCE TARGET`"}.

- Inputs and outputs are limited to {max_positions} positions (the sinusoid table written into the model).
- Beam size {decoding['num_beams']}, length penalty {decoding['length_penalty']} as log P / |Y|^alpha
  {'(the model was saved with the GNMT penalty, which CTranslate2 does not have)' if gnmt else ''}.
- Length budget: {f'source length + {offset} new tokens, per batch' if offset is not None else 'as the model saved it'}.
""")


def compute_type_speeds(model_dir, device: str = "cpu", threads: int = 0, sentences: int = 16,
                        length: int = 16) -> dict[str, float]:
    """Sentences a second that the export in `model_dir` decodes in each compute type this machine supports (int8,
    float32, bfloat16, ...: CTranslate2 converts the weights when it loads them), on a fixed batch of `sentences`
    random sources decoded for exactly `length` steps with the export's beam, so that every type does the same work.
    Which one is fastest depends on the CPU (int8 needs VNNI or AMX to pay), so it is measured where it runs."""
    ct2 = _ctranslate2()
    import json
    import random
    import time

    record = read_export_record(model_dir, "ctranslate2")
    vocabulary = json.loads((Path(model_dir) / "shared_vocabulary.json").read_text(encoding="utf-8"))
    vocabulary = [token for token in vocabulary if not token.startswith("<")]
    picker = random.Random(0)
    batch = [[picker.choice(vocabulary) for _ in range(length)] for _ in range(sentences)]
    beams = record["decoding"]["num_beams"]
    speeds = {}
    for compute_type in sorted(ct2.get_supported_compute_types(device)):
        if compute_type in ("float16", "int8_float16"):  # GPUs only
            continue
        translator = ct2.Translator(str(model_dir), device=device, compute_type=compute_type, intra_threads=threads)
        decode = lambda: translator.translate_batch(batch, beam_size=beams, min_decoding_length=length,  # noqa: E731
                                                    max_decoding_length=length)
        decode()
        started = time.perf_counter()
        for _ in range(2):
            decode()
        speeds[compute_type] = 2 * sentences / (time.perf_counter() - started)
    return speeds


class CTranslate2Translator(Translator):
    """An export on CTranslate2 behind the translation loop, decoding with the export's settings. `compute_type`:
    "default" (the type the weights were written in), a type CTranslate2 accepts, or "fastest" (the fastest type on
    this machine, `compute_type_speeds`). `translator` reuses a loaded `ctranslate2.Translator`."""

    def __init__(self, model_dir, device: str = "cpu", threads: int = 0, translator=None,
                 compute_type: str = "default"):
        ct2 = _ctranslate2()
        from transformers import AutoTokenizer

        record = read_export_record(model_dir, "ctranslate2")
        self.decoding, self.max_positions = record["decoding"], record["max_positions"]
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        if compute_type == "fastest":
            speeds = compute_type_speeds(model_dir, device, threads)
            compute_type = max(speeds, key=speeds.get)
        self.compute_type = compute_type
        self.translator = translator or ct2.Translator(str(model_dir), device=device, intra_threads=threads,
                                                       compute_type=compute_type)

    def generate(self, input_ids, attention_mask, num_beams, max_new_tokens, num_hypotheses=1):
        tokens = [self.tokenizer.convert_ids_to_tokens(ids[mask.astype(bool)].tolist())
                  for ids, mask in zip(input_ids, attention_mask)]
        output = self.translator.translate_batch(
            tokens, beam_size=num_beams, num_hypotheses=num_hypotheses, length_penalty=self.decoding["length_penalty"],
            max_input_length=self.max_positions, max_decoding_length=min(max_new_tokens, self.max_positions - 1))
        return [self.tokenizer.convert_tokens_to_ids(hypothesis) for result in output
                for hypothesis in result.hypotheses]


__all__ = ["export_ctranslate2", "verify_ctranslate2", "CTranslate2Translator", "compute_type_speeds",
           "transformer_spec"]
