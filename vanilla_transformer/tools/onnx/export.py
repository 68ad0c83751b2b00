"""Export to ONNX in the layout transformers.js and Optimum use for translation models (the engine that runs it
is `runtime`).

The folder holds `onnx/encoder_model.onnx` and `onnx/decoder_model_merged.onnx` (with `_quantized` int8 twins
when asked), `config.json`, `generation_config.json` and the tokenizer. The graphs are this model's own modules,
exported with `torch.onnx.export`; what the layout asks of them, and how they meet it:

- One decoder graph serves every step. Its past keys and values are inputs whose length may be 0 (the first step,
  as transformers.js feeds it): self-attention appends the new keys to the past ones, and encoder-decoder
  attention projects only the encoder states beyond the encoder past it is given, all of them on the first step
  and none later, so later steps reuse the first step's `present.*.encoder.*` without recomputing them.
- Positions: the interleaved sinusoids are computed in the graph from the past length, so no length is capped.
- `config.json` declares `model_type` "marian": transformers.js ships no model of ours, and a Marian model of the
  same sizes computes exactly a post-LN model's function (`tools.marian.state_dict_to_marian`); transformers.js
  reads only the sizes and special ids from it.
- Decoding: the graphs give logits; `runtime.OnnxTranslator` runs greedy or beam search over them with the
  model's saved settings (the paper's GNMT length penalty included), as `generate()` does.
"""

import copy
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

from ...configuration_vanilla_transformer import VanillaTransformerConfig
from ...modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from ..exports import export_languages, require, write_export_record
from ..folders import check_output_dir, load_model_and_tokenizer, staged_output_dir
from ..marian import marian_config_like
from ..verification import check_close, float32_reference, verification_batch
from .runtime import GRAPHS, QUANTIZATIONS, OnnxSeq2Seq, check_quantization, past_names

OPSET = 18


def _check_export_packages():
    """torch.onnx's exporter writes through onnx and onnxscript; the export is verified on onnxruntime."""
    for module in ("onnx", "onnxscript", "onnxruntime"):
        require(module, "onnx", "The ONNX export")


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A (batch, length) 1/0 padding mask as the (batch, 1, 1, length) 0 / dtype-min bias eager attention adds."""
    return (1.0 - mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


class EncoderGraph(nn.Module):
    """input_ids, attention_mask -> last_hidden_state: the model's encoder with explicit masks, nothing skipped."""

    def __init__(self, model: VanillaTransformerForConditionalGeneration):
        super().__init__()
        self.encoder = model.get_encoder()

    def forward(self, input_ids, attention_mask):
        encoder = self.encoder
        hidden_states = encoder.embed(input_ids, None)
        mask = additive_mask(attention_mask, hidden_states.dtype)
        for layer in encoder.layers:
            hidden_states = layer(hidden_states, mask)
        return hidden_states if encoder.layer_norm is None else encoder.layer_norm(hidden_states)


class DecoderGraph(nn.Module):
    """One decoding step of any length, with or without a past: (input_ids, encoder_attention_mask,
    encoder_hidden_states, *past) -> (logits, *present), past and present named by `past_names`."""

    def __init__(self, model: VanillaTransformerForConditionalGeneration):
        super().__init__()
        self.decoder = model.model.decoder
        self.lm_head = model.lm_head

    def forward(self, input_ids, encoder_attention_mask, encoder_hidden_states, *past):
        decoder = self.decoder
        num_layers = len(decoder.layers)
        self_past = [(past[4 * i], past[4 * i + 1]) for i in range(num_layers)]
        cross_past = [(past[4 * i + 2], past[4 * i + 3]) for i in range(num_layers)]
        cache = EncoderDecoderCache(DynamicCache(self_past), DynamicCache(cross_past))
        cache.is_updated = {i: False for i in range(num_layers)}  # append to the encoder past, never reuse it blindly
        past_length = self_past[0][0].shape[2]
        # Encoder states the encoder past already holds are not projected again: all of them after the first step.
        new_encoder_states = encoder_hidden_states[:, cross_past[0][0].shape[2]:]

        hidden_states = decoder.embed(input_ids, None, past_length)
        length = input_ids.shape[1]
        visible = torch.arange(past_length + length)[None, :] <= (torch.arange(length) + past_length)[:, None]
        causal = torch.where(visible, 0.0, torch.finfo(hidden_states.dtype).min)[None, None].to(hidden_states.dtype)
        cross = additive_mask(encoder_attention_mask, hidden_states.dtype)
        for layer in decoder.layers:
            hidden_states = layer(hidden_states, causal, new_encoder_states, cross, cache)
        if decoder.layer_norm is not None:
            hidden_states = decoder.layer_norm(hidden_states)
        present = []
        for i in range(num_layers):
            for layer_cache in (cache.self_attention_cache.layers[i], cache.cross_attention_cache.layers[i]):
                present += [layer_cache.keys, layer_cache.values]
        return (self.lm_head(hidden_states), *present)


