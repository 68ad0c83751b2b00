"""The Transformer of Vaswani et al. (2017), "Attention Is All You Need", as a transformers model.

Section 3 of the paper top to bottom: positional encoding (§3.5), the shared, scaled embeddings (§3.4), scaled
dot-product and multi-head attention (§3.2), the feed-forward network (§3.3), the encoder and decoder layers and
stacks (§3.1), then the model and its head. What is not the paper (input checks, the measured loss kernel, the
beam search's GNMT penalty and length budget, the cache's name across transformers versions) lives in
`support_vanilla_transformer.py`. These two and `configuration_vanilla_transformer.py` import only torch,
transformers, the standard library and each other: the Hub serves the three to `trust_remote_code` users.
"""

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
from transformers.utils import can_return_tuple
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_vanilla_transformer import VanillaTransformerConfig, paper_generation_config
# check_token_ids and gnmt_length_penalty are re-exported: the package's data and tools import them from here.
from .support_vanilla_transformer import (CACHE_FIELD, PaperDecodingMixin, accepts_past_key_values,
                                          check_decoder_inputs, check_encoder_inputs, check_labels,
                                          check_seq2seq_inputs, check_token_ids, gnmt_length_penalty,
                                          label_smoothed_cross_entropy)


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
    weights = F.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


class InputProjection(nn.Linear):
    """A query, key or value projection of §3.2.2 (W^Q, W^K, W^V), told apart from the output projection W^O where
    the initialisation draws them differently (`_init_weights`)."""


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
        self.q_proj = InputProjection(config.d_model, config.d_model)
        self.k_proj = InputProjection(config.d_model, config.d_model)
        self.v_proj = InputProjection(config.d_model, config.d_model)
        self.out_proj = nn.Linear(config.d_model, config.d_model)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        # The head count is explicit so that an empty sequence (an ONNX step with nothing new to project) reshapes.
        return x.view(*x.shape[:-1], self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, hidden_states, key_value_states=None, attention_mask=None, cache: Cache | None = None, **kwargs):
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
        # The weights are recorded where asked for (`_can_record_outputs`); SDPA and flash return None for them and,
        # told `output_attentions` in `kwargs`, say so.
        output, weights = attention(self, query, key, value, attention_mask,
                                    dropout=self.dropout if self.training else 0.0, scaling=self.scaling, **kwargs)
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
        x = F.dropout(self.activation(self.fc1(x)), p=self.activation_dropout, training=self.training)
        return self.fc2(x)


class _ResidualLayer(GradientCheckpointingLayer):
    """§3.1: every sublayer is wrapped as LayerNorm(x + Dropout(Sublayer(x))) — post-LN, the paper —
    or, with `normalize_before`, as x + Dropout(Sublayer(LayerNorm(x))) (pre-LN)."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__()
        self.normalize_before = config.normalize_before
        self.dropout = config.dropout

    def residual(self, x, norm: nn.LayerNorm, sublayer: Callable):
        x = x + F.dropout(sublayer(norm(x) if self.normalize_before else x), p=self.dropout, training=self.training)
        return x if self.normalize_before else norm(x)


class VanillaTransformerEncoderLayer(_ResidualLayer):
    """§3.1 encoder layer: self-attention, then the feed-forward network."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.self_attn = VanillaTransformerAttention(config, config.encoder_attention_heads, is_causal=False)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = VanillaTransformerFeedForward(config, config.encoder_ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(self, hidden_states, attention_mask, **kwargs):
        # The attention weights are the attention's second output, recorded there when asked for.
        hidden_states = self.residual(hidden_states, self.self_attn_layer_norm, lambda x: self.self_attn(
            x, attention_mask=attention_mask, **kwargs)[0])
        return self.residual(hidden_states, self.final_layer_norm, self.ffn)


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
                **kwargs):
        hidden_states = self.residual(hidden_states, self.self_attn_layer_norm, lambda x: self.self_attn(
            x, attention_mask=attention_mask, cache=cache, **kwargs)[0])
        hidden_states = self.residual(hidden_states, self.encoder_attn_layer_norm, lambda x: self.encoder_attn(
            x, encoder_hidden_states, encoder_attention_mask, cache, **kwargs)[0])
        return self.residual(hidden_states, self.final_layer_norm, self.ffn)


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
        # The paper leaves initialisation open: `config.init_method` chooses (the configuration says what each is).
        xavier = self.config.init_method == "xavier"
        embedding_std = self.config.d_model**-0.5 if xavier else self.config.init_std
        if isinstance(module, nn.Linear):
            if module is getattr(self, "lm_head", None):
                # The output embedding (§3.4). Tied, it is the shared matrix, drawn below with its padding row zeroed;
                # drawing it here too would undo that where the tie is made first (loading with weights missing).
                if not self.config.tie_word_embeddings:
                    init.normal_(module.weight, mean=0.0, std=embedding_std)
            elif xavier:  # fairseq's gains: 1/sqrt(2) for the query, key and value projections, 1 for the rest
                init.xavier_uniform_(module.weight, gain=2**-0.5 if isinstance(module, InputProjection) else 1.0)
            else:
                init.normal_(module.weight, mean=0.0, std=self.config.init_std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=embedding_std)
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

    def embed(self, input_ids, inputs_embeds, past_length=0):
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        positions = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_length
        hidden_states = inputs_embeds + self.embed_positions(positions).to(inputs_embeds.dtype)
        return F.dropout(hidden_states, p=self.config.dropout, training=self.training)

    def padding_mask(self, hidden_states, attention_mask, encoder_hidden_states=None):
        """§3.2.3: attention ignores padding. transformers may drop a mask that masks nothing, but finding out reads
        the mask back, which waits for the device; training batches are padded anyway, so training keeps it."""
        return create_bidirectional_mask(self.config, hidden_states, attention_mask,
                                         encoder_hidden_states=encoder_hidden_states,
                                         allow_is_bidirectional_skip=attention_mask is None or not self.training)


