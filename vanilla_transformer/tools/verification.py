"""A converter or exporter proves what it wrote, on the user's own checkpoint: the source model and its conversion
score one fixed random batch, and a difference above the tolerance refuses the result before it is written.

The test suite proves the mappings on the settings it covers; this check covers the one checkpoint a user
actually converts, with whatever settings it has.
"""

import copy
from contextlib import contextmanager

import torch

VERIFY_ATOL = 1e-4


class VerificationError(ValueError):
    """A conversion or export does not compute the model's function; nothing was written."""


def verification_batch(config, max_positions: int | None = None, batch_size: int = 4, seed: int = 0,
                       num_tokens: int | None = None):
    """A fixed random batch for `config`'s vocabulary (its first `num_tokens` ids, e.g. those a tokenizer has):
    sources of different lengths (right-padded, with their attention mask) and decoder inputs that start from
    the first decoder token. No special ids inside the sentences, and no sequence longer than `max_positions`."""
    generator = torch.Generator().manual_seed(seed)
    special = {config.pad_token_id, config.bos_token_id, config.eos_token_id, config.decoder_start_token_id}
    ordinary = torch.tensor([i for i in range(num_tokens or config.vocab_size) if i not in special])
    source_length = min(12, max_positions or 12)
    target_length = min(9, (max_positions or 10) - 1)
    input_ids = ordinary[torch.randint(len(ordinary), (batch_size, source_length), generator=generator)]
    attention_mask = torch.ones_like(input_ids)
    for row in range(1, batch_size):
        keep = max(1, source_length - 3 * row)
        attention_mask[row, keep:] = 0
        input_ids[row, keep:] = config.pad_token_id
    targets = ordinary[torch.randint(len(ordinary), (batch_size, target_length), generator=generator)]
    first = config.decoder_start_token_id if config.decoder_start_token_id is not None else config.bos_token_id
    decoder_input_ids = torch.cat([torch.full((batch_size, 1), first), targets], dim=1)
    return input_ids, attention_mask, decoder_input_ids


@contextmanager
def float32_reference(model: torch.nn.Module):
    """`model` in float32 on the CPU and in eval mode, without gradients, for the length of the block: the model
    itself where it already is so (its training mode restored after), else a copy. Conversions and exports are
    built in float32 on the CPU, so that is where they are compared."""
    reference = model if model.dtype == torch.float32 and model.device.type == "cpu" else \
        copy.deepcopy(model).to("cpu", torch.float32)
    was_training = reference.training
    reference.eval()
    try:
        with torch.no_grad():
            yield reference
    finally:
        reference.train(was_training)


def check_close(expected: torch.Tensor, actual: torch.Tensor, what: str, atol: float = VERIFY_ATOL,
                how_to_skip: str = "verify=False") -> float:
    """The largest |expected - actual|; VerificationError naming it (and where) when above `atol` or not finite."""
    difference = (expected.double() - actual.double()).abs()
    largest = difference.max()
    if not bool(largest <= atol):  # NaN compares false, so it is refused too
        where = tuple(int(i) for i in torch.nonzero(difference == largest)[0]) if largest == largest else "NaN"
        raise VerificationError(
            f"{what} differ from the model's by up to {float(largest):.3g} (at index {where}), more than the "
            f"tolerance {atol:g}, on a fixed random batch: the result would not compute this model, so nothing was "
            f"written. Please report it with the checkpoint's config.json ({how_to_skip} writes it anyway).")
    return float(largest)


__all__ = ["VERIFY_ATOL", "VerificationError", "verification_batch", "float32_reference", "check_close"]