def _check_exportable(model, tokenizer):
    """Refuse, by name and before anything is written, what this export cannot express."""
    if not isinstance(model, VanillaTransformerForConditionalGeneration):
        raise ValueError(f"The ONNX export writes vanilla_transformer translation models; got a {type(model).__name__}. "
                         "Convert a Marian model first (scripts/convert_marian_to_vanilla.py).")
    if len(tokenizer) > model.config.vocab_size:
        raise ValueError(f"The tokenizer has {len(tokenizer)} tokens, more than the model's vocab_size "
                         f"{model.config.vocab_size}: ids from {model.config.vocab_size} on would have no embedding.")
    size = sum(p.numel() for p in model.parameters()) * 4
    if size >= 2**31:
        raise ValueError(f"The model holds {size / 2**30:.1f} GiB of float32 weights, more than the 2 GiB an ONNX file "
                         "holds without external data, which this export does not write.")


def _graph_inputs(config: VanillaTransformerConfig, batch: int = 2, source: int = 5, target: int = 3, past: int = 4,
                  encoder_past: int = 2):
    """Example inputs for tracing, every size distinct and above 1 so that the exporter keeps all of them dynamic
    (an encoder past shorter than the source is never fed, but traces the slice that serves both real cases)."""
    from torch.export import Dim

    heads, head_dim = config.decoder_attention_heads, config.d_model // config.decoder_attention_heads
    ids = torch.full((batch, source), 5)
    mask = torch.ones(batch, source, dtype=torch.long)
    past_tensors = tuple(torch.zeros(batch, heads, past if kind < 2 else encoder_past, head_dim)
                         for _ in range(config.decoder_layers) for kind in range(4))
    # transformers.js builds the first step's empty past from the graph's input shapes: the axis named
    # "batch_size" gets the batch, other named axes 0, and the heads and head size must be fixed numbers.
    dims = {name: Dim(name) for name in ("batch_size", "source", "target", "past", "encoder_past")}
    encoder = ((ids, mask), {"input_ids": {0: dims["batch_size"], 1: dims["source"]},
                             "attention_mask": {0: dims["batch_size"], 1: dims["source"]}})
    decoder = ((torch.full((batch, target), 5), mask, torch.zeros(batch, source, config.d_model), *past_tensors),
               {"input_ids": {0: dims["batch_size"], 1: dims["target"]},
                "encoder_attention_mask": {0: dims["batch_size"], 1: dims["source"]},
                "encoder_hidden_states": {0: dims["batch_size"], 1: dims["source"]},
                "past": tuple({0: dims["batch_size"], 2: dims["past" if i % 4 < 2 else "encoder_past"]}
                              for i in range(len(past_tensors)))})
    return encoder, decoder


