"""§5.1 token-based batching: "sentence pairs were batched together by approximate sequence length. Each
training batch contained a set of sentence pairs containing approximately 25000 source tokens and 25000
target tokens."

`TokenBucketBatchSampler` sorts the examples by length and cuts the sorted list greedily into batches
whose *padded* size stays within a token budget, the way fairseq's `--max-tokens` does:

    cost(batch) = len(batch) * round_up(max(longest source, longest target), pad_to_multiple_of)   <=   max_tokens

This single number is the paper's two budgets at once: `n * max(S, T) <= B` holds exactly when both
padded tensors fit, `n * S <= B` (source) and `n * T <= B` (target). Padding counts because the collator
pads every row to the longest one (rounded up to `pad_to_multiple_of`) and the model computes on the pads too.

Shapes: rounding the lengths up to a multiple (`scripts/train.py --pad_to_multiple_of 8`; the default, 1, pads to
the longest row only) leaves a compiled model a handful of batch shapes instead of one per length. Under the same
budget it costs real tokens: on Multi30k, 2,000-token batches hold 16% fewer real tokens with a multiple of 8.
The sampler reads the multiple from the collator (`TranslationDataCollator.pad_to_multiple_of`), so the
budget counts exactly the padding the collator adds.

- Budget unit: per device and per micro-batch, like `--per_device_train_batch_size` and fairseq's
  `--max-tokens`. The paper's 25k tokens per optimizer step are `max_tokens * world_size *
  gradient_accumulation_steps`.
- Over-long examples: an example costing more than the budget on its own gets a batch to itself (with a
  warning at construction). Nothing is dropped: the length filter of `data.tokenize_parallel` is where
  examples are removed, and it reports what it removes.
- Epochs: examples are shuffled with a generator seeded by (seed, epoch) before a stable sort on
  (source length, target length), so equal-length pairs trade places between batches, and the batch order
  is shuffled too; `set_epoch` picks the epoch. The batch *boundaries* depend only on the multiset of
  lengths, so the number of batches is the same in every epoch: `len()` is exact, which Trainer relies on
  (it reads `len(train_dataloader)` once to count update steps per epoch and `max_steps`).
- DDP: every rank builds the same batches and takes every `num_replicas`-th one, so the shares are
  disjoint. To give every rank the same number of batches without dropping or repeating examples, the
  largest batches (by sentence count) are split in two, at most `num_replicas - 1` times, until the count
  divides by `num_replicas`; halves stay within the budget. Only if every batch already holds a single
  example are batches repeated instead (from the start of the epoch's order) to fill the last round.

With Trainer (`PaperTrainer(max_tokens_per_batch=...)`, `scripts/train.py --max_tokens_per_batch N`):
`len(train_dataloader)` is this rank's batch count, so an epoch is ceil(len / gradient_accumulation_steps)
update steps (the last one takes the remainder) and `--num_train_epochs` / `--max_steps` keep their meaning.
`num_items_in_batch` keeps its meaning too: it counts the non-(-100) labels of all micro-batches of one
optimizer step (summed over ranks with `average_tokens_across_devices`), so the model's summed loss is
divided by the step's real target-token count however unequal the batches are in sentences.
`--per_device_train_batch_size` is ignored for training when a token budget is set (Trainer still prints it
in "Total train batch size", which then means nothing), and so are `--dataloader_drop_last` and
`--train_sampling_strategy`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Sampler
from transformers import DataCollatorForSeq2Seq

from ..modeling_vanilla_transformer import check_token_ids
from ..support_vanilla_transformer import check_int

logger = logging.getLogger(__name__)


def round_up(length, multiple: int):
    """`length` (an int or an array) rounded up to a multiple of `multiple`."""
    return -(-length // multiple) * multiple


def batch_cost(source_lengths: Sequence[int], target_lengths: Sequence[int], pad_to_multiple_of: int = 1) -> int:
    """Padded tokens of the larger side: rows times the longest source or target, whichever is longer, rounded
    up as the collator pads it."""
    if len(source_lengths) == 0:
        return 0
    return len(source_lengths) * round_up(max(max(source_lengths), max(target_lengths)), pad_to_multiple_of)


def example_lengths(dataset) -> tuple[np.ndarray, np.ndarray]:
    """Token counts of `input_ids` and `labels` (both including </s>) for every example of a tokenized split; for a
    datasets.Dataset read from the Arrow list offsets alone (zero-copy unless the split has an index mapping)."""
    try:
        import datasets
        import pyarrow.compute as pc

        if isinstance(dataset, datasets.Dataset):
            table = dataset.select_columns(["input_ids", "labels"]).with_format("arrow")[:]
            return tuple(pc.list_value_length(table[column]).to_numpy(zero_copy_only=False).astype(np.int64)
                         for column in ("input_ids", "labels"))
    except ImportError:  # pragma: no cover - datasets is a dependency; plain torch datasets work without it
        pass
    pairs = [(len(example["input_ids"]), len(example["labels"])) for example in dataset]
    lengths = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    return lengths[:, 0], lengths[:, 1]


def _greedy_boundaries(source: np.ndarray, target: np.ndarray, max_tokens: int,
                       pad_to_multiple_of: int) -> list[tuple[int, int]]:
    """Cut examples (already in sorted order) into [start, end) runs whose cost stays within the budget."""
    longest = round_up(np.maximum(source, target), pad_to_multiple_of)
    boundaries, start, width = [], 0, 0
    for i, length in enumerate(longest.tolist()):
        new_width = max(width, length)
        if i > start and (i - start + 1) * new_width > max_tokens:
            boundaries.append((start, i))
            start, new_width = i, length
        width = new_width
    if start < len(longest):
        boundaries.append((start, len(longest)))
    return boundaries


def _split_for_replicas(boundaries: list[tuple[int, int]], num_replicas: int) -> list[tuple[int, int]]:
    """Split the largest batches in two until their count divides by `num_replicas` (or nothing can be split)."""
    boundaries = list(boundaries)
    while len(boundaries) % num_replicas:
        largest = max(range(len(boundaries)), key=lambda b: boundaries[b][1] - boundaries[b][0])
        start, end = boundaries[largest]
        if end - start < 2:
            break
        middle = (start + end) // 2
        boundaries[largest:largest + 1] = [(start, middle), (middle, end)]
    return boundaries


class TokenBucketBatchSampler(Sampler[list[int]]):
    """Batches of similar-length examples whose padded size stays within `max_tokens` (see the module docstring).

    Yields lists of dataset indices, this rank's share only; pass it as `DataLoader(batch_sampler=...)`.
    """

    def __init__(self, source_lengths: Sequence[int], target_lengths: Sequence[int], max_tokens: int, *,
                 shuffle: bool = True, seed: int = 0, num_replicas: int = 1, rank: int = 0,
                 pad_to_multiple_of: int = 1):
        source = np.asarray(source_lengths, dtype=np.int64)
        target = np.asarray(target_lengths, dtype=np.int64)
        if source.ndim != 1 or source.shape != target.shape:
            raise ValueError(f"source_lengths and target_lengths must be two flat sequences of the same size, got "
                             f"shapes {source.shape} and {target.shape}.")
        if source.size == 0:
            raise ValueError("`source_lengths` is empty: there are no examples to batch.")
        check_int("max_tokens", max_tokens)
        check_int("pad_to_multiple_of", pad_to_multiple_of)
        check_int("num_replicas", num_replicas)
        check_int("rank", rank, at_least=0)
        if rank >= num_replicas:
            raise ValueError(f"rank must be below num_replicas, got {rank=}, {num_replicas=}.")
        self.source_lengths, self.target_lengths = source, target
        self.max_tokens = max_tokens
        self.pad_to_multiple_of = pad_to_multiple_of
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0

        # Any permutation of equal (source, target) pairs sorts to the same length sequence, so the
        # boundaries computed once here hold for every epoch's tie-breaking.
        order = np.lexsort((target, source))
        boundaries = _greedy_boundaries(source[order], target[order], max_tokens, pad_to_multiple_of)
        self._boundaries = _split_for_replicas(boundaries, num_replicas)
        self._num_repeated = -len(self._boundaries) % num_replicas

        over_budget = round_up(np.maximum(source, target), pad_to_multiple_of) > max_tokens
        if over_budget.any():
            logger.warning(
                "%d of %d examples are longer than max_tokens=%d on their own (longest: %d tokens); each gets a "
                "batch to itself.", int(over_budget.sum()), source.size, max_tokens,
                int(np.maximum(source, target).max()))
        if self._num_repeated:
            logger.warning("Only %d batches for %d ranks: %d batches are repeated so every rank gets the same "
                           "number.", len(self._boundaries), num_replicas, self._num_repeated)

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for `epoch` (Trainer calls this at the start of every epoch)."""
        self.epoch = epoch

    def global_batches(self, epoch: int | None = None) -> list[list[int]]:
        """All ranks' batches of `epoch` (default: the current one), in order; rank r takes every r-th."""
        epoch = self.epoch if epoch is None else epoch
        rng = np.random.default_rng([self.seed, epoch])
        n = self.source_lengths.size
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        # Stable sort: equal-length pairs keep the shuffled order, so they land in different batches each epoch.
        order = order[np.lexsort((self.target_lengths[order], self.source_lengths[order]))]
        batches = [order[start:end].tolist() for start, end in self._boundaries]
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches + batches[: self._num_repeated]

    def __iter__(self) -> Iterator[list[int]]:
        yield from self.global_batches()[self.rank::self.num_replicas]

    def __len__(self) -> int:
        return (len(self._boundaries) + self._num_repeated) // self.num_replicas