class VanillaTransformerEncoder(_Stack):
    """§3.1 encoder: N identical layers over the embedded source."""

    # Recorded by transformers' hooks only when asked for (`output_hidden_states`, `output_attentions`).
    _can_record_outputs = {"hidden_states": VanillaTransformerEncoderLayer,
                           "attentions": OutputRecorder(VanillaTransformerAttention, index=1, layer_name="self_attn")}

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.layers = nn.ModuleList(VanillaTransformerEncoderLayer(config) for _ in range(config.encoder_layers))
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, **kwargs) -> BaseModelOutput:
        check_encoder_inputs(self, input_ids, inputs_embeds, attention_mask)
        hidden_states = self.embed(input_ids, inputs_embeds)
        mask = self.padding_mask(hidden_states, attention_mask)
        for layer in self.layers:
            hidden_states = layer(hidden_states, mask, **kwargs)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        return BaseModelOutput(last_hidden_state=hidden_states)


class VanillaTransformerDecoder(_Stack):
    """§3.1 decoder: N identical layers; self-attention is masked so position i sees only positions <= i."""

    input_name = "decoder_input_ids"
    _can_record_outputs = {
        "hidden_states": VanillaTransformerDecoderLayer,
        "attentions": OutputRecorder(VanillaTransformerAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(VanillaTransformerAttention, index=1, layer_name="encoder_attn"),
    }

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.layers = nn.ModuleList(VanillaTransformerDecoderLayer(config, i) for i in range(config.decoder_layers))
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    @accepts_past_key_values
    def forward(self, input_ids=None, attention_mask=None, encoder_hidden_states=None, encoder_attention_mask=None,
                cache=None, inputs_embeds=None, use_cache=None, **kwargs) -> BaseModelOutputWithPastAndCrossAttentions:
        checkpointing = getattr(self.layers[0], "gradient_checkpointing", False)
        # Recomputed activations cannot append to a cache a second time.
        use_cache = use_cache and not (self.training and torch.is_grad_enabled() and checkpointing)
        # Ids that continue a cache are the model's own output: reading them back at every step would stall a GPU.
        check_decoder_inputs(self, input_ids, inputs_embeds, encoder_hidden_states, encoder_attention_mask,
                             cache if use_cache else None, check_ids=cache is None)
        if not use_cache:
            cache = None
        elif cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        past_length = cache.get_seq_length() if cache is not None else 0

        hidden_states = self.embed(input_ids, inputs_embeds, past_length)
        causal_mask = create_causal_mask(  # the cache goes in positionally: `past_key_values` on 5.23, `cache` on 5.24+
            self.config, hidden_states, attention_mask, None if cache is None else cache.self_attention_cache)
        cross_mask = self.padding_mask(hidden_states, encoder_attention_mask, encoder_hidden_states)
        for layer in self.layers:
            hidden_states = layer(hidden_states, causal_mask, encoder_hidden_states, cross_mask, cache, **kwargs)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=hidden_states, **{CACHE_FIELD: cache})


