"""The Transformer of Vaswani et al. (2017), "Attention Is All You Need", as a transformers model.

Section 3 of the paper top to bottom: positional encoding (§3.5), scaled dot-product and multi-head attention
(§3.2), the feed-forward network (§3.3), the encoder and decoder stacks (§3.1) with shared, scaled embeddings
(§3.4), then the model with its loss (§5.4) and beam-search length penalty (§6.1). It imports only torch,
transformers and the standard library: the Hub serves exactly this file to `trust_remote_code` users.
"""

import dataclasses
import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (BaseModelOutput, BaseModelOutputWithPastAndCrossAttentions, Seq2SeqLMOutput,
                                           Seq2SeqModelOutput)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.utils import can_return_tuple, logging
from transformers.utils.deprecation import deprecate_kwarg

from .configuration_vanilla_transformer import VanillaTransformerConfig, paper_generation_config

logger = logging.get_logger(__name__)

# transformers 5.24 renamed the key/value cache (argument and output field) `past_key_values` -> `cache`.
CACHE_FIELD = "cache" if "cache" in {f.name for f in dataclasses.fields(Seq2SeqLMOutput)} else "past_key_values"


def accepts_past_key_values(forward):
    """Forwards take the cache as `cache`; the old name `past_key_values` still works. From 5.24 on it is
    deprecated, with the warning in-tree models give; 5.23's generate() passes it, so there it is silent."""
    if CACHE_FIELD == "cache":
        return deprecate_kwarg("past_key_values", "5.40.0", new_name="cache", raise_if_both_names=True)(forward)

    @functools.wraps(forward)
    def renamed(self, *args, past_key_values=None, **kwargs):
        if past_key_values is not None and kwargs.get("cache") not in (None, past_key_values):
            raise ValueError("Both `past_key_values` and `cache` are set: pass the key/value cache once.")
        if past_key_values is not None:
            kwargs["cache"] = past_key_values
        return forward(self, *args, **kwargs)

    return renamed


def check_token_ids(ids: torch.Tensor, name: str, vocab_size: int, allow: int | None = None,
                    read_values: bool = True):
    """Bad ids fail here with their value, not as an index error deep inside torch (or a CUDA assert).

    Reading the values back waits for the device, so a model in training mode checks only dtype and shape: its
    ids come through `TranslationDataCollator`, which checks them on the CPU."""
    if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        got = f"dtype {ids.dtype}" if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise TypeError(f"`{name}` must be a tensor of integer token ids, got {got}.")
    if ids.dim() != 2 or ids.numel() == 0:
        raise ValueError(f"`{name}` must have a non-empty shape (batch, length), got {tuple(ids.shape)}.")
    if not read_values or torch.compiler.is_compiling():  # reading values back would break the graph
        return
    bad = (ids < 0) | (ids >= vocab_size)
    if allow is not None:
        bad &= ids != allow
    if bad.any():
        raise ValueError(f"`{name}` holds id {ids[bad][0].item()}, outside the vocabulary [0, {vocab_size}).")


def check_mask(mask: torch.Tensor | None, name: str, sequences: torch.Tensor, sequences_name: str):
    """2-D masks must cover their sequences exactly (4-D masks, e.g. generate()'s for static caches, pass)."""
    if mask is not None and mask.dim() == 2 and mask.shape != sequences.shape[:2]:
        raise ValueError(f"`{name}` has shape {tuple(mask.shape)}, but `{sequences_name}` has shape "
                         f"{tuple(sequences.shape)}: the mask needs one entry per token.")


def check_pairs(source_name: str, source: torch.Tensor, target_name: str, target: torch.Tensor):
    """Each target sequence needs its own source; the error names the arguments as the user passed them."""
    if target.shape[0] != source.shape[0]:
        raise ValueError(f"`{target_name}` holds {target.shape[0]} sequences (shape {tuple(target.shape)}) but "
                         f"`{source_name}` holds {source.shape[0]} (shape {tuple(source.shape)}): each target needs "
                         "its own source.")