def export_graphs(model, folder: Path) -> dict[str, Path]:
    """Write `folder`/onnx/{encoder_model,decoder_model_merged}.onnx for `model` (exported from a float32 CPU copy
    with eager attention, the implementation whose masks the graphs spell out)."""
    import warnings

    exported = copy.deepcopy(model).to("cpu", torch.float32).eval()
    exported.set_attn_implementation("eager")
    layers = exported.config.decoder_layers
    (folder / "onnx").mkdir(parents=True, exist_ok=True)
    paths = {name: folder / "onnx" / f"{name}.onnx" for name in GRAPHS}
    (encoder_args, encoder_dims), (decoder_args, decoder_dims) = _graph_inputs(exported.config)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's notes on renamed axes and missing torchvision
        torch.onnx.export(EncoderGraph(exported), encoder_args, paths["encoder_model"], dynamo=True, verbose=False,
                          input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state"],
                          dynamic_shapes=encoder_dims, opset_version=OPSET, external_data=False)
        torch.onnx.export(DecoderGraph(exported), decoder_args, paths["decoder_model_merged"], dynamo=True,
                          verbose=False, dynamic_shapes=decoder_dims, opset_version=OPSET, external_data=False,
                          input_names=["input_ids", "encoder_attention_mask", "encoder_hidden_states",
                                       *past_names(layers, "past_key_values")],
                          output_names=["logits", *past_names(layers, "present")])
    return paths


def verify_onnx(model, folder) -> float:
    """The largest difference between the export's and `model`'s encoder states and logits on a fixed random batch:
    the whole target at once with an empty past, then token by token with the past the graph returned, as
    transformers.js and `runtime.OnnxTranslator` run it. `VerificationError` above `VERIFY_ATOL`."""
    engine = OnnxSeq2Seq(folder)
    input_ids, attention_mask, decoder_input_ids = verification_batch(model.config)
    with float32_reference(model) as reference:
        expected_states = reference.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        expected = reference(input_ids=input_ids, attention_mask=attention_mask,
                             decoder_input_ids=decoder_input_ids).logits
    states = engine.encode(input_ids.numpy(), attention_mask.numpy())
    largest = check_close(expected_states, torch.from_numpy(states), "The ONNX encoder's states",
                          how_to_skip="--no_verify (verify=False)")
    mask = attention_mask.numpy()
    whole, _ = engine.step(decoder_input_ids.numpy(), mask, states, engine.empty_past(len(states)))
    steps, past = [], engine.empty_past(len(states))
    for position in range(decoder_input_ids.shape[1]):
        logits, past = engine.step(decoder_input_ids[:, position:position + 1].numpy(), mask, states, past)
        steps.append(logits)
    for what, actual in (("The ONNX decoder's logits (whole target, no past)", whole),
                         ("The ONNX decoder's logits (token by token, with its past)", np.concatenate(steps, 1))):
        largest = max(largest, check_close(expected, torch.from_numpy(actual), what,
                                           how_to_skip="--no_verify (verify=False)"))
    return largest


def export_onnx(model_or_dir, output_dir, quantize: str | None = None, tokenizer=None, verify: bool = True,
                languages=None) -> Path:
    """Write an ONNX export of `model_or_dir` (a model with `tokenizer`, or a saved folder) to `output_dir`, a new
    folder: the float32 graphs, with `quantize="int8"` also their dynamically quantized `_quantized` twins (int8 weights,
    activations quantized at run time), and the configs and tokenizer transformers.js reads.

    With `verify` (the default) the float32 graphs are checked against the model (`verify_onnx`) before the folder
    appears; the folder appears only once it is complete. `languages` ([source, target], default: the saved folder's
    model card) is recorded for the server."""
    check_quantization(quantize)
    languages = export_languages(model_or_dir, languages)
    _check_export_packages()
    output_dir = check_output_dir(output_dir)
    model, tokenizer = load_model_and_tokenizer(model_or_dir, tokenizer)
    _check_exportable(model, tokenizer)
    with staged_output_dir(output_dir) as staging:
        paths = export_graphs(model, staging)
        _write_export_files(model, tokenizer, staging, output_dir.name, quantize, languages)
        if verify:
            verify_onnx(model, staging)
        if quantize is not None:
            from onnxruntime.quantization import QuantType, quantize_dynamic

            for name, path in paths.items():  # as transformers.js quantizes its own q8 models
                quantize_dynamic(path, path.with_name(f"{name}{QUANTIZATIONS[quantize]}.onnx"),
                                 weight_type=QuantType.QInt8, extra_options={"MatMulConstBOnly": True})
    return output_dir


