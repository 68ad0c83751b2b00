"""An ONNX export on onnxruntime: the two graphs (`OnnxSeq2Seq`), generate()'s greedy and beam search over them,
and `OnnxTranslator`, the engine behind the translation loop (`tools.translation`).

The search is generate()'s, step for step, with its arithmetic in torch on zero-copy views of onnxruntime's
outputs. What it leaves out changes no hypothesis: the encoder-decoder keys and values are computed on the first
step and never reordered (the beams of one source share them); each beam ranks only its own 2 x beams best
tokens, not the vocabulary; and a source leaves the batch once its result is final, as in fairseq's search,
where generate() computes every row until the whole batch is done.
"""

import json
import os
from pathlib import Path

import numpy as np
import torch

from ...modeling_vanilla_transformer import gnmt_length_penalty
from ..exports import read_export_record, require
from ..translation import Translator

GRAPHS = ("encoder_model", "decoder_model_merged")
# transformers.js names a graph's variants by dtype: "fp32" -> *.onnx, "q8" (int8 weights, activations quantized at
# run time: its default in browsers) -> *_quantized.onnx.
QUANTIZATIONS = {None: "", "int8": "_quantized"}


def past_names(num_layers: int, prefix: str) -> list[str]:
    """`prefix`.{i}.{decoder,encoder}.{key,value} for every decoder layer, in the order the graph takes them."""
    return [f"{prefix}.{i}.{side}.{kind}" for i in range(num_layers) for side in ("decoder", "encoder")
            for kind in ("key", "value")]


def check_quantization(quantize, name: str = "quantize"):
    if quantize not in QUANTIZATIONS:
        raise ValueError(f"{name}={quantize!r} is not a quantization this export writes; choose one of "
                         f"{list(QUANTIZATIONS)}.")


class OnnxSeq2Seq:
    """The two graphs of an export on onnxruntime: `encode` and a decoder `step` that carries its own past."""

    def __init__(self, folder: str | os.PathLike, suffix: str = "", threads: int = 0):
        ort = require("onnxruntime", "onnx", "The ONNX engine")
        folder = Path(folder)
        self.config = json.loads((folder / "config.json").read_text())
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        # The search runs torch between steps: onnxruntime's threads must not spin-wait over it.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.sessions = {}
        for name in GRAPHS:
            path = folder / "onnx" / f"{name}{suffix}.onnx"
            if not path.is_file():
                raise FileNotFoundError(f"{folder} has no {path.relative_to(folder)}: not an ONNX export of this layout"
                                        f"{' with that quantization' if suffix else ''} (scripts/export_onnx.py writes one).")
            self.sessions[name] = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.layers = self.config["decoder_layers"]
        self.heads = self.config["decoder_attention_heads"]
        self.head_dim = self.config["d_model"] // self.heads
        self.past_names = past_names(self.layers, "past_key_values")

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return self.sessions["encoder_model"].run(None, {"input_ids": input_ids.astype(np.int64),
                                                         "attention_mask": attention_mask.astype(np.int64)})[0]

    def empty_past(self, batch: int) -> list[np.ndarray]:
        return [np.zeros((batch, self.heads, 0, self.head_dim), np.float32) for _ in range(4 * self.layers)]

    def step(self, input_ids, encoder_attention_mask, encoder_hidden_states, past):
        """(logits, present) for `input_ids` after `past` (a list in `past_names` order)."""
        inputs = {"input_ids": input_ids.astype(np.int64), "encoder_attention_mask": encoder_attention_mask.astype(np.int64),
                  "encoder_hidden_states": encoder_hidden_states, **dict(zip(self.past_names, past))}
        logits, *present = self.sessions["decoder_model_merged"].run(None, inputs)
        return logits, present


def keep_encoder_past(past: list, present: list) -> list:
    """`present` with the encoder-decoder keys and values of `past` where it has them: they never change within
    a source, so the first step's are kept (as transformers.js does), whatever the graph returns for them later."""
    if past[2].shape[2] == 0:
        return present
    return [old if i % 4 >= 2 else new for i, (old, new) in enumerate(zip(past, present))]


