"""Speed and memory of our Transformer against its closest built-in peer and against a textbook decoder.

Three systems do the same work in one process, interleaved (each repetition runs every system, alternating
their order), so machine noise falls on all of them alike:

* ``ours``: `VanillaTransformerForConditionalGeneration` with transformers' `generate()` and its key/value cache;
* ``marian``: `transformers.MarianMTModel` configured to the same shape (the closest built-in peer: a post-LN
  encoder-decoder with sinusoidal positions, scaled and shared embeddings); both use SDPA attention;
* ``textbook``: `TextbookDecoder`, decoding as the tutorials do (the Annotated Transformer's `greedy_decode`):
  the source is encoded once, then the whole decoder re-runs over the growing prefix at every step, with no
  cache. It runs on our model's weights, so its greedy output equals ours.

Workloads: a training step (forward, backward and AdamW on a right-padded batch with -100 labels), greedy and
beam-search decoding of a fixed number of tokens (eos is suppressed, `min_new_tokens == max_new_tokens`, so
every system does the same work), and the peak memory of each, measured in a fresh subprocess per system (see
`measure_memory`). Results: medians, ratios, the training step's model-FLOPs utilisation against a matmul
peak measured in the same run, and beam search's speedup over the textbook decoder as the output grows.

Each speed goal comes with its ceiling on the machine at hand, measured in the same run: `ProjectionFloor`
times the cached decoding's matmuls alone (what any cached decoder of this shape must compute), so a peer's
time over it bounds what any implementation could gain over that peer. `AttentionFloor` adds the attention
kernels (and beam search's reordering of the cache), which no cached decoder skips either. Through `generate()`
the bound is tighter still: `generation_split` measures the time transformers' generation loop spends outside
the model (logits processing, token selection, beam bookkeeping), which any model decoding through it pays on
top of its kernels. `decoding_flops` counts what the cache saves in arithmetic.
"""

from __future__ import annotations

import cProfile
import dataclasses
import functools
import gc
import io
import json
import math
import os
import pstats
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from toolkit import cores, environment, load_average, matmul_peak, time_interleaved, write_report
from transformers import GenerationConfig, MarianMTModel
from transformers.cache_utils import EncoderDecoderCache

from vanilla_transformer.configuration_vanilla_transformer import PRESETS, VanillaTransformerConfig
from vanilla_transformer.tools.conversion import marian_config_like
from vanilla_transformer.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration

# A vocabulary per preset: a small BPE for the CPU presets, the paper's shared 37k BPE (§5.1) for Table 3's.
DEFAULT_VOCAB = {"tiny": 1000, "small": 8000, "base": 37000, "big": 37000}
# The goals the model is tuned against; ratios are ours/peer in throughput (> 1: ours faster) and in memory.
TARGETS = {
    "train_speed_vs_marian": 1.1,
    "train_memory_vs_marian": 1.0,
    "greedy_speed_vs_marian": 1.5,
    "beam_speed_vs_marian": 1.5,
    "beam_speed_vs_textbook_at_30": 10.0,
}
SYSTEMS = ("ours", "marian", "textbook")
# Slowest over fastest repeat of one system beyond which a run is reported as disturbed by other processes.
NOISY_SPREAD = 1.5
# Linux counts resident pages per thread in batches of up to 64 pages (256 KiB) before updating the process
# total, so peaks closer than this are a tie.
MEMORY_RESOLUTION_MIB = 1.0
MIB = 2**20


@dataclasses.dataclass
class BenchmarkSpec:
    """What to measure. `quick()` is a seconds-long run that checks the plumbing, not the speed."""

    preset: str = "small"
    vocab_size: int | None = None  # None: DEFAULT_VOCAB[preset]
    batch_size: int = 32  # training batch
    source_length: int = 32  # longest source; lengths are drawn from [source_length // 2, source_length]
    target_length: int = 32  # longest training target, drawn the same way
    generation_batch_size: int = 16
    new_tokens: int = 30  # decoded tokens per sentence, exactly (eos suppressed)
    num_beams: int = 4
    curve_lengths: tuple[int, ...] = (10, 30, 100)  # beam search vs the textbook decoder at these output lengths
    curve_batch_size: int | None = None  # None: generation_batch_size, so the curve's 30 matches the table's beam row
    curve_repeats: int | None = None  # None: min(repeats, 2); the 100-token textbook point is the run's costliest
    repeats: int = 5
    warmup: int = 1
    threads: int | None = None  # None: every core this process may run on
    matmul_size: int = 2048
    memory: bool = True
    # The training step under torch.compile too (what Trainer --torch_compile runs); quick mode uses aot_eager,
    # since inductor's C++ code generation takes a minute per model on a small CPU.
    compile_backend: str | None = "inductor"
    isolate_memory: bool = True  # one fresh subprocess per system; quick mode shares one to save start-up time
    seed: int = 0

    @classmethod
    def quick(cls, **overrides) -> "BenchmarkSpec":
        values = dict(preset="tiny", batch_size=4, source_length=8, target_length=8, generation_batch_size=2,
                      new_tokens=4, curve_lengths=(2, 4), curve_batch_size=2, repeats=1, warmup=0, matmul_size=128,
                      threads=1, isolate_memory=False, compile_backend="aot_eager")
        return cls(**{**values, **overrides})

    def __post_init__(self):
        if self.preset not in PRESETS:
            raise ValueError(f"Unknown preset {self.preset!r}; choose one of {sorted(PRESETS)}.")
        self.curve_lengths = tuple(self.curve_lengths)
        if self.vocab_size is None:
            self.vocab_size = DEFAULT_VOCAB[self.preset]
        if self.curve_batch_size is None:
            self.curve_batch_size = self.generation_batch_size
        if self.curve_repeats is None:
            self.curve_repeats = min(self.repeats, 2)
        if self.threads is None:
            self.threads = cores()
        sizes = dict(vocab_size=self.vocab_size, batch_size=self.batch_size, source_length=self.source_length,
                     target_length=self.target_length, generation_batch_size=self.generation_batch_size,
                     new_tokens=self.new_tokens, num_beams=self.num_beams, curve_batch_size=self.curve_batch_size,
                     curve_repeats=self.curve_repeats, repeats=self.repeats, threads=self.threads,
                     matmul_size=self.matmul_size)
        for name, value in sizes.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"`{name}` must be a positive int, got {value!r}.")
        if self.vocab_size < 5:
            raise ValueError("`vocab_size` must leave room for ids past the 4 special tokens.")
        if not self.curve_lengths or any(n < 1 for n in self.curve_lengths):
            raise ValueError(f"`curve_lengths` must be positive ints, got {self.curve_lengths!r}.")


# Models -------------------------------------------------------------------------------------------------------

def model_config(spec: BenchmarkSpec) -> VanillaTransformerConfig:
    return VanillaTransformerConfig.from_preset(spec.preset, vocab_size=spec.vocab_size)


def max_positions(spec: BenchmarkSpec) -> int:
    longest = max(spec.source_length, spec.target_length, spec.new_tokens, *spec.curve_lengths) + 1
    return 1 << (longest - 1).bit_length()  # Marian keeps a table of this many positions


def build_models(spec: BenchmarkSpec) -> dict[str, torch.nn.Module]:
    """Ours and Marian, both with SDPA attention; the textbook decoder borrows ours."""
    config = model_config(spec)
    torch.manual_seed(spec.seed)
    ours = VanillaTransformerForConditionalGeneration._from_config(config, attn_implementation="sdpa")
    torch.manual_seed(spec.seed)
    marian = MarianMTModel._from_config(marian_config_like(config, max_positions(spec)), attn_implementation="sdpa")
    for name, model in (("ours", ours), ("marian", marian)):
        if model.config._attn_implementation != "sdpa":
            raise RuntimeError(f"{name} runs {model.config._attn_implementation!r} attention, not 'sdpa'.")
    return {"ours": ours, "marian": marian}