class VanillaTransformerModel(VanillaTransformerPreTrainedModel):
    """§3.4: encoder, decoder and (in the LM) the output projection share one embedding matrix."""

    _tied_weights_keys = {"encoder.embed_tokens.weight": "shared.weight", "decoder.embed_tokens.weight": "shared.weight"}

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.shared = ScaledEmbedding(config)
        self.encoder = VanillaTransformerEncoder(config)
        self.decoder = VanillaTransformerDecoder(config)
        self.post_init()

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict:
        # §3.4: source and target share one matrix whatever `tie_word_embeddings` says of the output projection;
        # transformers would untie them together with it.
        if all_submodels:
            return super().get_expanded_tied_weights_keys(all_submodels=True)
        return dict(self._tied_weights_keys)

    def get_input_embeddings(self):
        return self.shared

    def set_input_embeddings(self, value):
        self.shared = self.encoder.embed_tokens = self.decoder.embed_tokens = value

    @can_return_tuple
    @accepts_past_key_values
    def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None, decoder_attention_mask=None,
                encoder_outputs=None, cache=None, inputs_embeds=None, decoder_inputs_embeds=None,
                use_cache=None, **kwargs) -> Seq2SeqModelOutput:
        encoded = encoder_outputs is not None
        if not encoded:
            encoder_outputs = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                                           inputs_embeds=inputs_embeds, **kwargs)
        elif not isinstance(encoder_outputs, BaseModelOutput):  # a tuple: (last_hidden_state, hidden_states, ...)
            encoder_outputs = BaseModelOutput(*encoder_outputs)
        check_seq2seq_inputs(input_ids, inputs_embeds, encoder_outputs.last_hidden_state if encoded else None,
                           attention_mask, decoder_input_ids, decoder_inputs_embeds)
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids, attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state, encoder_attention_mask=attention_mask,
            inputs_embeds=decoder_inputs_embeds, use_cache=use_cache, cache=cache, **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state, decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions, cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states, encoder_attentions=encoder_outputs.attentions,
            **{CACHE_FIELD: getattr(decoder_outputs, CACHE_FIELD)},
        )


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher forcing: the decoder reads the target shifted one step right, starting from the start token."""
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


class VanillaTransformerForConditionalGeneration(VanillaTransformerPreTrainedModel, PaperDecodingMixin,
                                                 GenerationMixin):
    """The full model: the decoder's output through the shared embedding matrix (§3.4) and a softmax. A new model
    decodes greedily, as every transformers model does; `from_preset` and trained checkpoints carry the paper's
    beam search (`paper_generation_config()`, §6.1) in their generation config."""

    _tied_weights_keys = {"lm_head.weight": "model.shared.weight"}

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.model = VanillaTransformerModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=config.lm_head_bias)
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
                labels=None, use_cache=None, num_items_in_batch=None, **kwargs) -> Seq2SeqLMOutput:
        if labels is not None:
            check_labels(labels, self.config.vocab_size, self.training, input_ids=input_ids,
                         inputs_embeds=inputs_embeds, encoder_outputs=encoder_outputs,
                         decoder_input_ids=decoder_input_ids, decoder_inputs_embeds=decoder_inputs_embeds,
                         decoder_attention_mask=decoder_attention_mask)
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs = self.model(
            input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask, encoder_outputs=encoder_outputs,
            inputs_embeds=inputs_embeds, decoder_inputs_embeds=decoder_inputs_embeds, use_cache=use_cache,
            cache=cache, **kwargs,
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


__all__ = ["VanillaTransformerPreTrainedModel", "VanillaTransformerModel", "VanillaTransformerForConditionalGeneration",
           "SinusoidalPositionalEncoding", "ScaledEmbedding", "label_smoothed_cross_entropy", "shift_tokens_right",
           "check_token_ids", "gnmt_length_penalty"]
