"""What the modeling file needs that is not section 3 of the paper: the cache's name across transformers versions,
the argument and input checks, the loss kernel, and the paper's decoding options for `generate()` (§6.1).

The Hub serves this file beside the modeling file (remote code copies its relative imports), so it imports only
torch, transformers and the standard library.
"""

import contextvars
import dataclasses
import functools
import math

import torch
from transformers.cache_utils import EncoderDecoderCache
from transformers.modeling_outputs import Seq2SeqLMOutput
from transformers.utils.deprecation import deprecate_kwarg

# transformers versions ---------------------------------------------------------------------------------------------

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


# Input checks: bad input fails at the entry point it was passed to, named as the user passed it ---------------------

def check_int(name: str, value, at_least: int = 1, at_most: int | None = None) -> int:
    """The one check of a count the package takes (a flag, an argument, a config field): an int (a bool is not one)
    from `at_least` to `at_most`; `name` is how the user passed it (`--num_beams`, `` `batch_size` ``)."""
    wanted = f"an int of at least {at_least}" if at_most is None else f"an int from {at_least} to {at_most}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be {wanted}, got {value!r} ({type(value).__name__}).")
    if value < at_least or (at_most is not None and value > at_most):
        raise ValueError(f"{name} must be {wanted}, got {value!r}.")
    return value


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


def check_stack_inputs(stack, input_ids, inputs_embeds, check_ids: bool = True) -> tuple[str, torch.Tensor]:
    """Exactly one of a stack's ids and embeddings, well formed; returns it with the name the user passed it by
    (`stack.input_name`: the decoder's ids are the model's `decoder_input_ids`)."""
    embeds_name = stack.input_name.replace("input_ids", "inputs_embeds")
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError(f"Pass exactly one of `{stack.input_name}` and `{embeds_name}`.")
    if inputs_embeds is None:
        if check_ids:
            check_token_ids(input_ids, stack.input_name, stack.config.vocab_size, read_values=not stack.training)
        return stack.input_name, input_ids
    if inputs_embeds.dim() != 3 or inputs_embeds.shape[0] == 0 or inputs_embeds.shape[1] == 0 \
            or inputs_embeds.shape[2] != stack.config.d_model:
        raise ValueError(f"`{embeds_name}` must have shape (batch, length, d_model={stack.config.d_model}), "
                         f"got {tuple(inputs_embeds.shape)}.")
    return embeds_name, inputs_embeds


def check_encoder_inputs(encoder, input_ids, inputs_embeds, attention_mask):
    name, source = check_stack_inputs(encoder, input_ids, inputs_embeds)
    check_mask(attention_mask, "attention_mask", source, name)


def check_decoder_inputs(decoder, input_ids, inputs_embeds, encoder_hidden_states, encoder_attention_mask, cache,
                         check_ids: bool):
    """`cache`: the one the decoder will use, if any."""
    if encoder_hidden_states is None:
        raise ValueError("The decoder attends to the encoder's output: pass `encoder_hidden_states`.")
    if cache is not None and not isinstance(cache, EncoderDecoderCache):
        raise TypeError(f"`cache` (or `past_key_values`) must be an EncoderDecoderCache (self- and cross-attention), "
                        f"got {type(cache).__name__}.")
    target = check_stack_inputs(decoder, input_ids, inputs_embeds, check_ids)
    check_pairs("encoder_hidden_states", encoder_hidden_states, *target)
    check_mask(encoder_attention_mask, "encoder_attention_mask", encoder_hidden_states, "encoder_hidden_states")


def check_seq2seq_inputs(input_ids, inputs_embeds, encoder_outputs, attention_mask, decoder_input_ids,
                       decoder_inputs_embeds):
    """What encoder and decoder cannot check alone, with the names the user gave (the decoder knows others): a
    mask beside `encoder_outputs` passed in (their last hidden state, or None), and one source per target."""
    if encoder_outputs is not None:
        check_mask(attention_mask, "attention_mask", encoder_outputs, "encoder_outputs")
    target = given(decoder_input_ids=decoder_input_ids, decoder_inputs_embeds=decoder_inputs_embeds)
    if target[0] is not None:
        check_pairs(*given(encoder_outputs=encoder_outputs, input_ids=input_ids, inputs_embeds=inputs_embeds), *target)


def check_labels(labels, vocab_size: int, training: bool, *, input_ids, inputs_embeds, encoder_outputs,
                 decoder_input_ids, decoder_inputs_embeds, decoder_attention_mask):
    check_token_ids(labels, "labels", vocab_size, allow=-100, read_values=not training)
    target = given(decoder_input_ids=decoder_input_ids, decoder_inputs_embeds=decoder_inputs_embeds)
    if target[0] is None:  # the decoder's inputs come from `labels`: errors about them name `labels`
        source = given(encoder_outputs=None if encoder_outputs is None else encoder_outputs[0],
                       input_ids=input_ids, inputs_embeds=inputs_embeds)
        if source[0] is not None:
            check_pairs(*source, "labels", labels)
        check_mask(decoder_attention_mask, "decoder_attention_mask", labels, "labels")
    elif labels.shape != target[1].shape[:2]:
        raise ValueError(f"`labels` has shape {tuple(labels.shape)}, but `{target[0]}` has shape "
                         f"{tuple(target[1].shape)}: one label per decoder position.")


# §5.4 the label-smoothed loss -----------------------------------------------------------------------------------
# Timed against F.cross_entropy(label_smoothing=), forward and backward, on 2-core AMD EPYC and Intel Xeon CPUs:
# scripts/benchmarks/results/kernels_*.md.

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


# §6.1 decoding: the paper's length budget and GNMT's length penalty in generate() ----------------------------------

# Whether the beam search under way in this thread (or task) ranks by GNMT's penalty. generate() sets it for its own
# call only: a flag on the model would be shared by every thread decoding with it at the same time.
_GNMT_PENALTY = contextvars.ContextVar("gnmt_length_penalty", default=False)


class PaperDecodingMixin:
    """The model's generate() and beam-search hooks; it comes before `GenerationMixin` in the model's bases, whose
    methods these wrap."""

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
        token = _GNMT_PENALTY.set(penalty_type == "gnmt")
        try:
            return super().generate(inputs, generation_config, **kwargs)
        finally:
            _GNMT_PENALTY.reset(token)

    # transformers' beam search divides a hypothesis' log-probability by length ** length_penalty in these two
    # places. For the GNMT penalty we pass, for the length in question, the exponent e with
    # length ** e == ((5 + length) / 6) ** alpha, so the library's own code ranks by the paper's score.
    def _update_finished_beams(self, **kwargs):
        if _GNMT_PENALTY.get():
            length = kwargs["cur_len"] + 1 - kwargs["decoder_prompt_len"]
            kwargs["length_penalty"] = _gnmt_exponent(length, kwargs["length_penalty"])
        return super()._update_finished_beams(**kwargs)

    def _check_early_stop_heuristic(self, **kwargs):
        if _GNMT_PENALTY.get():
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


__all__ = ["CACHE_FIELD", "accepts_past_key_values", "check_int", "check_token_ids", "check_encoder_inputs", "check_decoder_inputs",
           "check_seq2seq_inputs", "check_labels", "label_smoothed_cross_entropy", "PaperDecodingMixin",
           "gnmt_length_penalty"]