def parameter_counts(model: torch.nn.Module) -> dict[str, int]:
    """Trainable parameters (shared embeddings counted once), frozen parameters and buffers.

    Marian's frozen entries are its two sinusoidal position tables (ours computes positions instead), and
    its buffer is `final_logits_bias`; neither is trained."""
    params = {id(p): p for p in model.parameters()}.values()
    return {
        "trainable": sum(p.numel() for p in params if p.requires_grad),
        "frozen": sum(p.numel() for p in params if not p.requires_grad),
        "buffers": sum(b.numel() for b in model.buffers()),
    }


# Data ---------------------------------------------------------------------------------------------------------

def padded_ids(batch: int, longest: int, vocab_size: int, generator: torch.Generator, pad_id: int = 0):
    """Ids above the 4 special tokens with random lengths in [longest // 2, longest], right-padded to the
    longest drawn length, as a collator pads a real batch. Returns (ids, mask)."""
    lengths = torch.randint(max(1, longest // 2), longest + 1, (batch,), generator=generator)
    width = int(lengths.max())
    ids = torch.randint(4, vocab_size, (batch, width), generator=generator)
    mask = torch.arange(width)[None, :] < lengths[:, None]
    return ids.masked_fill(~mask, pad_id), mask.long()


def training_batch(spec: BenchmarkSpec, config: VanillaTransformerConfig, seed: int | None = None) -> dict:
    generator = torch.Generator().manual_seed(spec.seed + 1 if seed is None else seed)
    input_ids, attention_mask = padded_ids(spec.batch_size, spec.source_length, config.vocab_size, generator,
                                           config.pad_token_id)
    labels, label_mask = padded_ids(spec.batch_size, spec.target_length, config.vocab_size, generator)
    labels = labels.masked_fill(label_mask == 0, -100)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def source_batch(spec: BenchmarkSpec, config: VanillaTransformerConfig, batch: int, seed: int | None = None) -> dict:
    generator = torch.Generator().manual_seed(spec.seed + 2 if seed is None else seed)
    input_ids, attention_mask = padded_ids(batch, spec.source_length, config.vocab_size, generator,
                                           config.pad_token_id)
    return {"input_ids": input_ids, "attention_mask": attention_mask}


# Workloads ----------------------------------------------------------------------------------------------------

def make_train_step(model: torch.nn.Module, batch: dict, lr: float = 1e-4) -> Callable[[], float]:
    """One optimizer step as a training loop runs it, dropout on: zero the gradients, forward with labels
    (each model's own loss: ours is label-smoothed, Marian's plain cross-entropy), backward, AdamW."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)

    def step() -> float:
        model.train()
        optimizer.zero_grad(set_to_none=True)
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def fixed_length_generation_config(model: torch.nn.Module, new_tokens: int, num_beams: int,
                                   **options) -> GenerationConfig:
    """Exactly `new_tokens` tokens: eos is suppressed until the budget is spent, so all systems do equal work.
    Beam search uses the paper's length penalty 0.6 (§6.1); at a fixed length it cannot change the ranking.
    `options` go to the GenerationConfig as well (e.g. `cache_implementation="static"`, `compile_config`)."""
    config = model.config
    # Greedy states the global default so that our model's beam-search length penalty is not merged in.
    extra = dict(length_penalty=0.6, early_stopping=False) if num_beams > 1 else dict(length_penalty=1.0)
    return GenerationConfig(
        num_beams=num_beams, do_sample=False, min_new_tokens=new_tokens, max_new_tokens=new_tokens, use_cache=True,
        decoder_start_token_id=config.decoder_start_token_id, bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, **extra, **options,
    )


def generate_fixed_length(model, input_ids, attention_mask, new_tokens: int, num_beams: int = 1,
                          **options) -> torch.Tensor:
    model.eval()
    config = fixed_length_generation_config(model, new_tokens, num_beams, **options)
    return model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)


class TextbookDecoder:
    """Decoding as the tutorials write it, on our model's weights: the Annotated Transformer's `greedy_decode`
    (encode once; at every step run the decoder over the whole prefix, no key/value cache, and project only
    the last position) and the same loop widened to a beam. Like `generate_fixed_length` it decodes exactly
    `new_tokens` tokens with eos suppressed, and ranks beams as generate() does (log-softmax over the whole
    vocabulary, then eos masked), so on the same weights it returns the same tokens as our cached decoding."""

    def __init__(self, model: VanillaTransformerForConditionalGeneration):
        self.model = model
        self.start_id = model.config.decoder_start_token_id
        self.eos_id = model.config.eos_token_id

    def _encode(self, input_ids, attention_mask):
        return self.model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    def _next_log_probs(self, memory, attention_mask, prefix):
        hidden = self.model.get_decoder()(
            input_ids=prefix, encoder_hidden_states=memory, encoder_attention_mask=attention_mask, use_cache=False,
        ).last_hidden_state[:, -1]
        log_probs = F.log_softmax(self.model.lm_head(hidden).float(), dim=-1)
        if self.eos_id is not None:
            log_probs[:, self.eos_id] = -math.inf
        return log_probs

    @torch.no_grad()
    def greedy(self, input_ids, attention_mask, new_tokens: int) -> torch.Tensor:
        self.model.eval()
        memory = self._encode(input_ids, attention_mask)
        prefix = input_ids.new_full((input_ids.shape[0], 1), self.start_id)
        for _ in range(new_tokens):
            next_ids = self._next_log_probs(memory, attention_mask, prefix).argmax(dim=-1, keepdim=True)
            prefix = torch.cat([prefix, next_ids], dim=1)
        return prefix

    @torch.no_grad()
    def beam(self, input_ids, attention_mask, new_tokens: int, num_beams: int = 4) -> torch.Tensor:
        self.model.eval()
        batch = input_ids.shape[0]
        memory = self._encode(input_ids, attention_mask).repeat_interleave(num_beams, dim=0)
        attention_mask = attention_mask.repeat_interleave(num_beams, dim=0)
        prefix = input_ids.new_full((batch * num_beams, 1), self.start_id)
        scores = torch.full((batch, num_beams), -1e9, device=input_ids.device)
        scores[:, 0] = 0.0  # all beams start identical: expand only the first one at the first step
        offsets = (torch.arange(batch, device=input_ids.device) * num_beams)[:, None]
        for _ in range(new_tokens):
            log_probs = self._next_log_probs(memory, attention_mask, prefix)
            vocab = log_probs.shape[-1]
            candidates = (log_probs.view(batch, num_beams, vocab) + scores[:, :, None]).view(batch, -1)
            scores, flat = candidates.topk(num_beams, dim=-1)
            rows = (offsets + torch.div(flat, vocab, rounding_mode="floor")).flatten()
            prefix = torch.cat([prefix[rows], (flat % vocab).view(-1, 1)], dim=1)
        # Equal lengths: the length penalty cannot reorder, and topk left each sentence's best beam first.
        return prefix.view(batch, num_beams, -1)[:, 0]

    def decode(self, input_ids, attention_mask, new_tokens: int, num_beams: int = 1) -> torch.Tensor:
        """Greedy for one beam, else beam search: the counterpart of `generate_fixed_length`."""
        if num_beams == 1:
            return self.greedy(input_ids, attention_mask, new_tokens)
        return self.beam(input_ids, attention_mask, new_tokens, num_beams)


def token_counts(batch: dict) -> tuple[int, int]:
    """The source and target tokens of a training batch (its positions that are not padding): the useful work
    that model-FLOPs utilisation counts. Both models compute the padding too."""
    source = batch.get("attention_mask")
    source_tokens = int(source.sum()) if source is not None else batch["input_ids"].numel()
    return source_tokens, int((batch["labels"] != -100).sum())


def training_flops(config, batch_size: int, source_length: int, target_length: int, attention: bool = True,
                   source_tokens: int | None = None, target_tokens: int | None = None) -> int:
    """Model FLOPs of one training step (forward + backward = 3 x forward): every matmul (projections,
    feed-forward, output layer and, with `attention`, the attention scores and their weighted sums, counted
    over the padded squares as the kernels compute them) at 2 FLOPs per multiply-add.

    Projections run on `source_tokens` and `target_tokens` positions: by default the whole padded batch, as a
    dense implementation computes it; `token_counts(batch)` gives the positions of the batch's tokens, which
    is what ours computes and what model-FLOPs utilisation counts."""
    d = config.d_model
    source_tokens = batch_size * source_length if source_tokens is None else source_tokens
    target_tokens = batch_size * target_length if target_tokens is None else target_tokens
    encoder_per_token = config.encoder_layers * (2 * 4 * d * d + 2 * 2 * d * config.encoder_ffn_dim)
    cross_kv_per_source_token = config.decoder_layers * 2 * 2 * d * d
    decoder_per_token = config.decoder_layers * (2 * 6 * d * d + 2 * 2 * d * config.decoder_ffn_dim)
    decoder_per_token += 2 * d * config.vocab_size
    scores = int(attention) * batch_size * (
        config.encoder_layers * 2 * 2 * source_length * source_length * d
        + config.decoder_layers * (2 * 2 * target_length * target_length * d + 2 * 2 * target_length * source_length * d)
    )
    forward = (source_tokens * (encoder_per_token + cross_kv_per_source_token) + target_tokens * decoder_per_token
               + scores)
    return 3 * forward


def decoding_flops(config, batch_size: int, source_length: int, new_tokens: int, num_beams: int = 1,
                   cached: bool = True, attention: bool = True, source_tokens: int | None = None) -> int:
    """Model FLOPs of decoding `new_tokens` tokens for `batch_size` sources of `source_length` tokens, counted
    like `training_flops` (2 per multiply-add; attention over padded squares when `attention`; projections of
    the source over its `source_tokens` positions, by default all of them).

    `cached` is our decoding: encode once, source keys/values once per beam (generate() gives every beam its copy
    of the encoder output), then one position per step and per beam. Otherwise the textbook decoder: step t re-runs the decoder over all t
    positions of each beam, source keys/values included (no cache), and projects only the last position."""
    d, ffn, layers, scores = config.d_model, config.decoder_ffn_dim, config.decoder_layers, int(attention)
    source_tokens = batch_size * source_length if source_tokens is None else source_tokens
    encoder = (source_tokens * config.encoder_layers * (2 * 4 * d * d + 2 * 2 * d * config.encoder_ffn_dim)
               + scores * batch_size * config.encoder_layers * 2 * 2 * source_length * source_length * d)
    source_kv = source_tokens * layers * 2 * 2 * d * d
    rows = batch_size * num_beams
    total = encoder + (num_beams * source_kv if cached else 0)
    for t in range(1, new_tokens + 1):
        positions = 1 if cached else t
        per_position = layers * (2 * 4 * d * d + 2 * 2 * d * d + 2 * 2 * d * ffn
                                 + scores * (2 * 2 * t * d + 2 * 2 * source_length * d))
        total += rows * (positions * per_position + 2 * d * config.vocab_size) + (0 if cached else num_beams * source_kv)
    return total


class ProjectionFloor:
    """A lower bound on the time of any decoder of this shape: only the decoding's projections (every linear
    layer and the output layer, at the shapes and in the order our cached decoding runs them, with the model's
    own weights), back to back, with no attention, normalisation, cache, search or Python around them.

    Both models must compute these same matmuls, so peer time / floor time is the most any implementation using
    the same matmul kernels could gain over the peer."""

    def __init__(self, model: VanillaTransformerForConditionalGeneration, batch_size: int, source_length: int,
                 new_tokens: int, num_beams: int = 1, source_tokens: int | None = None):
        inner = model.get_decoder()
        self.encoder = [m for m in model.get_encoder().modules() if isinstance(m, torch.nn.Linear)]
        self.source_kv = [p for layer in inner.layers for p in (layer.encoder_attn.k_proj, layer.encoder_attn.v_proj)]
        kv = {id(m) for m in self.source_kv}
        self.step = [m for m in inner.modules() if isinstance(m, torch.nn.Linear) and id(m) not in kv]
        self.step.append(model.lm_head)
        self.new_tokens, self.num_beams = new_tokens, num_beams
        widths = {m.in_features for m in (*self.encoder, *self.step)}
        generator = torch.Generator().manual_seed(0)
        source_tokens = batch_size * source_length if source_tokens is None else source_tokens
        self.source = {w: torch.randn(source_tokens, w, generator=generator) for w in widths}
        self.rows = {w: torch.randn(batch_size * num_beams, w, generator=generator) for w in widths}

    @torch.no_grad()
    def __call__(self):
        for layer in self.encoder:
            layer(self.source[layer.in_features])
        for layer in self.source_kv:  # each beam's copy of the source
            for _ in range(self.num_beams):
                layer(self.source[layer.in_features])
        for _ in range(self.new_tokens):
            for layer in self.step:
                layer(self.rows[layer.in_features])


class AttentionFloor:
    """The other kernels a cached decoder cannot do without: its attention, and in beam search the reordering
    of its caches. One decoding run of `model` is recorded (`record` calls it): the shapes, mask and scale of
    every scaled-dot-product-attention call, and the caches' shapes at every reordering. Calling the floor
    replays them on random tensors, back to back: the same attentions through the same SDPA kernel, and each
    reordering as the `index_select` of every layer's keys and values that transformers' caches do.

    Ours and Marian run the same attention shapes, so added to the projection floor it bounds from below any
    decoder running these kernels."""

    def __init__(self, model: VanillaTransformerForConditionalGeneration, record: Callable[[], object]):
        self.calls, self.reorders = [], []
        sdpa, reorder = F.scaled_dot_product_attention, EncoderDecoderCache.reorder_cache

        def recording_sdpa(query, key, value, attn_mask=None, **kwargs):
            mask = None if attn_mask is None else attn_mask.clone()
            self.calls.append((query.shape, key.shape, value.shape, mask, kwargs))
            return sdpa(query, key, value, attn_mask=attn_mask, **kwargs)

        def recording_reorder(cache, beam_idx):
            layers = (*cache.self_attention_cache.layers, *cache.cross_attention_cache.layers)
            self.reorders.append([layer.keys.shape for layer in layers if layer.keys.numel()])
            return reorder(cache, beam_idx)

        F.scaled_dot_product_attention, EncoderDecoderCache.reorder_cache = recording_sdpa, recording_reorder
        try:
            with torch.no_grad():
                record()
        finally:
            F.scaled_dot_product_attention, EncoderDecoderCache.reorder_cache = sdpa, reorder
        generator = torch.Generator().manual_seed(0)
        shapes = {s for q, k, v, _, _ in self.calls for s in (q, k, v)} | {s for r in self.reorders for s in r}
        self.tensors = {s: torch.randn(s, generator=generator) for s in shapes}
        self.beam_idx = {s[0]: torch.randperm(s[0], generator=generator) for r in self.reorders for s in r}

    @torch.no_grad()
    def __call__(self):
        t = self.tensors
        for query, key, value, mask, kwargs in self.calls:
            F.scaled_dot_product_attention(t[query], t[key], t[value], attn_mask=mask, **kwargs)
        for shapes in self.reorders:
            for shape in shapes:
                t[shape].index_select(0, self.beam_idx[shape[0]])  # keys
                t[shape].index_select(0, self.beam_idx[shape[0]])  # values


class TrainingFloor:
    """A lower bound on the time of any training step of this model: the step's matmuls alone (every linear
    layer and the output layer forward, then the input- and weight-gradient products of backward, at the
    step's shapes with the model's weights, over the batch's tokens only), back to back, plus the same AdamW
    update over the same number of parameters. No attention, normalisation, dropout, loss or autograd
    bookkeeping around them."""

    def __init__(self, model: VanillaTransformerForConditionalGeneration, batch: dict, lr: float = 1e-4):
        source_rows, target_rows = token_counts(batch)
        inner = model.get_decoder()
        source_kv = {id(m) for layer in inner.layers for m in (layer.encoder_attn.k_proj, layer.encoder_attn.v_proj)}
        encoder = [m for m in model.get_encoder().modules() if isinstance(m, torch.nn.Linear)]
        decoder = [m for m in inner.modules() if isinstance(m, torch.nn.Linear)] + [model.lm_head]
        generator = torch.Generator().manual_seed(0)
        self.products = [
            (layer, torch.randn(rows, layer.in_features, generator=generator),
             torch.randn(rows, layer.out_features, generator=generator))
            for layer, rows in [(m, source_rows) for m in encoder]
            + [(m, source_rows if id(m) in source_kv else target_rows) for m in decoder]
        ]
        # The update runs on copies, so the model's own weights and optimizer state are untouched.
        params = [p.detach().clone() for p in {id(p): p for p in model.parameters() if p.requires_grad}.values()]
        for p in params:
            p.grad = torch.randn(p.shape, generator=generator)
        self.optimizer = torch.optim.AdamW(params, lr=lr)

    @torch.no_grad()
    def __call__(self):
        for layer, inputs, _ in self.products:
            layer(inputs)
        for layer, inputs, grad_output in reversed(self.products):
            grad_output @ layer.weight  # gradient of the input
            grad_output.t() @ inputs  # gradient of the weight
        self.optimizer.step()


def generation_split(model: torch.nn.Module, run: Callable, repeats: int) -> dict[str, float]:
    """Seconds one `run()` of generate() spends inside the model (its encoder and every decoding step's forward)
    and outside it, in transformers' generation loop (logits processors, token choice, beam bookkeeping,
    stopping checks); medians over `repeats` runs. A model made infinitely fast would still pay the loop."""
    inside = [0.0]

    def timed(forward):
        @functools.wraps(forward)  # generate() inspects forward's signature
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return forward(*args, **kwargs)
            finally:
                inside[0] += time.perf_counter() - start
        return wrapper

    modules = (model, model.get_encoder())
    # accelerate's hooks (device_map) also live in an instance `forward`: put back whatever was there.
    previous = {module: vars(module).get("forward") for module in modules}
    for module in modules:
        module.forward = timed(module.forward)  # an instance attribute: nn.Module.__call__ finds it first
    totals, models = [], []
    try:
        for _ in range(repeats):
            inside[0] = 0.0
            start = time.perf_counter()
            run()
            totals.append(time.perf_counter() - start)
            models.append(inside[0])
    finally:
        for module, forward in previous.items():
            if forward is None:
                del module.forward
            else:
                module.forward = forward
    return {"total_s": statistics.median(totals), "model_s": statistics.median(models),
            "loop_s": statistics.median(t - m for t, m in zip(totals, models))}


def summarize(times: dict[str, list[float]], work: float) -> dict[str, dict]:
    """Median seconds and `work` units (tokens) per second for each system."""
    return {
        name: {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts), "spread": max(ts) / min(ts),
               "times_s": ts, "throughput": work / statistics.median(ts)}
        for name, ts in times.items()
    }


# Memory -------------------------------------------------------------------------------------------------------

def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def peak_growth_mib(fn: Callable) -> float:
    """How far the resident set grows above where it stood before `fn`, at its highest, in MiB.

    Linux resets a process's high-water mark (VmHWM) when "5" is written to /proc/self/clear_refs, so the mark
    read after `fn` is the peak of `fn` alone. Run it where glibc returns freed blocks to the system (see
    `measure_memory`), or memory freed earlier and reused would hide part of the peak."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
    before = _rss_kib("VmRSS")
    fn()
    # Linux batches per-thread RSS counters (up to 64 pages each), so a flat workload can read slightly negative.
    return max(0.0, (_rss_kib("VmHWM") - before) / 1024)


def memory_workloads(spec: BenchmarkSpec, system: str) -> dict[str, float]:
    """Peak growth of each workload of one system, each after a warm-up call (the training warm-up also creates
    AdamW's state, so the measured step holds parameters and optimizer state before it starts and counts
    gradients, activations and temporaries)."""
    torch.set_num_threads(spec.threads)
    models = build_models(spec)
    config = models["ours"].config
    model = models["marian" if system == "marian" else "ours"]
    del models
    source = source_batch(spec, config, spec.generation_batch_size)
    results = {}
    if system != "textbook":
        step = make_train_step(model, training_batch(spec, config))
        step()
        results["train"] = peak_growth_mib(step)
    for workload, beams in (("greedy", 1), ("beam", spec.num_beams)):
        if system == "textbook":
            decoder = TextbookDecoder(model)
            run = lambda n, b=beams: decoder.decode(**source, new_tokens=n, num_beams=b)  # noqa: E731
        else:
            run = lambda n, b=beams: generate_fixed_length(model, **source, new_tokens=n, num_beams=b)  # noqa: E731
        run(min(2, spec.new_tokens))
        results[workload] = peak_growth_mib(lambda r=run: r(spec.new_tokens))
    return results


def memory_worker():
    """Entry point of the measuring subprocess: a spec and systems as JSON on stdin, results as JSON on stdout."""
    request = json.loads(sys.stdin.read())
    spec = BenchmarkSpec(**request["spec"])
    print(json.dumps({system: memory_workloads(spec, system) for system in request["systems"]}))


def memory_method_available() -> bool:
    return os.access("/proc/self/clear_refs", os.W_OK) and os.path.exists("/proc/self/status")


def measure_memory(spec: BenchmarkSpec, systems=SYSTEMS) -> dict[str, dict[str, float]]:
    """Peak resident-memory growth per workload and system, in MiB.

    torch's CPU tensors come from glibc malloc, which `tracemalloc` does not see and torch keeps no statistics
    on, so we measure the process: each system runs in a fresh Python (shared by all systems only when
    `spec.isolate_memory` is off), with glibc told to serve every block of 64 KiB or more by mmap and to give
    it back on free. Then the resident set follows live tensor memory, and the reset high-water mark gives
    each workload's peak."""
    if not memory_method_available():
        raise RuntimeError("Peak-memory measurement needs Linux's /proc/self/clear_refs and /proc/self/status.")
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0", "MALLOC_TOP_PAD_": "0",
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    groups = [[s] for s in systems] if spec.isolate_memory else [list(systems)]
    results = {}
    for group in groups:
        request = json.dumps({"spec": dataclasses.asdict(spec), "systems": group})
        done = subprocess.run(
            [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
             "from peers import memory_worker; memory_worker()"],
            input=request, capture_output=True, text=True, env=env, check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"The memory subprocess for {group} failed:\n{done.stderr[-4000:]}")
        results.update(json.loads(done.stdout.strip().splitlines()[-1]))
    return results


# The whole run ------------------------------------------------------------------------------------------------

def _ratio(numerator, denominator):
    return None if numerator is None or denominator in (None, 0) else numerator / denominator


def run_benchmark(spec: BenchmarkSpec, log: Callable[[str], None] = print) -> dict:
    """Everything the script reports, as one JSON-ready dict."""
    torch.set_num_threads(spec.threads)
    started = time.perf_counter()
    models = build_models(spec)
    ours = models["ours"]
    config = ours.config
    textbook = TextbookDecoder(ours)
    results = {"spec": dataclasses.asdict(spec), "environment": environment(),
               "parameters": {name: parameter_counts(model) for name, model in models.items()}}
    log(f"threads: {torch.get_num_threads()}; parameters: {results['parameters']}")
    peaks = [matmul_peak(spec.matmul_size)["flops"]]

    # Training step.
    batch = training_batch(spec, config)
    steps = {name: make_train_step(model, batch) for name, model in models.items()}
    steps["floor"] = TrainingFloor(ours, batch)
    phases = {}
    mark = time.perf_counter()
    log("timing the training step ...")
    target_tokens = int((batch["labels"] != -100).sum())
    train = summarize(time_interleaved(steps, spec.repeats, spec.warmup), target_tokens)
    floor = train.pop("floor")
    shape = (*batch["input_ids"].shape, batch["labels"].shape[1])
    # Model FLOPs count the batch's tokens; a dense implementation also computes the padding.
    flops = training_flops(config, *shape, True, *token_counts(batch))
    executed = {"ours": training_flops(config, *shape), "marian": training_flops(config, *shape)}
    phases["train"] = time.perf_counter() - mark
    results["train"] = {"systems": train, "target_tokens": target_tokens, "flops_per_step": flops,
                        "flops_per_step_padded": executed["marian"],
                        "floor": floor, "ceiling_vs_marian": train["marian"]["median_s"] / floor["median_s"],
                        "shape": {"batch": spec.batch_size, "source": batch["input_ids"].shape[1],
                                  "target": batch["labels"].shape[1]}}

    if spec.compile_backend:
        mark = time.perf_counter()
        results["train_compiled"] = compiled_training(models, batch, spec, log)
        phases["train_compiled"] = time.perf_counter() - mark

    # Decoding: greedy and beam search, fixed length.
    source = source_batch(spec, config, spec.generation_batch_size)
    outputs = {}
    for workload, beams in (("greedy", 1), ("beam", spec.num_beams)):
        log(f"timing {workload} decoding ...")
        mark = time.perf_counter()

        tasks = {name: (lambda m=model, b=beams: generate_fixed_length(m, **source, new_tokens=spec.new_tokens,
                                                                        num_beams=b))
                 for name, model in models.items()}
        tasks["textbook"] = lambda b=beams: textbook.decode(**source, new_tokens=spec.new_tokens, num_beams=b)
        tasks["attention_floor"] = AttentionFloor(ours, tasks["ours"])
        tasks = {name: (lambda f=f, n=name, w=workload: outputs.__setitem__((n, w), f())) if name in SYSTEMS else f
                 for name, f in tasks.items()}
        tasks["floor"] = ProjectionFloor(ours, spec.generation_batch_size, source["input_ids"].shape[1],
                                         spec.new_tokens, beams, int(source["attention_mask"].sum()))
        tokens = spec.generation_batch_size * spec.new_tokens
        systems = summarize(time_interleaved(tasks, spec.repeats, spec.warmup), tokens)
        # Separately (the timing hooks cost a little): how much of generate() is the loop around the model.
        split = {name: generation_split(models[name], tasks[name], min(spec.repeats, 3)) for name in models}
        floor, loop = systems["floor"]["median_s"], min(s["loop_s"] for s in split.values())
        attention = systems["attention_floor"]["median_s"]
        results[workload] = {"systems": {n: systems[n] for n in SYSTEMS}, "projection_floor": systems["floor"],
                             "attention_floor": systems["attention_floor"],
                             "num_beams": beams, "new_tokens": spec.new_tokens,
                             "batch": spec.generation_batch_size, "generation_split": split,
                             "ceiling_vs_marian": systems["marian"]["median_s"] / floor,
                             # The most a model could gain through generate(): its matmuls, its attention and
                             # the loop's time.
                             "ceiling_through_generate": systems["marian"]["median_s"] / (floor + attention + loop)}
        phases[workload] = time.perf_counter() - mark
    results["checks"] = {
        "output_shapes": {f"{n}/{w}": list(out.shape) for (n, w), out in outputs.items()},
        "textbook_greedy_equals_ours": torch.equal(outputs["textbook", "greedy"], outputs["ours", "greedy"]),
        "textbook_beam_equals_ours": torch.equal(outputs["textbook", "beam"], outputs["ours", "beam"]),
    }

    # Beam search against the textbook decoder as the output grows.
    curve_source = source_batch(spec, config, spec.curve_batch_size, seed=spec.seed + 3)
    curve = []
    mark = time.perf_counter()
    for length in spec.curve_lengths:
        log(f"timing beam-{spec.num_beams} vs textbook at {length} tokens ...")
        tasks = {
            "ours": lambda n=length: generate_fixed_length(ours, **curve_source, new_tokens=n,
                                                           num_beams=spec.num_beams),
            "textbook": lambda n=length: textbook.beam(**curve_source, new_tokens=n, num_beams=spec.num_beams),
            "floor": ProjectionFloor(ours, spec.curve_batch_size, curve_source["input_ids"].shape[1], length,
                                     spec.num_beams, int(curve_source["attention_mask"].sum())),
        }
        tasks["attention_floor"] = AttentionFloor(ours, tasks["ours"])
        # No warm-up: the decoding workloads above already ran both code paths.
        timed = summarize(time_interleaved(tasks, spec.curve_repeats, warmup=0), spec.curve_batch_size * length)
        loop = generation_split(ours, tasks["ours"], spec.curve_repeats)["loop_s"]
        floors = timed["floor"]["median_s"] + timed["attention_floor"]["median_s"]
        shape = (config, spec.curve_batch_size, curve_source["input_ids"].shape[1], length, spec.num_beams)
        source_tokens = int(curve_source["attention_mask"].sum())
        curve.append({"new_tokens": length, "ours_s": timed["ours"]["median_s"],
                      "textbook_s": timed["textbook"]["median_s"],
                      "speedup": timed["textbook"]["median_s"] / timed["ours"]["median_s"],
                      "projection_floor_s": timed["floor"]["median_s"],
                      "attention_floor_s": timed["attention_floor"]["median_s"],
                      # The most a cached decoder could gain here: no time beyond its projections.
                      "ceiling": timed["textbook"]["median_s"] / timed["floor"]["median_s"],
                      "generate_loop_s": loop,
                      "ceiling_through_generate": timed["textbook"]["median_s"] / (floors + loop),
                      # What a cache saves in arithmetic.
                      "flop_ratio": decoding_flops(*shape, cached=False, source_tokens=source_tokens)
                                    / decoding_flops(*shape, source_tokens=source_tokens)})
    phases["beam_curve"] = time.perf_counter() - mark
    results["beam_curve"] = {"batch": spec.curve_batch_size, "num_beams": spec.num_beams,
                             "repeats": spec.curve_repeats, "points": curve}

    peaks.append(matmul_peak(spec.matmul_size)["flops"])
    peak = max(peaks)
    results["matmul_peak"] = {"size": spec.matmul_size, "flops": peak, "samples": peaks}
    for name, system in train.items():
        system["mfu"] = flops / system["median_s"] / peak
        system["matmul_utilisation"] = executed[name] / system["median_s"] / peak  # the FLOPs it actually runs

    if spec.memory:
        log("measuring peak memory in subprocesses ...")
        mark = time.perf_counter()
        results["memory_mib"] = measure_memory(spec)
        phases["memory"] = time.perf_counter() - mark
        results["memory_method"] = ("peak RSS growth over the RSS before the workload (VmHWM after resetting it via "
                                    "/proc/self/clear_refs), fresh process per system, glibc mmap threshold 64 KiB"
                                    + ("" if spec.isolate_memory else "; one process shared by all systems"))
    results["noisy"] = sorted(f"{w}/{n}" for w in ("train", "greedy", "beam")
                              for n, s in results[w]["systems"].items() if s["spread"] > NOISY_SPREAD)
    results["ratios"] = ratios(results)
    results["ratios_from_fastest_repeats"] = ratios(results, "min_s")
    results["paired_ratios"] = paired_ratios(results)
    results["targets"] = target_verdicts(results)
    results["environment"]["load_average_at_end"] = load_average()
    results["elapsed_s"] = time.perf_counter() - started
    results["phase_s"] = phases
    return results


def compiled_training(models: dict, batch: dict, spec: BenchmarkSpec, log: Callable[[str], None]) -> dict:
    """The training step eager and under torch.compile, ours and Marian, interleaved. Each compiled system trains
    a copy of its model; its first step (the compilation) is timed apart and kept out of the medians."""
    import copy

    steps, compile_s = {}, {}
    for name in ("ours", "marian"):
        steps[f"{name}_eager"] = make_train_step(models[name], batch)
        steps[f"{name}_compiled"] = make_train_step(torch.compile(copy.deepcopy(models[name]),
                                                                  backend=spec.compile_backend), batch)
        log(f"compiling the training step of {name} ({spec.compile_backend}) ...")
        mark = time.perf_counter()
        steps[f"{name}_compiled"]()
        compile_s[name] = time.perf_counter() - mark
    log("timing the training step, eager vs compiled ...")
    timed = summarize(time_interleaved(steps, spec.repeats, spec.warmup), int((batch["labels"] != -100).sum()))
    median = {name: system["median_s"] for name, system in timed.items()}
    return {"backend": spec.compile_backend, "systems": timed, "compile_s": compile_s,
            "compiled_speed_vs_eager": {n: median[f"{n}_eager"] / median[f"{n}_compiled"] for n in ("ours", "marian")},
            "compiled_speed_vs_marian_compiled": median["marian_compiled"] / median["ours_compiled"]}


def ratios(results: dict, statistic: str = "median_s") -> dict:
    """Ours over each peer: throughput (> 1: ours faster) and peak memory (< 1: ours smaller). Speed ratios use
    the median repeat; `statistic="min_s"` gives them from the fastest repeats, the least disturbed ones."""
    out = {}
    for workload in ("train", "greedy", "beam"):
        systems = results[workload]["systems"]
        for peer in ("marian", "textbook"):
            if peer in systems:
                out[f"{workload}_speed_vs_{peer}"] = systems[peer][statistic] / systems["ours"][statistic]
        memory = results.get("memory_mib", {})
        for peer in ("marian", "textbook"):
            if workload in memory.get(peer, {}) and workload in memory.get("ours", {}):
                out[f"{workload}_memory_vs_{peer}"] = _ratio(memory["ours"][workload], memory[peer][workload])
    for point in results["beam_curve"]["points"]:
        out[f"beam_speed_vs_textbook_at_{point['new_tokens']}"] = point["speedup"]
    return out


def paired_ratios(results: dict) -> dict:
    """Ours over Marian per repetition (both ran back to back in it, under the same machine load): the median
    and quartiles of those ratios, steadier than a ratio of medians when the load drifts during the run."""
    out = {}
    for workload in ("train", "greedy", "beam"):
        systems = results[workload]["systems"]
        pairs = sorted(m / o for m, o in zip(systems["marian"]["times_s"], systems["ours"]["times_s"]))
        quartiles = statistics.quantiles(pairs, n=4) if len(pairs) > 1 else pairs * 3
        out[f"{workload}_speed_vs_marian"] = {"median": statistics.median(pairs), "q1": quartiles[0],
                                              "q3": quartiles[2]}
    return out


def target_verdicts(results: dict) -> dict:
    """Each goal, its measured ratio, and whether it is met; a memory goal counts as met within the resolution."""
    verdicts, ceiling = {}, ceilings(results)
    for name, goal in TARGETS.items():
        value = results["ratios"].get(name)
        if value is None:
            meets = None
        elif "memory" in name:
            workload = name.split("_memory_vs_")[0]
            memory = results["memory_mib"]
            meets = memory["ours"][workload] <= goal * memory["marian"][workload] + MEMORY_RESOLUTION_MIB
        else:
            meets = value >= goal
        workload = name.split("_")[0]
        if any(entry.startswith(workload + "/") for entry in results.get("noisy", [])) and "memory" not in name:
            # Disturbed by other processes: a verdict only where the median, the fastest repeats and the
            # paired quartiles all fall on the same side of the goal.
            estimates = [value, results["ratios_from_fastest_repeats"].get(name)]
            paired = results.get("paired_ratios", {}).get(name)
            estimates += [paired["q1"], paired["q3"]] if paired else []
            sides = {estimate >= goal for estimate in estimates if estimate is not None}
            meets = sides.pop() if len(sides) == 1 else None
        verdicts[name] = {"target": goal, "value": value, "met": meets, "ceiling": ceiling.get(name)}
    return verdicts


def ceilings(results: dict) -> dict:
    """For each speed goal, the most any implementation could reach on this machine, as measured in the run:
    training, if the step took no time beyond its matmuls and the AdamW update (`TrainingFloor`); decoding
    through generate(), if the model took no time beyond its projections and its attention (the projection and
    attention floors) and generate() no more than its measured loop, against Marian and against the textbook
    decoder. Runs saved before these were measured fall back to the matmul peak (training) and the projection
    floor alone (decoding)."""
    train = results["train"]
    out = {"train_speed_vs_marian": train.get("ceiling_vs_marian", 1 / train["systems"]["marian"]["mfu"])}
    for workload in ("greedy", "beam"):
        w = results[workload]
        out[f"{workload}_speed_vs_marian"] = w.get("ceiling_through_generate", w["ceiling_vs_marian"])
    for point in results["beam_curve"]["points"]:
        out[f"beam_speed_vs_textbook_at_{point['new_tokens']}"] = point.get("ceiling_through_generate",
                                                                            point["ceiling"])
    return out


# Reports ------------------------------------------------------------------------------------------------------

def _ms(seconds):
    return f"{seconds * 1000:,.0f} ms" if seconds >= 0.1 else f"{seconds * 1000:,.1f} ms"


def _loads(values):
    return "–" if not values else "/".join(f"{v:.1f}" for v in values)


def _x(value):
    return "–" if value is None else f"{value:.2f}x"


def render_markdown(results: dict) -> str:
    spec, env = results["spec"], results["environment"]
    r, train = results["ratios"], results["train"]
    lines = [
        f"# Benchmark: preset `{spec['preset']}` (vocabulary {spec['vocab_size']:,})",
        "",
        f"{env['cpu']}, {env['torch_threads']} torch threads ({env['torch_interop_threads']} inter-op), "
        f"torch {env['torch']}, transformers {env['transformers']}. Medians of {spec['repeats']} interleaved "
        f"repeats after {spec['warmup']} warm-up. Ratios are ours/peer in throughput (> 1: ours faster) and in "
        "memory (< 1: ours smaller).",
        "",
        f"Load average (1/5/15 min) at start {_loads(env.get('load_average_at_start'))}, at end "
        f"{_loads(env.get('load_average_at_end'))}, on {env['cores_available']} cores: anything above the run's own "
        "threads is other processes sharing the cores, which inflates and scatters the times.",
        "",
        f"Trainable parameters: ours {results['parameters']['ours']['trainable']:,}, Marian "
        f"{results['parameters']['marian']['trainable']:,} (Marian also holds "
        f"{results['parameters']['marian']['frozen']:,} frozen position-table entries and a "
        f"{results['parameters']['marian']['buffers']:,}-entry `final_logits_bias` buffer).",
        "",
        "| workload | ours | Marian | textbook | ours/Marian | ours/textbook | target |",
        "|---|---|---|---|---|---|---|",
    ]
    shape = train["shape"]
    s = train["systems"]
    lines.append(
        f"| training step (batch {shape['batch']}, source {shape['source']}, target {shape['target']} padded) "
        f"| {_ms(s['ours']['median_s'])} ({s['ours']['throughput']:,.0f} tok/s) "
        f"| {_ms(s['marian']['median_s'])} ({s['marian']['throughput']:,.0f} tok/s) | – "
        f"| {_x(r.get('train_speed_vs_marian'))} | – | ≥ {TARGETS['train_speed_vs_marian']}x vs Marian |"
    )
    compiled = results.get("train_compiled")
    if compiled:
        c = compiled["systems"]
        lines.append(
            f"| training step, compiled (torch.compile, {compiled['backend']}; eager in the same run: ours "
            f"{_ms(c['ours_eager']['median_s'])}, Marian {_ms(c['marian_eager']['median_s'])}) "
            f"| {_ms(c['ours_compiled']['median_s'])} ({_x(compiled['compiled_speed_vs_eager']['ours'])} eager) "
            f"| {_ms(c['marian_compiled']['median_s'])} ({_x(compiled['compiled_speed_vs_eager']['marian'])} eager) "
            f"| – | {_x(compiled['compiled_speed_vs_marian_compiled'])} | – | compiled ≥ 1.0x eager (#18) |")
    for workload, label, goal in (("greedy", "greedy", "greedy_speed_vs_marian"),
                                  ("beam", f"beam-{results['beam']['num_beams']}", "beam_speed_vs_marian")):
        w = results[workload]
        s = w["systems"]
        cells = " | ".join(f"{_ms(s[n]['median_s'])} ({s[n]['throughput']:,.0f} tok/s)" for n in SYSTEMS)
        lines.append(
            f"| {label}, {w['new_tokens']} tokens x {w['batch']} sentences | {cells} "
            f"| {_x(r.get(f'{workload}_speed_vs_marian'))} | {_x(r.get(f'{workload}_speed_vs_textbook'))} "
            f"| ≥ {TARGETS[goal]}x vs Marian |"
        )
    spreads = {f"{w}/{n}": s["spread"] for w in ("train", "greedy", "beam") for n, s in results[w]["systems"].items()}
    noisy = {k: v for k, v in spreads.items() if v > NOISY_SPREAD}
    if noisy:
        worst = ", ".join(f"{k} {v:.1f}x" for k, v in sorted(noisy.items(), key=lambda kv: -kv[1])[:4])
        fastest = results.get("ratios_from_fastest_repeats", {})
        alternative = ", ".join(f"{w} {_x(fastest.get(f'{w}_speed_vs_marian'))}" for w in ("train", "greedy", "beam"))
        lines += ["", f"**Noisy run**: the slowest repeat of some systems took over {NOISY_SPREAD}x their fastest "
                      f"({worst}); other processes were competing for the cores, and those workloads get a verdict "
                      f"below only where the median, the fastest repeats and the paired quartiles agree. From the fastest repeats, ours/Marian is: {alternative}. Rerun on an idle "
                      "machine, or with fewer threads than cores, before trusting the ratios."]
    paired = results["paired_ratios"]
    lines += ["", "Paired ratios (ours/Marian within each repetition; median, quartiles): " + ", ".join(
        f"{w} {p['median']:.2f}x ({p['q1']:.2f}–{p['q3']:.2f})"
        for w, p in ((k.split("_")[0], v) for k, v in paired.items())) + "."]
    lines += [
        "",
        f"Training-step model FLOPs: {train['flops_per_step'] / 1e9:.2f} GFLOP; fp32 matmul peak "
        f"({results['matmul_peak']['size']}³, best of the run): {results['matmul_peak']['flops'] / 1e9:.1f} GFLOP/s; "
        f"MFU ours {train['systems']['ours']['mfu']:.1%}, Marian {train['systems']['marian']['mfu']:.1%}.",
    ]
    if "flops_per_step_padded" in train:
        lines += [
            f"Model FLOPs count the batch's tokens. Both models also compute its padding "
            f"({train['flops_per_step_padded'] / 1e9:.2f} GFLOP per step); counting the FLOPs each "
            f"actually runs, the matmul units are busy {train['systems']['ours']['matmul_utilisation']:.1%} (ours) "
            f"and {train['systems']['marian']['matmul_utilisation']:.1%} (Marian) of the peak."]
    lines += [""]
    if "memory_mib" in results:
        mem = results["memory_mib"]
        lines += ["## Peak memory (MiB above the resident set before the workload)", "",
                  "| workload | ours | Marian | textbook | ours/Marian | ours/textbook |", "|---|---|---|---|---|---|"]
        for workload in ("train", "greedy", "beam"):
            cells = " | ".join(f"{mem[n][workload]:,.1f}" if workload in mem.get(n, {}) else "–" for n in SYSTEMS)
            lines.append(f"| {workload} | {cells} | {_x(r.get(f'{workload}_memory_vs_marian'))} "
                         f"| {_x(r.get(f'{workload}_memory_vs_textbook'))} |")
        lines += ["", f"Method: {results['memory_method']}. Peaks within {MEMORY_RESOLUTION_MIB:g} MiB are a tie "
                  "(Linux updates a process's resident count in per-thread batches of up to 256 KiB).", ""]
    curve = results["beam_curve"]
    lines += [f"## Beam-{curve['num_beams']} speedup over the textbook decoder ({curve['batch']} sentences, "
              f"median of {curve['repeats']})", "",
              "| output tokens | ours | textbook | speedup | projection floor | attention floor | generate() loop "
              "| ceiling (projections alone) | ceiling (floors + loop) | FLOP ratio |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for p in curve["points"]:
        loop = _ms(p["generate_loop_s"]) if "generate_loop_s" in p else "–"
        attention = _ms(p["attention_floor_s"]) if "attention_floor_s" in p else "–"
        through = f"{p['ceiling_through_generate']:.1f}x" if "ceiling_through_generate" in p else "–"
        lines.append(f"| {p['new_tokens']} | {_ms(p['ours_s'])} | {_ms(p['textbook_s'])} | {p['speedup']:.1f}x "
                     f"| {_ms(p['projection_floor_s'])} | {attention} | {loop} | {p['ceiling']:.1f}x | {through} "
                     f"| {p['flop_ratio']:.1f}x |")
    floors = {w: results[w]["projection_floor"]["median_s"] for w in ("greedy", "beam")}
    lines += ["",
              f"Projection floor: the cached decoding's matmuls alone, back to back at the same shapes with the same "
              f"weights (`ProjectionFloor`): greedy {_ms(floors['greedy'])}, beam {_ms(floors['beam'])} in the table "
              "above. Any cached decoder of this model running the same matmul kernels needs at least that, so a "
              "peer's time over the floor is the most it could gain over that peer (the ceiling). FLOP ratio: the "
              "textbook decoder's FLOPs over ours (`decoding_flops`), what the cache saves in arithmetic; the "
              "speedup stays far below it because one position per step makes small matmuls, which run at a "
              "fraction of the speed of the textbook decoder's large ones.",
              ]
    if all("attention_floor" in results[w] for w in ("greedy", "beam")):
        attention = {w: results[w]["attention_floor"]["median_s"] for w in ("greedy", "beam")}
        lines += ["",
                  "Attention floor: the decoding's attention alone, every scaled-dot-product-attention call of one "
                  "run of ours replayed at the same shapes and masks, plus, in beam search, the reordering of the "
                  f"self- and cross-attention caches between steps (`AttentionFloor`): greedy {_ms(attention['greedy'])}, beam "
                  f"{_ms(attention['beam'])}. A cached decoder cannot skip these either."]
    if all("generation_split" in results[w] for w in ("greedy", "beam")):
        def split(workload):
            parts = results[workload]["generation_split"]
            return ", ".join(f"{name} {_ms(v['loop_s'])} of {_ms(v['total_s'])}" for name, v in parts.items())
        lines += ["",
                  "generate() loop: the time transformers' generation loop spends outside the model (logits "
                  "processors, token choice, beam bookkeeping), which a model decoding through generate() pays "
                  f"however fast it is (`generation_split`, median of up to 3 runs): greedy {split('greedy')}; beam "
                  f"{split('beam')}. With it, the decoding ceilings tighten to the peer's time over the floors + loop "
                  "(the smaller loop of the two systems).",
                  ]
    lines += ["", "## Targets", "",
              "| goal | target | measured | ceiling on this machine | met |", "|---|---|---|---|---|"]
    for name, v in results["targets"].items():
        sign = "≤" if "memory" in name else "≥"
        met = ("–" if v["value"] is None else "noisy") if v["met"] is None else ("yes" if v["met"] else "no")
        if v.get("ceiling") is not None and v["ceiling"] < v["target"] and "memory" not in name:
            met += " (out of reach: ceiling below target)"
        lines.append(f"| {name} | {sign} {v['target']}x | {_x(v['value'])} | {_x(v.get('ceiling'))} | {met} |")
    if "floor" in train:
        lines += ["", "Ceilings: training, Marian's step time over the training floor (`TrainingFloor`: the step's "
                      "matmuls forward and backward on the batch's tokens, back to back, plus the AdamW update; "
                      f"{_ms(train['floor']['median_s'])}); decoding, the peer's time over the projection floor plus "
                      "the attention floor (where measured) plus generate()'s loop."]
    else:
        lines += ["", "Ceilings: training, Marian's step time if ours ran at the measured matmul peak (1 / Marian's "
                      "MFU); decoding, the peer's time over the projection floor."]
    checks = results["checks"]
    lines += ["", f"Checks: textbook greedy output equals ours: {checks['textbook_greedy_equals_ours']}; "
                  f"textbook beam output equals ours: {checks['textbook_beam_equals_ours']}.", ""]
    return "\n".join(lines)


def plot_results(results: dict, path: Path):
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = results["ratios"]
    panels = 3 if "memory_mib" in results else 2
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4))
    workloads = ["train", "greedy", "beam"]
    labels = ["training step", "greedy", f"beam-{results['beam']['num_beams']}"]
    x = range(len(workloads))
    ax = axes[0]
    for offset, peer, colour in ((-0.2, "marian", "tab:blue"), (0.2, "textbook", "tab:orange")):
        values = [r.get(f"{w}_speed_vs_{peer}") or 0 for w in workloads]
        bars = ax.bar([i + offset for i in x], values, 0.4, label=f"vs {peer}", color=colour)
        ax.bar_label(bars, [f"{v:.2f}" if v else "" for v in values], fontsize=8)
    for i, w in enumerate(workloads):  # the goal against Marian, over Marian's bar
        goal = TARGETS[f"{w}_speed_vs_marian"]
        ax.hlines(goal, i - 0.4, i, color="crimson", linestyle="--", linewidth=1.2)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(list(x), labels)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_yticks([0.5, 1, 1.5, 2, 3, 5, 10, 20])
    ax.set_ylabel("throughput ratio ours/peer (> 1: ours faster)")
    ax.set_title("Speed (dashed: goal vs Marian)")
    ax.legend()
    if "memory_mib" in results:
        mem = results["memory_mib"]
        ax = axes[1]
        for offset, name, colour in ((-0.27, "ours", "tab:green"), (0, "marian", "tab:blue"),
                                     (0.27, "textbook", "tab:orange")):
            values = [mem.get(name, {}).get(w, 0) for w in workloads]
            ax.bar([i + offset for i in x], values, 0.27, label=name, color=colour)
        ax.set_xticks(list(x), labels)
        ax.set_ylabel("peak memory growth (MiB)")
        ax.set_title("Peak memory")
        ax.legend()
    ax = axes[-1]
    points = results["beam_curve"]["points"]
    ax.plot([p["new_tokens"] for p in points], [p["speedup"] for p in points], "o-", color="tab:orange")
    for p in points:
        ax.annotate(f"{p['speedup']:.1f}x", (p["new_tokens"], p["speedup"]), textcoords="offset points",
                    xytext=(0, 6), ha="center", fontsize=8)
    ax.axhline(TARGETS["beam_speed_vs_textbook_at_30"], color="grey", linestyle="--", linewidth=0.8,
               label="target at 30 tokens")
    ax.set_xscale("log")
    ax.set_xticks([p["new_tokens"] for p in points], [str(p["new_tokens"]) for p in points])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_ylim(bottom=0)
    ax.set_xlabel("output tokens")
    ax.set_ylabel("speedup over the textbook decoder")
    ax.set_title(f"Beam-{results['beam_curve']['num_beams']}: cache vs full recompute")
    ax.legend()
    fig.suptitle(f"preset {results['spec']['preset']}, {results['environment']['torch_threads']} threads")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_results(results: dict, output_dir: str | Path, plot: bool = True) -> dict[str, Path]:
    stem = Path(output_dir) / f"results_{results['spec']['preset']}"
    paths = write_report(stem, results, render_markdown(results))
    if plot:
        paths["png"] = stem.with_suffix(".png")
        plot_results(results, paths["png"])
    return paths


