"""The Transformer of Vaswani et al. (2017), "Attention Is All You Need", as a transformers model.

The file follows section 3 of the paper top to bottom: positional encoding (§3.5), scaled dot-product and
multi-head attention (§3.2), the position-wise feed-forward network (§3.3), the encoder and decoder stacks
(§3.1) with shared embeddings (§3.4), and the model with its label-smoothed loss (§5.4) and decoding
defaults (§6.1). It imports only torch, transformers and the standard library, because the Hub serves
exactly this file to `trust_remote_code` users.
"""

import dataclasses
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.generation import GenerationConfig, GenerationMixin
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.utils import can_return_tuple

from .configuration_vanilla_transformer import VanillaTransformerConfig

# transformers 5.24 renamed the cache field of every output (and generate's model kwarg) from
# `past_key_values` to `cache`; detecting the field keeps one file correct on 5.23 and 5.24+.
CACHE_FIELD = "cache" if "cache" in {f.name for f in dataclasses.fields(Seq2SeqLMOutput)} else "past_key_values"


def _pick_cache(cache, past_key_values):
    if cache is not None and past_key_values is not None and cache is not past_key_values:
        raise ValueError("Pass the key/value cache as `cache` or as `past_key_values`, not both.")
    return cache if cache is not None else past_key_values