def _write_export_files(model, tokenizer, folder: Path, name: str, quantize, languages):
    """config.json (as transformers.js reads a Marian model), generation_config.json, the tokenizer, the decoding
    record the runtime decodes with, and a README."""
    config = model.config
    sizes = copy.deepcopy(config)
    sizes.normalize_before = False  # Marian's config has no pre-LN; transformers.js reads only sizes and ids
    marian = marian_config_like(sizes).to_dict()
    marian.update(architectures=["MarianMTModel"], decoder_start_token_id=config.first_decoder_token_id,
                  vanilla_transformer={"normalize_before": config.normalize_before, "note": (
                      "the ONNX graphs in onnx/ are vanilla_transformer's own; model_type 'marian' lets transformers.js "
                      "load them" + ("" if config.normalize_before else ", and a Marian model of these sizes computes "
                                     "the same function"))})
    (folder / "config.json").write_text(json.dumps(marian, indent=2, sort_keys=True) + "\n")
    tokenizer.save_pretrained(folder)
    decoding = write_export_record(folder, model, "onnxruntime", ["float32", *([quantize] if quantize else [])],
                                   languages, graphs={name: f"onnx/{name}.onnx" for name in GRAPHS}, opset=OPSET)["decoding"]
    offset = decoding["max_new_tokens_over_input"]
    # transformers.js has no source-relative budget: a fixed one, generous for sentences, stands in for it.
    engine_budget = decoding["max_new_tokens"] or (256 if offset is not None else None)
    generation_config = {"decoder_start_token_id": decoding["decoder_start_token_id"],
                         "bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id,
                         "pad_token_id": config.pad_token_id, "num_beams": decoding["num_beams"],
                         "length_penalty": decoding["length_penalty"], "early_stopping": decoding["early_stopping"],
                         **({"max_new_tokens": engine_budget} if engine_budget else {})}
    (folder / "generation_config.json").write_text(json.dumps(generation_config, indent=2) + "\n")
    variants = ", ".join(f"`onnx/{name}{QUANTIZATIONS[quantize]}.onnx`" for name in GRAPHS) if quantize else ""
    penalty = "GNMT's ((5 + |Y|) / 6)^alpha" if decoding["length_penalty_type"] == "gnmt" else "|Y|^alpha"
    marian_note = " (pre-LN: no Marian model computes them)" if config.normalize_before else \
        " (a Marian model of these sizes computes the same function)"
    (folder / "README.md").write_text(f"""# ONNX export of a vanilla_transformer model

`onnx/encoder_model.onnx` and `onnx/decoder_model_merged.onnx` (float32){', and ' + variants + ' (int8 weights, '
'dynamic quantization)' if quantize else ''}: the layout transformers.js and Optimum use for translation models.
The decoder graph takes the past keys and values of every layer (length 0 on the first step) and returns
`present.*`. Positions are computed in the graph: no length cap.

`config.json` declares `model_type` "marian" so that transformers.js loads the folder; the graphs are this
model's own{marian_note}.

- Python: `vanilla_transformer.tools.onnx.OnnxTranslator(folder).translate(texts)`, or
  `scripts/translate.py --engine onnxruntime --model {name}`: beam {decoding['num_beams']}, length penalty
  {decoding['length_penalty']} as log P / {penalty}, at most {f'source length + {offset}' if offset is not None else
  decoding['max_new_tokens'] or decoding['max_length'] - 1} new tokens, as the model's generate().
- Serving: `scripts/serve.py --model {name}{f"` ({' to '.join(languages)}, as recorded)" if languages else
  " --languages SOURCE TARGET`"}.
- transformers.js: `pipeline('translation', folder)`, greedy (transformers.js 4.3 has no beam search; its
  `dtype: 'q8'`, the default in browsers, runs the `_quantized` graphs); generation_config.json gives it a fixed
  budget of {engine_budget} new tokens{'' if offset is None else ' (it has no source-relative one)'}.
""")