# Profiling ----------------------------------------------------------------------------------------------------

def _operator_times(prof) -> dict[str, tuple[float, int]]:
    """Self CPU microseconds and call count per operator, from a torch.profiler run."""
    return {event.key: (event.self_cpu_time_total, event.count) for event in prof.key_averages()}


def _operator_diff(ours: dict, marian: dict, per: int, rows: int) -> str:
    """Operators whose self time differs most between ours and Marian, per call of the workload."""
    names = sorted(set(ours) | set(marian), key=lambda n: -abs(ours.get(n, (0, 0))[0] - marian.get(n, (0, 0))[0]))
    lines = [f"{'operator':<58} {'ours ms':>9} {'Marian ms':>10} {'diff ms':>9} {'ours calls':>11} "
             f"{'Marian calls':>13}"]
    for name in names[:rows]:
        (o, oc), (m, mc) = ours.get(name, (0, 0)), marian.get(name, (0, 0))
        lines.append(f"{name[:58]:<58} {o / 1e3 / per:>9.2f} {m / 1e3 / per:>10.2f} {(o - m) / 1e3 / per:>+9.2f} "
                     f"{oc / per:>11.1f} {mc / per:>13.1f}")
    total_o = sum(v[0] for v in ours.values()) / 1e3 / per
    total_m = sum(v[0] for v in marian.values()) / 1e3 / per
    calls_o = sum(v[1] for v in ours.values()) / per
    calls_m = sum(v[1] for v in marian.values()) / per
    lines.append(f"{'total (calls include nested operators)':<58} {total_o:>9.2f} {total_m:>10.2f} "
                 f"{total_o - total_m:>+9.2f} {calls_o:>11.1f} {calls_m:>13.1f}")
    return "\n".join(lines)