def _check_token_ids(ids: torch.Tensor, name: str, vocab_size: int, allow: int | None = None):
    """Bad ids fail here with their value, not as an index error deep inside torch."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor of token ids, got {type(ids).__name__}.")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(f"`{name}` must hold integer token ids, got dtype {ids.dtype}.")
    if ids.dim() != 2:
        raise ValueError(f"`{name}` must have shape (batch, length), got {tuple(ids.shape)}.")
    if ids.numel() == 0:
        raise ValueError(f"`{name}` is empty (shape {tuple(ids.shape)}): nothing to encode or decode.")
    if torch.compiler.is_compiling():  # the checks below read values, which would break a full graph
        return
    bad = (ids < 0) | (ids >= vocab_size)
    if allow is not None:
        bad &= ids != allow
    if bad.any():
        raise ValueError(
            f"`{name}` holds id {ids[bad][0].item()}, outside the vocabulary [0, {vocab_size})."
        )


def _check_attention_mask(mask: torch.Tensor | None, name: str, batch: int, length: int):
    if mask is None or mask.dim() != 2:  # 4-D masks are prepared by generate() for static caches
        return
    if tuple(mask.shape) != (batch, length):
        raise ValueError(f"`{name}` has shape {tuple(mask.shape)}, but the ids have shape ({batch}, {length}).")


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher forcing: the decoder reads the target shifted one step right, starting from the start token."""
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """§5.4 dropout: zero each element with probability p, scale the rest by 1 / (1 - p).

    On the CPU, torch's Bernoulli sampler costs about 6 ns per element, 4-5% of a training step of the small
    preset. Comparing 32 random bits per element (drawn as 64-bit integers, one for two elements) with a
    threshold samples the same distribution, p rounded to a multiple of 2^-32, 2.5x faster and from the same
    seeded generator. Other devices keep torch's fused kernel.
    """
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or torch.compiler.is_compiling():
        return F.dropout(x, p, training=True)
    bits = torch.empty((x.numel() + 1) // 2, dtype=torch.int64).random_(-(2**63), None)
    keep = bits.view(torch.int32)[: x.numel()].view(x.shape) >= round(p * 2**32) - 2**31
    return x * keep * (1.0 / (1.0 - p))


class Padding:
    """The positions of a padded (batch, length) grid that hold tokens.

    Everything but attention works on each position alone, so it runs on the tokens only, packed into one
    (tokens, features) matrix: a batch that is a quarter padding saves a quarter of the arithmetic. Attention
    unpacks them into the grid, padding as zeros, where the masks keep padding out of every softmax. Outputs
    at padded positions come back as zeros. Without a 2-D mask, with no padding, when disabled
    (`config.skip_padding=False`) or inside torch.compile (a token count read from data breaks a graph),
    packing and unpacking change nothing.

    `enabled=None` packs on the CPU only. On a GPU the saved arithmetic is cheap, while every packing adds kernel
    launches and reads a token count back to the host: on an H200, packing made a training step 15% slower at
    64 x 32 in fp32 and -1 to 3% (base) or 7.5% (big) faster at 384 x 64 in bf16, so large GPU batches may
    set `skip_padding=True`.
    """

    # Packing and unpacking cost a small preset's training step about as much as computing 3-4% more positions
    # (measured: 3.8% slower with 1.4% padding, 3.6% faster with 6.7%), so batches padded less are left whole.
    min_padding = 0.05

    def __init__(self, token_mask: torch.Tensor | None = None, enabled: bool | None = True):
        self.shape, self.rows = None, None
        if token_mask is None or token_mask.dim() != 2 or not self.applies(enabled, token_mask.device):
            return
        rows = token_mask.bool().flatten().nonzero().squeeze(1)  # on a GPU, the one read back to the host
        if rows.numel() <= (1 - self.min_padding) * token_mask.numel():
            self.shape, self.rows = token_mask.shape, rows

    @staticmethod
    def applies(enabled: bool | None, device: torch.device) -> bool:
        """Whether `config.skip_padding` (`enabled`) packs on `device`."""
        if torch.compiler.is_compiling():
            return False
        return device.type == "cpu" if enabled is None else enabled

    def pack(self, grid: torch.Tensor) -> torch.Tensor:
        """(batch, length, ...) -> (tokens, ...)"""
        return grid if self.rows is None else grid.flatten(0, 1).index_select(0, self.rows)

    def unpack(self, tokens: torch.Tensor) -> torch.Tensor:
        """(tokens, ...) -> (batch, length, ...), zeros at the padding"""
        if self.rows is None:
            return tokens
        grid = tokens.new_zeros(self.shape.numel(), *tokens.shape[1:])
        return grid.index_copy_(0, self.rows, tokens).unflatten(0, self.shape)  # in place: no second grid


NO_PADDING = Padding()


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


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """§3.2.1 scaled dot-product attention: softmax(Q K^T / sqrt(d_k)) V, keeping the weights."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : key.shape[-2]]  # eager masks are additive: 0 or dtype min
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


class VanillaTransformerAttention(nn.Module):
    """§3.2.2 multi-head attention, used as self-attention and as encoder-decoder attention."""

    def __init__(self, config: VanillaTransformerConfig, num_heads: int, is_causal: bool, layer_idx: int | None = None):
        super().__init__()
        self.config = config
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
        return x.view(*x.shape[:-1], -1, self.head_dim).transpose(1, 2)

    def forward(self, hidden_states, key_value_states=None, attention_mask=None, cache: Cache | None = None,
                padding: Padding = NO_PADDING, source_padding: Padding = NO_PADDING):
        """`hidden_states` (and `key_value_states`) are the tokens packed by `padding` (`source_padding`):
        the projections run on tokens, attention on the unpacked grid."""
        is_cross = key_value_states is not None
        query = padding.unpack(self.q_proj(hidden_states))
        grid_shape = query.shape
        query = self._heads(query)
        layer_cache = None
        if isinstance(cache, EncoderDecoderCache):
            layer_cache = cache.cross_attention_cache if is_cross else cache.self_attention_cache
        elif cache is not None:
            layer_cache = cache
        if is_cross and isinstance(cache, EncoderDecoderCache) and cache.is_updated.get(self.layer_idx):
            # The source does not change while decoding: its keys and values are computed once.
            key = layer_cache.layers[self.layer_idx].keys
            value = layer_cache.layers[self.layer_idx].values
        else:
            source, source_padding = (key_value_states, source_padding) if is_cross else (hidden_states, padding)
            key = self._heads(source_padding.unpack(self.k_proj(source)))
            value = self._heads(source_padding.unpack(self.v_proj(source)))
            if layer_cache is not None:
                key, value = layer_cache.update(key, value, self.layer_idx)
                if is_cross and isinstance(cache, EncoderDecoderCache):
                    cache.is_updated[self.layer_idx] = True

        # Beam search (or sampling several outputs per input) gives each source `group` consecutive decoder rows.
        # They share one copy of the source's keys and values: their queries are folded into one row of it.
        rows, group = key.shape[0], query.shape[0] // key.shape[0]
        if group > 1:
            query = query.reshape(rows, group, *query.shape[1:]).transpose(1, 2).flatten(2, 3)
        attention: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        output, weights = attention(
            self, query, key, value, attention_mask,
            dropout=self.dropout if self.training else 0.0, scaling=self.scaling,
        )
        if group > 1 and weights is not None:
            weights = weights.unflatten(2, (group, -1)).transpose(1, 2).flatten(0, 1)
        return self.out_proj(padding.pack(output.reshape(grid_shape))), weights


class VanillaTransformerFeedForward(nn.Module):
    """§3.3 position-wise feed-forward network: max(0, x W1 + b1) W2 + b2."""

    def __init__(self, config: VanillaTransformerConfig, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
        self.activation = ACT2FN[config.activation_function]
        self.activation_dropout = config.activation_dropout

    def forward(self, x):
        x = dropout(self.activation(self.fc1(x)), self.activation_dropout, self.training)
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
        x = x + dropout(output, self.dropout, self.training)
        return (x if self.normalize_before else norm(x)), *extra


class VanillaTransformerEncoderLayer(_ResidualLayer):
    """§3.1 encoder layer: self-attention, then the feed-forward network."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.self_attn = VanillaTransformerAttention(config, config.encoder_attention_heads, is_causal=False)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = VanillaTransformerFeedForward(config, config.encoder_ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(self, hidden_states, attention_mask, padding=NO_PADDING):
        hidden_states, weights = self.residual(
            hidden_states, self.self_attn_layer_norm,
            lambda x: self.self_attn(x, attention_mask=attention_mask, padding=padding),
        )
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
                padding=NO_PADDING, source_padding=NO_PADDING):
        hidden_states, self_weights = self.residual(
            hidden_states, self.self_attn_layer_norm,
            lambda x: self.self_attn(x, attention_mask=attention_mask, cache=cache, padding=padding),
        )
        hidden_states, cross_weights = self.residual(
            hidden_states, self.encoder_attn_layer_norm,
            lambda x: self.encoder_attn(x, encoder_hidden_states, attention_mask=encoder_attention_mask, cache=cache,
                                        padding=padding, source_padding=source_padding),
        )
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
        # The paper leaves initialisation open. N(0, init_std=0.02) everywhere, the BART/Marian convention,
        # trained Multi30k to 21.9 BLEU in 600 steps where Xavier-uniform with N(0, d^-0.5) embeddings (tensor2tensor)
        # reached 6.6 (scripts/results/parity_multi30k*.md): small post-LN residual branches start closer to identity.
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

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_positions = SinusoidalPositionalEncoding(config.d_model)
        # Pre-LN stacks end with a LayerNorm, since their residual stream is never normalised otherwise.
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.normalize_before else None

    def embed(self, input_ids, inputs_embeds, past_length=0):
        # `inputs_embeds` are taken as given, already scaled (the BART convention); only ids get the sqrt(d) scale.
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of `input_ids` and `inputs_embeds`.")
        if inputs_embeds is None:
            _check_token_ids(input_ids, "input_ids", self.config.vocab_size)
            inputs_embeds = self.embed_tokens(input_ids) * self.embed_scale
        elif inputs_embeds.dim() != 3 or inputs_embeds.shape[0] == 0 or inputs_embeds.shape[1] == 0:
            raise ValueError(f"`inputs_embeds` must have a non-empty shape (batch, length, d_model), got {tuple(inputs_embeds.shape)}.")
        positions = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_length
        hidden_states = inputs_embeds + self.embed_positions(positions).to(inputs_embeds.dtype)
        return dropout(hidden_states, self.config.dropout, self.training)

    def _check_output_attentions(self, output_attentions):
        if output_attentions and self.config._attn_implementation != "eager":
            raise ValueError(
                f"`output_attentions=True` needs the eager attention, which returns the weights; this model uses "
                f"{self.config._attn_implementation!r}. Load it with attn_implementation='eager' or call "
                "model.set_attn_implementation('eager')."
            )


