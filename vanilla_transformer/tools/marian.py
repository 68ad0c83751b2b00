"""Convert a MarianMTModel (the OPUS-MT checkpoints) into a VanillaTransformerForConditionalGeneration that
computes the same function.

Marian is the paper's architecture (post-LN, §3.1; shared embeddings, §3.4; sinusoidal positions, §3.5) with
one layout difference: its sinusoid table puts sin(pos·w_i) in dimension i and cos(pos·w_i) in dimension
h + i (h = ceil(d/2), see `MarianSinusoidalPositionalEmbedding.create_weight`), while ours interleaves them,
sin in dimension 2i and cos in 2i + 1, as the paper writes it. Hence

    PE_ours[:, j] = PE_marian[:, P[j]]   with   P[2i] = i,  P[2i + 1] = h + i.

Relabelling the coordinates of the residual stream by P everywhere gives an exactly equivalent network: with
every residual state x_ours = x_marian[P], a Linear that reads the stream uses W[:, P] (since
W[:, P] x[P] = W x), one that writes it uses W[P] and b[P], residual additions act coordinate-wise, LayerNorm's
mean and variance do not depend on the order of coordinates (so its weight and bias become γ[P], β[P]), and
the logits E[:, P] x[P] = E x are unchanged. Attention heads live inside the projections and are untouched.
The only numerical differences are float32 rounding: matmul sums run in another order, and our table is
computed in float32 where Marian's is computed in float64.
"""

import copy
import os
from pathlib import Path

import torch
from transformers import MarianConfig, MarianMTModel

from .folders import TOKENIZER_FILES, check_output_dir, copy_side_files, staged_output_dir
from ..configuration_vanilla_transformer import VanillaTransformerConfig
from ..modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from .verification import check_close, float32_reference, verification_batch

# Marian-only tensors: the position tables are recomputed by our model.
_DROPPED = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")


def marian_config_like(config: VanillaTransformerConfig, max_positions: int = 512) -> MarianConfig:
    """The `MarianConfig` of a network shaped like `config` — the closest built-in peer, for benchmarks and the
    parity run: sizes, activation, post-LN, sqrt(d_model)-scaled embeddings shared by encoder, decoder and output
    layer, our special ids, and no forced eos (generate would otherwise add a logits processor). Marian's
    learned-free position table must cover `max_positions` (the longest source and decoded target)."""
    if config.normalize_before:
        raise ValueError("MarianMTModel is post-LN only; a pre-LN config (normalize_before=True) has no Marian twin.")
    return MarianConfig(
        vocab_size=config.vocab_size, d_model=config.d_model, encoder_layers=config.encoder_layers,
        decoder_layers=config.decoder_layers, encoder_attention_heads=config.encoder_attention_heads,
        decoder_attention_heads=config.decoder_attention_heads, encoder_ffn_dim=config.encoder_ffn_dim,
        decoder_ffn_dim=config.decoder_ffn_dim, activation_function=config.activation_function,
        dropout=config.dropout, attention_dropout=config.attention_dropout,
        activation_dropout=config.activation_dropout, scale_embedding=config.scale_embedding,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True, max_position_embeddings=max_positions,
        pad_token_id=config.pad_token_id, eos_token_id=config.eos_token_id, bos_token_id=config.bos_token_id,
        decoder_start_token_id=config.decoder_start_token_id, forced_eos_token_id=None,
    )


