"""What any implementation must spend, measured on the machine at hand: FLOP models of training and decoding,
and floors that replay only the unavoidable kernels of a workload at its shapes. `ProjectionFloor` times the
cached decoding's matmuls alone, `AttentionFloor` adds its attention kernels (and beam search's cache
reordering), `TrainingFloor` the training step's matmuls and the AdamW update, and `generation_split` the time
transformers' generation loop spends outside the model. A peer's time over a floor bounds what any
implementation could gain over that peer (the ceilings in the report)."""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers.cache_utils import EncoderDecoderCache

from vanilla_transformer.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration

from .toolkit import synchronize


def _randn(shape, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Seeded on the CPU, then moved: the same numbers on every device."""
    return torch.randn(shape, generator=generator).to(device)


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
        self.source = {w: _randn((source_tokens, w), generator, model.device) for w in widths}
        self.rows = {w: _randn((batch_size * num_beams, w), generator, model.device) for w in widths}

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
        self.tensors = {s: _randn(s, generator, model.device) for s in shapes}
        self.beam_idx = {s[0]: torch.randperm(s[0], generator=generator).to(model.device)
                         for r in self.reorders for s in r}

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
            (layer, _randn((rows, layer.in_features), generator, model.device),
             _randn((rows, layer.out_features), generator, model.device))
            for layer, rows in [(m, source_rows) for m in encoder]
            + [(m, source_rows if id(m) in source_kv else target_rows) for m in decoder]
        ]
        # The update runs on copies, so the model's own weights and optimizer state are untouched.
        params = [p.detach().clone() for p in {id(p): p for p in model.parameters() if p.requires_grad}.values()]
        for p in params:
            p.grad = _randn(p.shape, generator, p.device)
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
    stopping checks); medians over `repeats` runs. A model made infinitely fast would still pay the loop. On a GPU
    every forward is waited for, so that its kernels count as the model's time."""
    inside = [0.0]
    device = model.device

    def timed(forward):
        @functools.wraps(forward)  # generate() inspects forward's signature
        def wrapper(*args, **kwargs):
            synchronize(device)
            start = time.perf_counter()
            try:
                return forward(*args, **kwargs)
            finally:
                synchronize(device)
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
            synchronize(device)
            start = time.perf_counter()
            run()
            synchronize(device)
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