class VanillaTransformerEncoder(_Stack):
    """§3.1 encoder: N identical layers over the embedded source."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.layers = nn.ModuleList(VanillaTransformerEncoderLayer(config) for _ in range(config.encoder_layers))
        self.post_init()

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, output_attentions=None,
                output_hidden_states=None, **kwargs) -> BaseModelOutput:
        self._check_output_attentions(output_attentions)
        hidden_states = self.embed(input_ids, inputs_embeds)
        _check_attention_mask(attention_mask, "attention_mask", *hidden_states.shape[:2])
        mask = create_bidirectional_mask(self.config, hidden_states, attention_mask)
        padding = Padding(attention_mask, enabled=self.config.skip_padding)
        hidden_states = padding.pack(hidden_states)
        all_hidden_states, all_attentions = (), ()
        for layer in self.layers:
            all_hidden_states += (hidden_states,)
            hidden_states, weights = layer(hidden_states, mask, padding)
            all_attentions += (weights,)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        hidden_states = padding.unpack(hidden_states)
        return BaseModelOutput(
            last_hidden_state=hidden_states,
            hidden_states=(*map(padding.unpack, all_hidden_states), hidden_states) if output_hidden_states else None,
            attentions=all_attentions if output_attentions else None,
        )


class VanillaTransformerDecoder(_Stack):
    """§3.1 decoder: N identical layers; self-attention is masked so position i sees only positions < i."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.layers = nn.ModuleList(VanillaTransformerDecoderLayer(config, i) for i in range(config.decoder_layers))
        self.post_init()

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, encoder_hidden_states=None, encoder_attention_mask=None,
                past_key_values=None, inputs_embeds=None, use_cache=None, output_attentions=None,
                output_hidden_states=None, cache=None, token_mask=None, **kwargs) -> BaseModelOutputWithPastAndCrossAttentions:
        """`token_mask` (batch, length): the positions whose outputs are wanted (default: `attention_mask`, when
        it covers exactly the input); the others are skipped and come back as zeros (see `Padding`)."""
        self._check_output_attentions(output_attentions)
        cache = _pick_cache(cache, past_key_values)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        checkpointing = getattr(self.layers[0], "gradient_checkpointing", False)
        if not use_cache or (self.training and torch.is_grad_enabled() and checkpointing):
            cache = None  # recomputed activations cannot append to a cache a second time
        elif cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        past_length = cache.get_seq_length() if cache is not None else 0

        hidden_states = self.embed(input_ids, inputs_embeds, past_length)
        self_attention_cache = cache.self_attention_cache if cache is not None else None
        # Positional: the parameter is `past_key_values` on 5.23 and `cache` on 5.24+.
        causal_mask = create_causal_mask(self.config, hidden_states, attention_mask, self_attention_cache)
        queries = hidden_states
        if encoder_hidden_states is not None:
            _check_attention_mask(encoder_attention_mask, "encoder attention_mask", *encoder_hidden_states.shape[:2])
            rows, sources = hidden_states.shape[0], encoder_hidden_states.shape[0]
            if rows % sources:
                raise ValueError(
                    f"The decoder has {rows} rows but the encoder output has {sources}: each source must be read by "
                    "the same number of consecutive decoder rows (1, or e.g. the number of beams)."
                )
            queries = hidden_states.reshape(sources, -1, hidden_states.shape[-1])  # as cross-attention sees them
        cross_mask = create_bidirectional_mask(
            self.config, queries, encoder_attention_mask, encoder_hidden_states=encoder_hidden_states
        )
        if token_mask is None and attention_mask is not None and attention_mask.dim() == 2 \
                and attention_mask.shape[-1] == hidden_states.shape[1]:
            token_mask = attention_mask
        if token_mask is not None and tuple(token_mask.shape) != tuple(hidden_states.shape[:2]):
            raise ValueError(f"`token_mask` has shape {tuple(token_mask.shape)}, but the decoder inputs have shape "
                             f"{tuple(hidden_states.shape[:2])}.")
        padding = Padding(token_mask, enabled=self.config.skip_padding)
        hidden_states = padding.pack(hidden_states)
        # Once cached, the source's keys and values are not recomputed: packing it again would be wasted work.
        source_cached = isinstance(cache, EncoderDecoderCache) and cache.is_updated.get(0, False)
        source_padding = Padding(None if source_cached else encoder_attention_mask, enabled=self.config.skip_padding)
        if encoder_hidden_states is not None:
            encoder_hidden_states = source_padding.pack(encoder_hidden_states)
        all_hidden_states, all_self_attentions, all_cross_attentions = (), (), ()
        for layer in self.layers:
            all_hidden_states += (hidden_states,)
            hidden_states, self_weights, cross_weights = layer(
                hidden_states, causal_mask, encoder_hidden_states, cross_mask, cache, padding, source_padding
            )
            all_self_attentions += (self_weights,)
            all_cross_attentions += (cross_weights,)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        hidden_states = padding.unpack(hidden_states)
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states,
            hidden_states=(*map(padding.unpack, all_hidden_states), hidden_states) if output_hidden_states else None,
            attentions=all_self_attentions if output_attentions else None,
            cross_attentions=all_cross_attentions if output_attentions else None,
            **{CACHE_FIELD: cache},
        )