def given(**arguments) -> tuple[str, torch.Tensor] | tuple[None, None]:
    """The first argument that was passed, with its name: which of ids, embeddings or encoder outputs it was."""
    return next(((name, value) for name, value in arguments.items() if value is not None), (None, None))


def can_skip_padding_mask(mask: torch.Tensor | None, training: bool) -> bool:
    """Whether transformers may drop a padding mask that masks nothing. Finding out reads the mask back, which
    waits for the device; training batches are padded anyway, so in training the mask is always kept."""
    return mask is None or not training


class _SmoothedCrossEntropySum(torch.autograd.Function):
    """Summed label-smoothed cross-entropy whose gradient is formed in one pass: softmax minus the smoothed target,
    in float32, written back in the logits' dtype. Rows go through in blocks of about a million logits, so the
    float32 copy of a block stays in cache and the whole (tokens x vocabulary) float32 copy, log-softmax and its
    gradient are never materialized; at most 16 blocks, so a large batch is not cut into many small launches."""

    @staticmethod
    def forward(ctx, logits, labels, label_smoothing):
        real = labels != -100
        targets = labels.clamp(min=0)
        if torch.compiler.is_compiling():  # the compiler fuses it whole; blocks would tie its graph to the batch size
            blocks = [slice(None)]
        else:
            rows_per_block = _block_rows(logits)
            blocks = [slice(start, start + rows_per_block) for start in range(0, logits.shape[0], rows_per_block)]
        log_normalizers, losses = [], []
        for rows in blocks:
            block = logits[rows].float()
            log_normalizer = torch.logsumexp(block, dim=-1)
            target_logit = block.gather(-1, targets[rows, None]).squeeze(-1)
            # (1 - eps) * -log p(target) + eps * mean over the vocabulary of -log p
            losses.append(log_normalizer - (1 - label_smoothing) * target_logit - label_smoothing * block.mean(-1))
            log_normalizers.append(log_normalizer)
        ctx.save_for_backward(logits, targets, real, torch.cat(log_normalizers))
        ctx.label_smoothing, ctx.blocks = label_smoothing, blocks
        return (torch.cat(losses) * real).sum()

    @staticmethod
    def backward(ctx, grad_total):
        logits, targets, real, log_normalizer = ctx.saved_tensors
        eps, vocab = ctx.label_smoothing, logits.shape[-1]
        grad = torch.empty_like(logits)
        scale = real * grad_total
        for rows in ctx.blocks:
            block = torch.exp(logits[rows].float() - log_normalizer[rows, None]).sub_(eps / vocab)
            block.scatter_add_(-1, targets[rows, None], block.new_full((block.shape[0], 1), eps - 1))
            grad[rows] = block.mul_(scale[rows, None])
        return grad, None, None