def residual_permutation(d_model: int) -> torch.Tensor:
    """P with PE_ours[:, j] == PE_marian[:, P[j]]: P[2i] = i (sin), P[2i + 1] = ceil(d/2) + i (cos)."""
    half = (d_model + 1) // 2
    permutation = torch.empty(d_model, dtype=torch.long)
    permutation[0::2] = torch.arange(half)
    permutation[1::2] = half + torch.arange(d_model // 2)
    return permutation


def config_from_marian(marian: MarianConfig) -> VanillaTransformerConfig:
    """The VanillaTransformerConfig of the same network; raises ValueError for what we cannot represent."""
    if not marian.share_encoder_decoder_embeddings or marian.decoder_vocab_size != marian.vocab_size:
        raise ValueError("Only Marian models with one shared source/target vocabulary can be converted "
                         f"(share_encoder_decoder_embeddings={marian.share_encoder_decoder_embeddings}, "
                         f"vocab_size={marian.vocab_size}, decoder_vocab_size={marian.decoder_vocab_size}).")
    if not marian.tie_word_embeddings:
        raise ValueError("Only Marian models whose output projection is tied to the embeddings can be converted "
                         "(tie_word_embeddings=False); our model always ties them (§3.4).")
    return VanillaTransformerConfig(
        vocab_size=marian.vocab_size, d_model=marian.d_model,
        encoder_layers=marian.encoder_layers, decoder_layers=marian.decoder_layers,
        encoder_attention_heads=marian.encoder_attention_heads, decoder_attention_heads=marian.decoder_attention_heads,
        encoder_ffn_dim=marian.encoder_ffn_dim, decoder_ffn_dim=marian.decoder_ffn_dim,
        activation_function=marian.activation_function,  # OPUS-MT models use swish, not the paper's ReLU
        dropout=marian.dropout, attention_dropout=marian.attention_dropout,
        activation_dropout=marian.activation_dropout,
        normalize_before=False,  # Marian is post-LN
        scale_embedding=marian.scale_embedding,
        layer_norm_eps=1e-5,  # Marian's nn.LayerNorm default
        label_smoothing=0.0,  # Marian's loss is plain cross-entropy: the converted loss stays identical
        init_std=marian.init_std, use_cache=marian.use_cache, tie_word_embeddings=True,
        pad_token_id=marian.pad_token_id, bos_token_id=marian.bos_token_id, eos_token_id=marian.eos_token_id,
        decoder_start_token_id=marian.decoder_start_token_id,  # Marian starts decoding from the pad token
    )


def has_logits_bias(state_dict: dict[str, torch.Tensor]) -> bool:
    """Whether a Marian model's `final_logits_bias` (trained by OPUS-MT's Marian) holds anything but zeros."""
    bias = state_dict.get("final_logits_bias")
    return bias is not None and bool(bias.abs().max() != 0)


def state_dict_from_marian(state_dict: dict[str, torch.Tensor], d_model: int) -> dict[str, torch.Tensor]:
    """Rename Marian's tensors to ours and permute every residual-stream axis by `residual_permutation`; a
    non-zero `final_logits_bias` becomes `lm_head.bias` (for a config with `lm_head_bias=True`)."""
    permutation = residual_permutation(d_model)
    converted = {}
    for name, tensor in state_dict.items():
        if name in _DROPPED:
            continue
        if name == "final_logits_bias":  # over the vocabulary, not the residual stream: nothing to permute
            if has_logits_bias(state_dict):
                converted["lm_head.bias"] = tensor.reshape(-1).clone()
            continue
        name = name.replace(".fc1.", ".ffn.fc1.").replace(".fc2.", ".ffn.fc2.")
        converted[name] = _permute(name, tensor, permutation)
    return converted


def state_dict_to_marian(state_dict: dict[str, torch.Tensor], d_model: int) -> dict[str, torch.Tensor]:
    """The inverse of `state_dict_from_marian`: our tensors under Marian's names, the residual stream unpermuted
    (Marian's position tables are buffers it computes itself; `lm_head.bias` becomes `final_logits_bias`)."""
    inverse = torch.argsort(residual_permutation(d_model))
    return {name.replace(".ffn.fc", ".fc"): _permute(name, tensor, inverse) if name != "lm_head.bias"
            else tensor.reshape(1, -1).clone() for name, tensor in state_dict.items()}


def copy_weights_into_marian(model: VanillaTransformerForConditionalGeneration, marian: MarianMTModel) -> None:
    """Load our model's weights into a `MarianMTModel` of the same shape (`marian_config_like`), undoing the
    residual-stream permutation: the two then compute the same function (the benchmarks' like-for-like peer)."""
    missing, unexpected = marian.load_state_dict(state_dict_to_marian(model.state_dict(), model.config.d_model),
                                                 strict=False)
    # Marian's position tables and zero logits bias are buffers it computes itself.
    missing = [name for name in missing if not name.endswith(("embed_positions.weight", "final_logits_bias"))]
    if missing or unexpected:
        raise ValueError(f"Our weights do not map onto this Marian model: missing {missing}, unexpected {unexpected}.")


def _permute(name: str, tensor: torch.Tensor, permutation: torch.Tensor) -> torch.Tensor:
    reads_stream = ("shared.weight", "embed_tokens.weight", "lm_head.weight",
                    "q_proj.weight", "k_proj.weight", "v_proj.weight", "fc1.weight")
    writes_stream = ("out_proj.weight", "out_proj.bias", "fc2.weight", "fc2.bias", "layer_norm.weight",
                     "layer_norm.bias")
    if name.endswith(reads_stream):  # input columns (embedding rows are tokens, columns the stream)
        return tensor[:, permutation].clone()
    if name.endswith(writes_stream):  # output rows, or the per-coordinate LayerNorm affine
        return tensor[permutation].clone()
    if name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias", "fc1.bias")):  # head / hidden axes only
        return tensor.clone()
    raise ValueError(f"Don't know how to convert Marian tensor {name!r}.")


def convert_marian(marian: MarianMTModel | str | os.PathLike, output_dir: str | os.PathLike | None = None,
                   allow_pickle: bool = False, verify: bool = True) -> VanillaTransformerForConditionalGeneration:
    """Convert a MarianMTModel, or a local folder holding one, into our model with the same outputs.

    The generation config (num_beams, max_length, bad_words_ids=[[pad]], forced_eos_token_id, ...) is carried
    over whole, so `generate()` decodes as Marian did; our §6.1 defaults are not applied. With `output_dir`,
    the model is saved there with the folder's tokenizer files. A folder is read from safetensors unless
    `allow_pickle` (transformers then reads pytorch_model.bin with torch.load(weights_only=True)).

    With `verify` (the default) both models score a fixed random batch in float32 before anything is written,
    and a logit that differs by more than `VERIFY_ATOL` raises `VerificationError` naming the difference.
    """
    if output_dir is not None:
        check_output_dir(output_dir)
    source = None
    if not isinstance(marian, MarianMTModel):
        source = Path(marian)
        if not source.is_dir():
            raise ValueError(f"marian={str(source)!r} is not a folder (one saved by MarianMTModel.save_pretrained).")
        marian = MarianMTModel.from_pretrained(source, use_safetensors=None if allow_pickle else True)
    config = config_from_marian(marian.config)
    state_dict = marian.state_dict()
    config.lm_head_bias = has_logits_bias(state_dict)
    weights = state_dict_from_marian(state_dict, config.d_model)
    model = VanillaTransformerForConditionalGeneration(config)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise ValueError(f"Marian and our model disagree on tensors: missing {missing}, unexpected {unexpected}.")
    model.generation_config = copy.deepcopy(marian.generation_config)
    model.eval()
    if verify:
        verify_against_marian(marian, model)
    model.to(marian.dtype)
    if output_dir is not None:
        with staged_output_dir(output_dir) as staging:
            model.save_pretrained(staging)
            if source is not None:
                # Marian's tokenizer (source.spm, target.spm, vocab.json, ...) works unchanged with the new model.
                copy_side_files(source, staging, TOKENIZER_FILES)
    return model


def verify_against_marian(marian: MarianMTModel, converted: VanillaTransformerForConditionalGeneration) -> float:
    """The largest logit difference between `marian` and its conversion on a fixed random batch, in float32;
    `VerificationError` above `VERIFY_ATOL`."""
    batch = verification_batch(marian.config, max_positions=marian.config.max_position_embeddings)
    input_ids, attention_mask, decoder_input_ids = batch
    with float32_reference(marian) as reference, float32_reference(converted) as ours:
        expected = reference(input_ids=input_ids, attention_mask=attention_mask,
                             decoder_input_ids=decoder_input_ids).logits
        actual = ours(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    return check_close(expected, actual, "The converted model's logits", how_to_skip="--no_verify (verify=False)")


__all__ = ["marian_config_like", "convert_marian", "verify_against_marian", "copy_weights_into_marian", "config_from_marian", "state_dict_from_marian", "state_dict_to_marian",
           "has_logits_bias", "residual_permutation"]