@dataclass(frozen=True)
class TokenBatchPlan:
    """How a run reaches its tokens per optimizer step: a per-device budget, times the processes, times the
    micro-batches accumulated per step."""

    tokens_per_step: int  # asked for: real (non-pad) tokens per step, the mean of the source and target sides
    world_size: int
    max_tokens_per_batch: int  # per device and micro-batch, padding included (the sampler's budget)
    gradient_accumulation_steps: int
    expected_source_tokens: float  # per optimizer step, on the data the plan was made for
    expected_target_tokens: float

    def __str__(self) -> str:
        return (f"{self.max_tokens_per_batch} padded tokens per device batch x {self.world_size} processes x "
                f"{self.gradient_accumulation_steps} accumulation steps: about {self.expected_source_tokens:.0f} "
                f"source + {self.expected_target_tokens:.0f} target tokens per optimizer step (asked for "
                f"{self.tokens_per_step})")


def _real_tokens_per_step(source, target, budget, world_size, accumulation, pad_to_multiple_of):
    sampler = TokenBucketBatchSampler(source, target, budget, shuffle=False, num_replicas=world_size,
                                      pad_to_multiple_of=pad_to_multiple_of)
    steps = len(sampler) / accumulation
    return source.sum() / steps, target.sum() / steps


def plan_token_batches(tokens_per_step: int, world_size: int, max_tokens_per_device: int,
                       source_lengths: Sequence[int], target_lengths: Sequence[int],
                       pad_to_multiple_of: int = 1) -> TokenBatchPlan:
    """The per-device budget and accumulation that give `tokens_per_step` real tokens per optimizer step (§5.1:
    "approximately 25000 source tokens and 25000 target tokens") with `world_size` processes.

    A budget counts padded tokens of the longer side, so a batch holds fewer real ones: the plan measures that
    fill on the data's own lengths (batching them as the sampler will) and raises the budget to make up for it.
    Devices hold at most `max_tokens_per_device` per micro-batch; beyond that the plan accumulates."""
    for name, value in (("tokens_per_step", tokens_per_step), ("world_size", world_size),
                        ("max_tokens_per_device", max_tokens_per_device)):
        check_int(name, value)
    source = np.asarray(source_lengths, dtype=np.int64)
    target = np.asarray(target_lengths, dtype=np.int64)
    accumulation = -(-tokens_per_step // (world_size * max_tokens_per_device))
    budget = tokens_per_step // (world_size * accumulation)
    for _ in range(4):  # the fill changes a little with the budget: a few fixed-point rounds settle it
        if budget < 1:
            raise ValueError(f"tokens_per_step={tokens_per_step} (--tokens_per_step) cannot be shared by world_size="
                             f"{world_size} processes with at least one token each.")
        real = _real_tokens_per_step(source, target, budget, world_size, accumulation, pad_to_multiple_of)
        wanted = int(budget * tokens_per_step / ((real[0] + real[1]) / 2))
        if wanted > max_tokens_per_device:
            accumulation += 1
            wanted = budget * (accumulation - 1) // accumulation
        if wanted == budget:
            break
        budget = wanted
    real = _real_tokens_per_step(source, target, budget, world_size, accumulation, pad_to_multiple_of)
    return TokenBatchPlan(tokens_per_step, world_size, budget, accumulation, float(real[0]), float(real[1]))


@dataclass
class TranslationDataCollator(DataCollatorForSeq2Seq):
    """`DataCollatorForSeq2Seq` that checks every id of the batch against the model's vocabulary while the batch is
    still on the CPU. In training the model itself reads no ids back (on an accelerator that would wait for the
    device every step), so this is where a bad id is caught, with its value, instead of a CUDA device-side assert."""

    def __call__(self, features, return_tensors=None):
        batch = super().__call__(features, return_tensors)
        vocab_size = self.model.config.vocab_size if self.model is not None else len(self.tokenizer)
        for name in ("input_ids", "labels", "decoder_input_ids"):  # labels first: decoder ids are made from them
            if name in batch:
                check_token_ids(torch.as_tensor(batch[name]), name, vocab_size,
                                allow=self.label_pad_token_id if name == "labels" else None)
        return batch


__all__ = ["TokenBucketBatchSampler", "TranslationDataCollator", "TokenBatchPlan", "plan_token_batches",
           "example_lengths", "batch_cost", "round_up"]