def _block_rows(logits: torch.Tensor) -> int:
    rows, vocab = logits.shape
    return max(1, (1 << 20) // vocab, -(-rows // 16))


def label_smoothed_cross_entropy(logits, labels, label_smoothing: float = 0.0, num_items_in_batch=None):
    """§5.4: cross-entropy over the non-(-100) labels in float32, smoothed by `label_smoothing`, summed and divided
    by the label count, or by Trainer's `num_items_in_batch` (the whole optimizer step's, so accumulation and data
    parallelism train like one large batch). No labels give 0 and zero gradients, not 0 / 0."""
    if labels.shape != logits.shape[:-1]:
        raise ValueError(f"`labels` has shape {tuple(labels.shape)}, but `logits` has shape {tuple(logits.shape)}: "
                         "one label per position.")
    labels = labels.to(logits.device)
    total = _SmoothedCrossEntropySum.apply(logits.flatten(0, -2), labels.flatten(), label_smoothing)
    count = (labels != -100).sum() if num_items_in_batch is None else num_items_in_batch
    return total / torch.as_tensor(count, device=total.device).clamp(min=1)


def apply_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout (§5.4) with a mask that costs a quarter of the random numbers of `F.dropout`, which draws one per
    element: each 64-bit random word gives four 16-bit ones, each kept with probability 1 - p (p rounded to
    1/65536), and the kept values scaled by 1 / (1 - p) as usual."""
    if not training or p == 0:
        return x
    words = torch.empty((x.numel() + 3) // 4, dtype=torch.int64, device=x.device).random_(-(2**63), 2**63 - 1)
    keep = words.view(torch.int16)[: x.numel()].view(x.shape) >= round(p * 65536) - 32768
    return torch.where(keep, x * (1 / (1 - p)), 0)


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher forcing: the decoder reads the target shifted one step right, starting from the start token."""
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


class SinusoidalPositionalEncoding(nn.Module):
    """§3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).

    Computed from the positions on every call: no table, so no length cap and nothing for a checkpoint to
    store or for meta-device loading to leave uninitialised.
    """

    def __init__(self, d_model: int):
        super().__init__()
        self.d_model = d_model

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        two_i = torch.arange(0, self.d_model, 2, device=positions.device, dtype=torch.float32)
        angles = positions.to(torch.float32)[:, None] * torch.exp(two_i * (-math.log(10000.0) / self.d_model))
        # Interleave so that sin lands on even and cos on odd dimensions, as in the paper.
        return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)[:, : self.d_model]


class ScaledEmbedding(nn.Embedding):
    """§3.4: "In the embedding layers, we multiply those weights by sqrt(d_model)". The scale belongs to the
    embedding module, so `get_input_embeddings()(ids)` gives exactly the `inputs_embeds` that `ids` give."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config.vocab_size, config.d_model, config.pad_token_id)
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(input_ids) * self.embed_scale


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """§3.2.1 scaled dot-product attention: softmax(Q K^T / sqrt(d_k)) V, keeping the weights."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : key.shape[-2]]  # eager masks are additive: 0 or dtype min
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = apply_dropout(weights, dropout, module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


class VanillaTransformerAttention(nn.Module):
    """§3.2.2 multi-head attention, used as self-attention and as encoder-decoder attention."""

    def __init__(self, config: VanillaTransformerConfig, num_heads: int, is_causal: bool, layer_idx: int | None = None):
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.head_dim = config.d_model // num_heads
        self.scaling = self.head_dim**-0.5
        # SDPA treats a missing mask as causal unless told otherwise: encoder and cross attention must say so.
        self.is_causal = is_causal
        self.layer_idx = layer_idx
        self.dropout = config.attention_dropout
        self.q_proj = nn.Linear(config.d_model, config.d_model)
        self.k_proj = nn.Linear(config.d_model, config.d_model)
        self.v_proj = nn.Linear(config.d_model, config.d_model)
        self.out_proj = nn.Linear(config.d_model, config.d_model)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        # The head count is explicit so that an empty sequence (an ONNX step with nothing new to project) reshapes.
        return x.view(*x.shape[:-1], self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, hidden_states, key_value_states=None, attention_mask=None, cache: Cache | None = None,
                output_attentions: bool = False):
        is_cross = key_value_states is not None
        query = self._heads(self.q_proj(hidden_states))
        both = isinstance(cache, EncoderDecoderCache)  # self- and cross-attention caches
        layer_cache = (cache.cross_attention_cache if is_cross else cache.self_attention_cache) if both else cache
        if is_cross and both and cache.is_updated.get(self.layer_idx):
            # The source does not change while decoding: its keys and values are computed once.
            key, value = layer_cache.layers[self.layer_idx].keys, layer_cache.layers[self.layer_idx].values
        else:
            source = key_value_states if is_cross else hidden_states
            key, value = self._heads(self.k_proj(source)), self._heads(self.v_proj(source))
            if layer_cache is not None:
                key, value = layer_cache.update(key, value, self.layer_idx)
                if is_cross and both:
                    cache.is_updated[self.layer_idx] = True
        attention: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,
                                                                    eager_attention_forward)
        # Backends that cannot return the weights (SDPA, flash) warn about `output_attentions` and return None.
        output, weights = attention(
            self, query, key, value, attention_mask,
            dropout=self.dropout if self.training else 0.0, scaling=self.scaling, output_attentions=output_attentions,
        )
        return self.out_proj(output.reshape(*hidden_states.shape[:-1], -1)), weights