def select_rows(past: list, self_rows: torch.Tensor, encoder_rows: torch.Tensor | None = None) -> list:
    """The past of the rows `self_rows` (self-attention) and `encoder_rows` (encoder-decoder; None: all, in order)."""
    return [tensor if i % 4 >= 2 and encoder_rows is None else
            torch.from_numpy(tensor).index_select(0, self_rows if i % 4 < 2 else encoder_rows).numpy()
            for i, tensor in enumerate(past)]


def greedy_search(engine: OnnxSeq2Seq, input_ids, attention_mask, decoding: dict, max_new_tokens: int) -> list:
    """generate()'s greedy search: the most likely token at every step, until eos or the budget. A source leaves
    the batch once it has ended (generate() carries it on with pad tokens to the batch's end): the same output,
    with no steps spent on it."""
    states = engine.encode(input_ids, attention_mask)
    outputs = [[decoding["decoder_start_token_id"]] for _ in range(len(input_ids))]
    alive = np.arange(len(input_ids))
    tokens = np.array(outputs, np.int64)
    past = engine.empty_past(len(alive))
    for _ in range(max_new_tokens):
        logits, present = engine.step(tokens, attention_mask, states, past)
        past = keep_encoder_past(past, present)
        tokens = logits[:, -1].argmax(-1)[:, None]
        for row, token in zip(alive, tokens[:, 0].tolist()):
            outputs[row].append(token)
        going = tokens[:, 0] != decoding["eos_token_id"]
        if not going.all():
            rows = torch.from_numpy(np.flatnonzero(going))
            alive, tokens, attention_mask, states = alive[going], tokens[going], attention_mask[going], states[going]
            past = select_rows(past, rows, rows)
            if not len(alive):
                break
    return outputs