class VanillaTransformerModel(VanillaTransformerPreTrainedModel):
    """§3.4: encoder, decoder and (in the LM) the output projection share one embedding matrix."""

    _tied_weights_keys = {"encoder.embed_tokens.weight": "shared.weight", "decoder.embed_tokens.weight": "shared.weight"}

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.encoder = VanillaTransformerEncoder(config)
        self.decoder = VanillaTransformerDecoder(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.shared

    def set_input_embeddings(self, value):
        self.shared = self.encoder.embed_tokens = self.decoder.embed_tokens = value

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None, decoder_attention_mask=None,
                encoder_outputs=None, past_key_values=None, inputs_embeds=None, decoder_inputs_embeds=None,
                use_cache=None, output_attentions=None, output_hidden_states=None, cache=None,
                decoder_token_mask=None, **kwargs) -> Seq2SeqModelOutput:
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds,
                output_attentions=output_attentions, output_hidden_states=output_hidden_states,
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(
                last_hidden_state=encoder_outputs[0],
                hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
                attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
            )
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids, attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state, encoder_attention_mask=attention_mask,
            inputs_embeds=decoder_inputs_embeds, use_cache=use_cache, output_attentions=output_attentions,
            output_hidden_states=output_hidden_states, cache=_pick_cache(cache, past_key_values),
            token_mask=decoder_token_mask,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
            **{CACHE_FIELD: getattr(decoder_outputs, CACHE_FIELD)},
        )