class VanillaTransformerFeedForward(nn.Module):
    """§3.3 position-wise feed-forward network: max(0, x W1 + b1) W2 + b2."""

    def __init__(self, config: VanillaTransformerConfig, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
        self.activation = ACT2FN[config.activation_function]
        self.activation_dropout = config.activation_dropout

    def forward(self, x):
        x = apply_dropout(self.activation(self.fc1(x)), self.activation_dropout, self.training)
        return (self.fc2(x),)


class _ResidualLayer(GradientCheckpointingLayer):
    """§3.1: every sublayer is wrapped as LayerNorm(x + Dropout(Sublayer(x))) — post-LN, the paper —
    or, with `normalize_before`, as x + Dropout(Sublayer(LayerNorm(x))) (pre-LN)."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__()
        self.normalize_before = config.normalize_before
        self.dropout = config.dropout

    def residual(self, x, norm: nn.LayerNorm, sublayer: Callable):
        output, *extra = sublayer(norm(x) if self.normalize_before else x)
        x = x + apply_dropout(output, self.dropout, self.training)
        return (x if self.normalize_before else norm(x)), *extra


class VanillaTransformerEncoderLayer(_ResidualLayer):
    """§3.1 encoder layer: self-attention, then the feed-forward network."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.self_attn = VanillaTransformerAttention(config, config.encoder_attention_heads, is_causal=False)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = VanillaTransformerFeedForward(config, config.encoder_ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(self, hidden_states, attention_mask, output_attentions=False):
        hidden_states, weights = self.residual(hidden_states, self.self_attn_layer_norm, lambda x: self.self_attn(
            x, attention_mask=attention_mask, output_attentions=output_attentions))
        hidden_states, = self.residual(hidden_states, self.final_layer_norm, self.ffn)
        return hidden_states, weights


class VanillaTransformerDecoderLayer(_ResidualLayer):
    """§3.1 decoder layer: masked self-attention, encoder-decoder attention, then the feed-forward network."""

    def __init__(self, config: VanillaTransformerConfig, layer_idx: int):
        super().__init__(config)
        heads = config.decoder_attention_heads
        self.self_attn = VanillaTransformerAttention(config, heads, is_causal=True, layer_idx=layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.encoder_attn = VanillaTransformerAttention(config, heads, is_causal=False, layer_idx=layer_idx)
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = VanillaTransformerFeedForward(config, config.decoder_ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(self, hidden_states, attention_mask, encoder_hidden_states, encoder_attention_mask, cache=None,
                output_attentions=False):
        hidden_states, self_weights = self.residual(hidden_states, self.self_attn_layer_norm, lambda x: self.self_attn(
            x, attention_mask=attention_mask, cache=cache, output_attentions=output_attentions))
        hidden_states, cross_weights = self.residual(hidden_states, self.encoder_attn_layer_norm, lambda x: (
            self.encoder_attn(x, encoder_hidden_states, encoder_attention_mask, cache, output_attentions)))
        hidden_states, = self.residual(hidden_states, self.final_layer_norm, self.ffn)
        return hidden_states, self_weights, cross_weights


class VanillaTransformerPreTrainedModel(PreTrainedModel):
    config_class = VanillaTransformerConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["VanillaTransformerEncoderLayer", "VanillaTransformerDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values", "cache"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True

    def _init_weights(self, module):
        # The paper leaves initialisation open: N(0, init_std) everywhere, the BART/Marian convention.
        if isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=self.config.init_std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=self.config.init_std)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)


class _Stack(VanillaTransformerPreTrainedModel):
    """What encoder and decoder share: §3.4 scaled embeddings plus §3.5 positions, with §5.4 dropout."""

    input_name = "input_ids"  # as the user passed the ids, for error messages

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.embed_tokens = ScaledEmbedding(config)
        self.embed_positions = SinusoidalPositionalEncoding(config.d_model)
        # Pre-LN stacks end with a LayerNorm, since their residual stream is never normalised otherwise.
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.normalize_before else None

    def embed(self, input_ids, inputs_embeds, past_length=0, check_ids=True):
        embeds_name = self.input_name.replace("input_ids", "inputs_embeds")
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError(f"Pass exactly one of `{self.input_name}` and `{embeds_name}`.")
        if inputs_embeds is None:
            if check_ids:
                check_token_ids(input_ids, self.input_name, self.config.vocab_size, read_values=not self.training)
            inputs_embeds = self.embed_tokens(input_ids)
        elif inputs_embeds.dim() != 3 or inputs_embeds.shape[0] == 0 or inputs_embeds.shape[1] == 0 \
                or inputs_embeds.shape[2] != self.config.d_model:
            raise ValueError(f"`{embeds_name}` must have shape (batch, length, d_model={self.config.d_model}), "
                             f"got {tuple(inputs_embeds.shape)}.")
        positions = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_length
        hidden_states = inputs_embeds + self.embed_positions(positions).to(inputs_embeds.dtype)
        return apply_dropout(hidden_states, self.config.dropout, self.training)

    def output_flags(self, output_attentions, output_hidden_states) -> tuple[bool, bool]:
        """Arguments win; otherwise the config's `output_attentions` / `output_hidden_states`."""
        return (self.config.output_attentions if output_attentions is None else output_attentions,
                self.config.output_hidden_states if output_hidden_states is None else output_hidden_states)


class VanillaTransformerEncoder(_Stack):
    """§3.1 encoder: N identical layers over the embedded source."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.layers = nn.ModuleList(VanillaTransformerEncoderLayer(config) for _ in range(config.encoder_layers))
        self.post_init()

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, output_attentions=None,
                output_hidden_states=None, **kwargs) -> BaseModelOutput:
        output_attentions, output_hidden_states = self.output_flags(output_attentions, output_hidden_states)
        hidden_states = self.embed(input_ids, inputs_embeds)
        check_mask(attention_mask, "attention_mask", hidden_states if input_ids is None else input_ids,
                   self.input_name.replace("input_ids", "inputs_embeds") if input_ids is None else self.input_name)
        mask = create_bidirectional_mask(self.config, hidden_states, attention_mask,
                                         allow_is_bidirectional_skip=can_skip_padding_mask(attention_mask, self.training))
        all_hidden_states, all_attentions = (), ()
        for layer in self.layers:
            all_hidden_states += (hidden_states,)
            hidden_states, weights = layer(hidden_states, mask, output_attentions)
            all_attentions += (weights,)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        return BaseModelOutput(last_hidden_state=hidden_states,
                               attentions=all_attentions if output_attentions else None,
                               hidden_states=(*all_hidden_states, hidden_states) if output_hidden_states else None)


class VanillaTransformerDecoder(_Stack):
    """§3.1 decoder: N identical layers; self-attention is masked so position i sees only positions <= i."""

    input_name = "decoder_input_ids"

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.layers = nn.ModuleList(VanillaTransformerDecoderLayer(config, i) for i in range(config.decoder_layers))
        self.post_init()

    @can_return_tuple
    @accepts_past_key_values
    def forward(self, input_ids=None, attention_mask=None, encoder_hidden_states=None, encoder_attention_mask=None,
                cache=None, inputs_embeds=None, use_cache=None, output_attentions=None,
                output_hidden_states=None, **kwargs) -> BaseModelOutputWithPastAndCrossAttentions:
        output_attentions, output_hidden_states = self.output_flags(output_attentions, output_hidden_states)
        if encoder_hidden_states is None:
            raise ValueError("The decoder attends to the encoder's output: pass `encoder_hidden_states`.")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        # Ids that continue a cache are the model's own output: reading them back at every step would stall a GPU.
        check_ids = cache is None
        checkpointing = getattr(self.layers[0], "gradient_checkpointing", False)
        if not use_cache or (self.training and torch.is_grad_enabled() and checkpointing):
            cache = None  # recomputed activations cannot append to a cache a second time
        elif cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        elif not isinstance(cache, EncoderDecoderCache):
            raise TypeError(f"`cache` (or `past_key_values`) must be an EncoderDecoderCache (self- and cross-attention), got "
                            f"{type(cache).__name__}.")
        past_length = cache.get_seq_length() if cache is not None else 0

        hidden_states = self.embed(input_ids, inputs_embeds, past_length, check_ids)
        check_pairs("encoder_hidden_states", encoder_hidden_states, *given(
            **{self.input_name: input_ids, self.input_name.replace("input_ids", "inputs_embeds"): inputs_embeds}))
        check_mask(encoder_attention_mask, "encoder_attention_mask", encoder_hidden_states, "encoder_hidden_states")
        causal_mask = create_causal_mask(  # the cache goes in positionally: `past_key_values` on 5.23, `cache` on 5.24+
            self.config, hidden_states, attention_mask, None if cache is None else cache.self_attention_cache)
        cross_mask = create_bidirectional_mask(
            self.config, hidden_states, encoder_attention_mask, encoder_hidden_states=encoder_hidden_states,
            allow_is_bidirectional_skip=can_skip_padding_mask(encoder_attention_mask, self.training),
        )
        all_hidden_states, all_self_attentions, all_cross_attentions = (), (), ()
        for layer in self.layers:
            all_hidden_states += (hidden_states,)
            hidden_states, self_weights, cross_weights = layer(
                hidden_states, causal_mask, encoder_hidden_states, cross_mask, cache, output_attentions
            )
            all_self_attentions += (self_weights,)
            all_cross_attentions += (cross_weights,)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        attentions = (all_self_attentions, all_cross_attentions) if output_attentions else (None, None)
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states, attentions=attentions[0], cross_attentions=attentions[1],
            hidden_states=(*all_hidden_states, hidden_states) if output_hidden_states else None, **{CACHE_FIELD: cache})


class VanillaTransformerModel(VanillaTransformerPreTrainedModel):
    """§3.4: encoder, decoder and (in the LM) the output projection share one embedding matrix."""

    _tied_weights_keys = {"encoder.embed_tokens.weight": "shared.weight", "decoder.embed_tokens.weight": "shared.weight"}

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.shared = ScaledEmbedding(config)
        self.encoder = VanillaTransformerEncoder(config)
        self.decoder = VanillaTransformerDecoder(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.shared

    def set_input_embeddings(self, value):
        self.shared = self.encoder.embed_tokens = self.decoder.embed_tokens = value

    @can_return_tuple
    @accepts_past_key_values
    def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None, decoder_attention_mask=None,
                encoder_outputs=None, cache=None, inputs_embeds=None, decoder_inputs_embeds=None,
                use_cache=None, output_attentions=None, output_hidden_states=None, **kwargs) -> Seq2SeqModelOutput:
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds,
                output_attentions=output_attentions, output_hidden_states=output_hidden_states,
            )
            source = given(input_ids=input_ids, inputs_embeds=inputs_embeds)
        else:
            if not isinstance(encoder_outputs, BaseModelOutput):  # a tuple: (last_hidden_state, hidden_states, ...)
                encoder_outputs = BaseModelOutput(*encoder_outputs)
            source = ("encoder_outputs", encoder_outputs.last_hidden_state)
            check_mask(attention_mask, "attention_mask", encoder_outputs.last_hidden_state, "encoder_outputs")
        # Checked here, where the arguments have the names the user gave them (the decoder knows other names).
        target = given(decoder_input_ids=decoder_input_ids, decoder_inputs_embeds=decoder_inputs_embeds)
        if target[0] is not None:
            check_pairs(*source, *target)
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids, attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state, encoder_attention_mask=attention_mask,
            inputs_embeds=decoder_inputs_embeds, use_cache=use_cache, output_attentions=output_attentions,
            output_hidden_states=output_hidden_states, cache=cache,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state, decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions, cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states, encoder_attentions=encoder_outputs.attentions,
            **{CACHE_FIELD: getattr(decoder_outputs, CACHE_FIELD)},
        )


class VanillaTransformerForConditionalGeneration(VanillaTransformerPreTrainedModel, GenerationMixin):
    """The full model: the decoder's output through the shared embedding matrix (§3.4) and a softmax. A new model
    decodes greedily, as every transformers model does; `from_preset` and trained checkpoints carry the paper's
    beam search (`paper_generation_config()`) in their generation config."""

    _tied_weights_keys = {"lm_head.weight": "model.shared.weight"}

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.model = VanillaTransformerModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=config.lm_head_bias)
        self._gnmt_length_penalty = False
        self.post_init()

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "VanillaTransformerForConditionalGeneration":
        """A new model of a preset's shape (`base` and `big` are Table 3), decoding as the paper does."""
        model = cls(VanillaTransformerConfig.from_preset(name, **overrides))
        model.generation_config = paper_generation_config(model.config)
        return model

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.first_decoder_token_id)

    @can_return_tuple
    @accepts_past_key_values
    def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None, decoder_attention_mask=None,
                encoder_outputs=None, cache=None, inputs_embeds=None, decoder_inputs_embeds=None,
                labels=None, use_cache=None, output_attentions=None, output_hidden_states=None,
                num_items_in_batch=None, **kwargs) -> Seq2SeqLMOutput:
        if labels is not None:
            check_token_ids(labels, "labels", self.config.vocab_size, allow=-100, read_values=not self.training)
            use_cache = False
            target = given(decoder_input_ids=decoder_input_ids, decoder_inputs_embeds=decoder_inputs_embeds)
            if target[0] is None:  # the decoder's inputs come from `labels`: errors about them name `labels`
                source = given(encoder_outputs=None if encoder_outputs is None else encoder_outputs[0],
                               input_ids=input_ids, inputs_embeds=inputs_embeds)
                if source[0] is not None:
                    check_pairs(*source, "labels", labels)
                check_mask(decoder_attention_mask, "decoder_attention_mask", labels, "labels")
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
            elif labels.shape != target[1].shape[:2]:
                raise ValueError(f"`labels` has shape {tuple(labels.shape)}, but `{target[0]}` has shape "
                                 f"{tuple(target[1].shape)}: one label per decoder position.")
        outputs = self.model(
            input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask, encoder_outputs=encoder_outputs,
            inputs_embeds=inputs_embeds, decoder_inputs_embeds=decoder_inputs_embeds, use_cache=use_cache,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states, cache=cache,
        )
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None if labels is None else label_smoothed_cross_entropy(
            logits, labels, self.config.label_smoothing, num_items_in_batch)
        return Seq2SeqLMOutput(
            loss=loss, logits=logits, decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions, cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states, encoder_attentions=outputs.encoder_attentions,
            **{CACHE_FIELD: getattr(outputs, CACHE_FIELD)},
        )

    def generate(self, inputs=None, generation_config=None, **kwargs):
        """generate() with two options of the paper's beam search (§6.1), from the generation config (as
        `paper_generation_config()` sets them) or passed directly:

        - `max_new_tokens_over_input=50`: when no length is asked for, decode at most source length + 50 tokens;
        - `length_penalty_type="gnmt"`: rank beam hypotheses by log P(Y) / ((5 + |Y|) / 6)^alpha, GNMT's penalty
          (Wu et al., 2016); "hf" (the default) keeps transformers' log P(Y) / |Y|^alpha.
        """
        config = self.generation_config if generation_config is None else generation_config
        penalty_type = kwargs.pop("length_penalty_type", getattr(config, "length_penalty_type", "hf"))
        if penalty_type not in ("gnmt", "hf"):
            raise ValueError(f"`length_penalty_type` must be 'gnmt' or 'hf', got {penalty_type!r}.")
        offset = kwargs.pop("max_new_tokens_over_input", getattr(config, "max_new_tokens_over_input", None))
        lengths_given = kwargs.get("max_length") is not None or kwargs.get("max_new_tokens") is not None
        if offset is not None and not lengths_given and config.max_length is None and config.max_new_tokens is None:
            encoded = kwargs.get("encoder_outputs")
            sources = (inputs, kwargs.get("input_ids"), kwargs.get("inputs_embeds"), encoded and encoded[0])
            source = next((x for x in sources if x is not None), None)
            if source is not None:  # a padded batch shares one budget, set by its longest source
                kwargs["max_new_tokens"] = source.shape[1] + offset
        if kwargs.get("decoder_input_ids") is not None:  # the decoder checks no ids while it continues a cache
            check_token_ids(kwargs["decoder_input_ids"], "decoder_input_ids", self.config.vocab_size)
        self._gnmt_length_penalty = penalty_type == "gnmt"
        try:
            return super().generate(inputs, generation_config, **kwargs)
        finally:
            self._gnmt_length_penalty = False

    # transformers' beam search divides a hypothesis' log-probability by length ** length_penalty in these two
    # places. For the GNMT penalty we pass, for the length in question, the exponent e with
    # length ** e == ((5 + length) / 6) ** alpha, so the library's own code ranks by the paper's score.
    def _update_finished_beams(self, **kwargs):
        if self._gnmt_length_penalty:
            length = kwargs["cur_len"] + 1 - kwargs["decoder_prompt_len"]
            kwargs["length_penalty"] = _gnmt_exponent(length, kwargs["length_penalty"])
        return super()._update_finished_beams(**kwargs)

    def _check_early_stop_heuristic(self, **kwargs):
        if self._gnmt_length_penalty:
            alpha = kwargs["length_penalty"]
            longest = kwargs["early_stopping"] == "never" and alpha > 0.0
            length = (kwargs["max_length"] if longest else kwargs["cur_len"]) - kwargs["decoder_prompt_len"]
            kwargs["length_penalty"] = _gnmt_exponent(length, alpha)
        return super()._check_early_stop_heuristic(**kwargs)


def gnmt_length_penalty(length: int, alpha: float) -> float:
    """GNMT's length penalty ((5 + |Y|) / 6)^alpha (Wu et al., 2016), which the paper's beam search divides by."""
    return ((5 + length) / 6) ** alpha


def _gnmt_exponent(length: int, alpha: float) -> float:
    """The e with length ** e == gnmt_length_penalty(length, alpha) (any e fits length 1, where both are 1)."""
    return alpha if length <= 1 else math.log(gnmt_length_penalty(length, alpha)) / math.log(length)


__all__ = ["VanillaTransformerPreTrainedModel", "VanillaTransformerModel", "VanillaTransformerForConditionalGeneration",
           "SinusoidalPositionalEncoding", "ScaledEmbedding", "label_smoothed_cross_entropy", "shift_tokens_right",
           "check_token_ids", "gnmt_length_penalty"]