def _python_profile(fn: Callable, rows: int, restrict: str | None = None, sort: str = "tottime") -> tuple[str, float]:
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    fn()
    profiler.disable()
    wall = time.perf_counter() - start
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream).sort_stats(sort)
    stats.print_stats(*([restrict] if restrict else []), rows)
    text = stream.getvalue()
    return text[text.index("ncalls") - 3:] if "ncalls" in text else text, wall


def profile_ours(spec: BenchmarkSpec, repeats: int = 3, rows: int = 25) -> str:
    """Where our training step, greedy and beam decoding spend their time, next to Marian doing the same work.

    For each workload: torch.profiler's operators for ours (self CPU time), the operators whose time differs
    most from Marian's (per call of the workload), cProfile's Python functions for ours, and the time inside
    our own model code, transformers' masking and cache helpers (per call of the workload)."""
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(spec.threads)
    models = build_models(spec)
    config = models["ours"].config
    batch = training_batch(spec, config)
    source = source_batch(spec, config, spec.generation_batch_size)
    workloads = {}
    for name, model in models.items():
        step = make_train_step(model, batch)
        workloads["training step", name] = step
        for beams in (1, spec.num_beams):
            label = "greedy" if beams == 1 else f"beam-{beams}"
            workloads[f"{label} decoding, {spec.new_tokens} tokens x {spec.generation_batch_size}", name] = (
                lambda m=model, b=beams: generate_fixed_length(m, **source, new_tokens=spec.new_tokens, num_beams=b))
    for fn in workloads.values():  # warm up; the training warm-up also creates AdamW's state
        fn()

    sections = [f"# Profile of ours (and Marian for comparison), preset {spec.preset}, vocabulary {spec.vocab_size}, "
                f"{torch.get_num_threads()} threads; figures per call of the workload, averaged over {repeats} calls "
                "interleaved with Marian's"]
    for title in dict.fromkeys(t for t, _ in workloads):
        # Interleaved, one profiled call at a time, so that load from other processes hits both systems alike.
        operators = {"ours": {}, "marian": {}}
        walls = {"ours": 0.0, "marian": 0.0}
        tables = []
        for rep in range(repeats):
            for name in ("ours", "marian") if rep % 2 == 0 else ("marian", "ours"):
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    start = time.perf_counter()
                    workloads[title, name]()
                    walls[name] += (time.perf_counter() - start) / repeats
                for op, (us, count) in _operator_times(prof).items():
                    total = operators[name].get(op, (0.0, 0))
                    operators[name][op] = (total[0] + us, total[1] + count)
                if name == "ours" and rep == repeats - 1:
                    tables.append(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))
        table = tables[0]

        def ours_repeated(fn=workloads[title, "ours"]):
            for _ in range(repeats):
                fn()

        by_self, _ = _python_profile(ours_repeated, rows)
        own, _ = _python_profile(ours_repeated, 2 * rows, "modeling_vanilla_transformer|masking_utils|cache_utils|"
                                 "generation/utils|logits_process|stopping_criteria", sort="cumulative")
        sections.append(
            f"## {title}\n\nWall time under torch.profiler, per call: ours {walls['ours'] * 1e3:.0f} ms, Marian "
            f"{walls['marian'] * 1e3:.0f} ms.\n\n### Ours: operators by self CPU time (the last call)\n\n"
            f"{table}\n\n### Ours minus Marian, by operator (ms per call)\n\n"
            f"{_operator_diff(operators['ours'], operators['marian'], repeats, rows)}\n\n"
            f"### Ours: Python functions by own time (cProfile, all {repeats} calls)\n\n{by_self}\n"
            f"### Ours: our model code, transformers' masks, caches and generation loop, by cumulative time "
            f"(cProfile, all {repeats} calls)\n\n{own}"
        )
    return "\n\n".join(sections) + "\n"


__all__ = [
    "BenchmarkSpec",
    "TextbookDecoder",
    "build_models",
    "generate_fixed_length",
    "make_train_step",
    "measure_memory",
    "parameter_counts",
    "profile_ours",
    "render_markdown",
    "run_benchmark",
    "token_counts",
    "training_flops",
    "write_results",
]