class VanillaTransformerForConditionalGeneration(VanillaTransformerPreTrainedModel, GenerationMixin):
    """The full model: the decoder's output through the shared embedding matrix (§3.4) and a softmax."""

    _tied_weights_keys = {"lm_head.weight": "model.shared.weight"}

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.model = VanillaTransformerModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()
        # §6.1: beam size 4, length penalty 0.6, at most input length + 50 output tokens (see generate()).
        # Built afresh: a config derived from the model config drops unknown fields when it is reloaded.
        self.generation_config = GenerationConfig(
            decoder_start_token_id=self._decoder_start_token_id, bos_token_id=config.bos_token_id,
            eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id,
            num_beams=4, length_penalty=0.6, max_new_tokens_over_input=50, length_penalty_type="gnmt",
        )
        self._gnmt_length_penalty = False

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self._decoder_start_token_id)

    @property
    def _decoder_start_token_id(self) -> int:
        start = self.config.decoder_start_token_id
        return self.config.bos_token_id if start is None else start

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None, decoder_attention_mask=None,
                encoder_outputs=None, past_key_values=None, inputs_embeds=None, decoder_inputs_embeds=None,
                labels=None, use_cache=None, output_attentions=None, output_hidden_states=None,
                num_items_in_batch=None, cache=None, **kwargs) -> Seq2SeqLMOutput:
        token_mask = None
        if labels is not None:
            _check_token_ids(labels, "labels", self.config.vocab_size, allow=-100)
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
            decoder_inputs = decoder_input_ids if decoder_input_ids is not None else decoder_inputs_embeds
            if labels.shape != decoder_inputs.shape[:2]:
                raise ValueError(f"`labels` has shape {tuple(labels.shape)}, but the decoder inputs have shape "
                                 f"{tuple(decoder_inputs.shape[:2])}.")
            if Padding.applies(self.config.skip_padding, labels.device):
                token_mask = _positions_feeding_the_loss(labels, decoder_attention_mask)
        outputs = self.model(
            input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask, encoder_outputs=encoder_outputs,
            inputs_embeds=inputs_embeds, decoder_inputs_embeds=decoder_inputs_embeds, use_cache=use_cache,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states,
            cache=_pick_cache(cache, past_key_values), decoder_token_mask=token_mask,
        )
        # The output projection, the widest layer, runs on the decoder's tokens only (see `Padding`).
        padding = Padding(token_mask, enabled=self.config.skip_padding)
        logits = self.lm_head(padding.pack(outputs.last_hidden_state))
        loss = None if labels is None else self.label_smoothed_loss(logits, padding.pack(labels), num_items_in_batch)
        logits = padding.unpack(logits)
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
            **{CACHE_FIELD: getattr(outputs, CACHE_FIELD)},
        )

    def label_smoothed_loss(self, logits, labels, num_items_in_batch=None):
        """§5.4 label-smoothed cross-entropy over the non-(-100) labels, computed in float32.

        With `num_items_in_batch` (sent by Trainer) the sum is divided by the token count of the whole
        optimizer step, so gradient accumulation and data parallelism train exactly like one large batch.
        """
        if labels.shape != logits.shape[:-1]:
            raise ValueError(f"`labels` has shape {tuple(labels.shape)}, but the logits have shape {tuple(logits.shape)}.")
        loss = F.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), labels.flatten().to(logits.device), ignore_index=-100,
            reduction="mean" if num_items_in_batch is None else "sum", label_smoothing=self.config.label_smoothing,
        )
        return loss if num_items_in_batch is None else loss / num_items_in_batch

    def generate(self, inputs=None, generation_config=None, **kwargs):
        """generate() with the paper's beam search (§6.1), both set in the generation config:

        - `max_new_tokens_over_input=50`: when no length is asked for, decode at most source length + 50 tokens;
        - `length_penalty_type="gnmt"`: beam hypotheses are ranked by log P(Y) / lp(Y) with the GNMT penalty
          lp(Y) = ((5 + |Y|) / 6)^alpha (Wu et al., 2016), alpha = `length_penalty`; "hf" keeps transformers'
          |Y|^alpha. Both can also be passed to generate() directly.
        """
        config = self.generation_config if generation_config is None else generation_config
        penalty_type = kwargs.pop("length_penalty_type", getattr(config, "length_penalty_type", "hf"))
        if penalty_type not in ("gnmt", "hf"):
            raise ValueError(f"`length_penalty_type` must be 'gnmt' or 'hf', got {penalty_type!r}.")
        offset = getattr(config, "max_new_tokens_over_input", None)
        lengths_given = kwargs.get("max_length") is not None or kwargs.get("max_new_tokens") is not None
        if offset is not None and not lengths_given and config.max_length is None and config.max_new_tokens is None:
            source = inputs if inputs is not None else kwargs.get("input_ids", kwargs.get("inputs_embeds"))
            if source is None and kwargs.get("encoder_outputs") is not None:
                source = kwargs["encoder_outputs"][0]
            if source is not None:
                # A padded batch shares one budget, set by its longest source.
                kwargs["max_new_tokens"] = source.shape[1] + offset
        self._gnmt_length_penalty = penalty_type == "gnmt"
        try:
            return super().generate(inputs, generation_config, **kwargs)
        finally:
            self._gnmt_length_penalty = False

    def _expand_inputs_for_generation(self, expand_size=1, is_encoder_decoder=False, input_ids=None, **model_kwargs):
        """generate() copies every input once per beam (or returned sample); the encoder's output and its mask
        stay one per source, since the decoder's cross-attention serves all of a source's beams from one copy."""
        shared = {key: model_kwargs.pop(key) for key in ("encoder_outputs", "attention_mask") if key in model_kwargs}
        input_ids, model_kwargs = super()._expand_inputs_for_generation(expand_size, False, input_ids, **model_kwargs)
        return input_ids, {**model_kwargs, **shared}

    def _reorder_cache(self, cache, beam_idx):
        """Beam search moves hypotheses only among the beams of one sentence, which share one copy of their
        source's keys and values (see `_expand_inputs_for_generation`): only the self-attention cache moves."""
        if isinstance(cache, EncoderDecoderCache):
            cache.self_attention_cache.reorder_cache(beam_idx)
        else:
            cache.reorder_cache(beam_idx)
        return cache

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


def _positions_feeding_the_loss(labels: torch.Tensor, decoder_attention_mask: torch.Tensor | None) -> torch.Tensor:
    """The decoder positions a label-smoothed loss depends on: the decoder only looks back, so positions after a
    row's last label (its padding, as collators pad labels with -100) feed nothing; nor does a masked-out input
    without a label."""
    labelled = labels != -100
    needed = labelled.flip(1).cummax(1).values.flip(1)
    if decoder_attention_mask is not None and decoder_attention_mask.shape == labels.shape:
        needed &= decoder_attention_mask.bool() | labelled
    return needed


def _gnmt_exponent(length: int, alpha: float) -> float:
    """The e with length ** e == ((5 + length) / 6) ** alpha (any e fits length 1, where both sides are 1)."""
    return alpha if length <= 1 else alpha * math.log((5 + length) / 6) / math.log(length)


__all__ = [
    "VanillaTransformerPreTrainedModel",
    "VanillaTransformerModel",
    "VanillaTransformerForConditionalGeneration",
    "SinusoidalPositionalEncoding",
    "shift_tokens_right",
]