def beam_search(engine: OnnxSeq2Seq, input_ids, attention_mask, decoding: dict, max_new_tokens: int,
                num_beams: int, num_hypotheses: int = 1) -> list:
    """generate()'s beam search, step for step (transformers 5's vectorised `_beam_search`): 2 x `num_beams`
    candidates a step, finished hypotheses ranked by log P / penalty(length) (|Y|^alpha, or GNMT's
    ((5 + |Y|) / 6)^alpha where the model was saved with it), and its `early_stopping` rules. The
    `num_hypotheses` best hypotheses of each source, best first, as token ids, source after source.

    A source leaves the batch as soon as its best hypotheses are final (generate() keeps searching it until the
    whole batch is done, without changing them), as fairseq's search does."""
    alpha, early_stopping = decoding["length_penalty"], decoding["early_stopping"]
    gnmt = decoding["length_penalty_type"] == "gnmt"
    eos, pad = decoding["eos_token_id"], decoding["pad_token_id"]

    def penalty(length):
        return gnmt_length_penalty(length, alpha) if gnmt else float(length) ** alpha

    def gather(tensor, indices):  # tensor[b, indices[b, j], ...]: the beams `indices` picks, with all after them
        return torch.take_along_dim(tensor, indices.view(*indices.shape, *[1] * (tensor.dim() - 2)), dim=1)

    batch, beams, keep = len(input_ids), num_beams, 2 * num_beams
    states = np.repeat(engine.encode(input_ids, attention_mask), beams, axis=0)
    mask = np.repeat(attention_mask, beams, axis=0)
    max_length = 1 + max_new_tokens
    outputs: list = [None] * batch
    alive = torch.arange(batch)  # the sources still searched, by their row in the batch
    running = torch.full((batch, beams, 1), decoding["decoder_start_token_id"], dtype=torch.long)
    sequences = running.clone()  # the finished hypotheses, padded as they wait
    running_scores = torch.zeros(batch, beams)
    running_scores[:, 1:] = -1e9  # all beams start as one hypothesis
    scores = torch.full((batch, beams), -1e9)
    finished = torch.zeros(batch, beams, dtype=torch.bool)
    improvable = torch.ones(batch, 1, dtype=torch.bool)
    top_beams = torch.arange(keep) < beams
    past = engine.empty_past(batch * beams)
    length = 1
    while True:
        n = len(alive)
        logits, present = engine.step(running[:, :, -1].reshape(-1, 1).numpy(), mask, states, past)
        logits = torch.from_numpy(logits)[:, -1].float()
        # Only a beam's own `keep` best tokens can be among the `keep` best continuations: those are ranked, with
        # their log-probabilities, instead of the whole vocabulary of every beam.
        beam_logits, beam_tokens = logits.topk(keep)
        log_probs = (beam_logits - logits.logsumexp(-1, keepdim=True)).view(n, beams, keep)
        top_scores, top = torch.topk((log_probs + running_scores[:, :, None]).view(n, -1), keep)
        origin = top // keep
        tokens = beam_tokens.view(n, -1).gather(1, top)
        candidates = torch.cat([gather(running, origin), tokens[:, :, None]], dim=2)
        ends = (tokens == eos) | (length + 1 >= max_length)

        continuing = top_scores + ends.float() * -1e9
        chosen = torch.topk(continuing, beams)[1]
        running, running_scores = gather(candidates, chosen), gather(continuing, chosen)
        reorder = (gather(origin, chosen) + torch.arange(n)[:, None] * beams).view(-1)

        just_finished = ends & top_beams[None, :]
        final = top_scores / penalty(length)  # generated tokens so far, eos included
        full = finished.all(dim=1, keepdim=True) & (early_stopping is True)
        final = final + (full | ~improvable | ~just_finished).float() * -1e9
        merged = torch.cat([scores, final], dim=1)
        best = torch.topk(merged, beams)[1]
        waiting = torch.nn.functional.pad(sequences, (0, 1), value=pad)
        sequences = gather(torch.cat([waiting, candidates], dim=1), best)
        scores = gather(merged, best)
        finished = gather(torch.cat([finished, just_finished], dim=1), best)

        length += 1
        hypothetical = max_length - 1 if early_stopping == "never" and alpha > 0 else length - 1
        worst = torch.where(finished, scores.min(dim=1, keepdim=True)[0], -1e9)
        improvable &= (running_scores[:, :1] / penalty(hypothetical) > worst).any(dim=1, keepdim=True)
        # A source is done when no running beam can enter its finished ones, or they are full and early_stopping
        # is True, or at the length budget: generate()'s stopping rules, one source at a time.
        done = ~improvable[:, 0] | (finished.all(dim=1) & (early_stopping is True)) | ends.all(dim=1)
        past = keep_encoder_past(past, present)
        if not done.any():
            past = select_rows(past, reorder)
            continue
        for i in done.nonzero()[:, 0].tolist():
            outputs[alive[i]] = sequences[i, :num_hypotheses].tolist()
        if done.all():
            return [hypothesis for source in outputs for hypothesis in source]
        kept = (~done).nonzero()[:, 0]
        rows = (kept[:, None] * beams + torch.arange(beams)).view(-1)
        alive, running, running_scores, sequences, scores, finished, improvable = (
            tensor[kept] for tensor in (alive, running, running_scores, sequences, scores, finished, improvable))
        states, mask = states[rows.numpy()], mask[rows.numpy()]
        past = select_rows(past, reorder[rows], rows)


class OnnxTranslator(Translator):
    """An ONNX export on onnxruntime behind the translation loop, decoding as the model's `generate()` would (its
    saved beam size, length penalty and length budget). `quantized="int8"` runs the int8 graphs."""

    def __init__(self, folder: str | os.PathLike, quantized: str | None = None, threads: int = 0):
        from transformers import AutoTokenizer

        check_quantization(quantized, "quantized")
        self.decoding = read_export_record(folder, "onnxruntime")["decoding"]
        self.engine = OnnxSeq2Seq(folder, QUANTIZATIONS[quantized], threads)
        self.tokenizer = AutoTokenizer.from_pretrained(folder)

    def generate(self, input_ids, attention_mask, num_beams, max_new_tokens, num_hypotheses=1):
        if num_beams == 1:
            if num_hypotheses > 1:
                raise ValueError(f"num_hypotheses={num_hypotheses} needs a beam of at least as many, not num_beams=1")
            return greedy_search(self.engine, input_ids, attention_mask, self.decoding, max_new_tokens)
        return beam_search(self.engine, input_ids, attention_mask, self.decoding, max_new_tokens, num_beams,
                           num_hypotheses)


__all__ = ["OnnxSeq2Seq", "OnnxTranslator", "greedy_search", "beam_search", "past_names", "GRAPHS", "QUANTIZATIONS",
           "check_quantization"]
