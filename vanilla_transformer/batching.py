"""§5.1 token-based batching: "sentence pairs were batched together by approximate sequence length. Each
training batch contained a set of sentence pairs containing approximately 25000 source tokens and 25000
target tokens."

`TokenBucketBatchSampler` sorts the examples by length and cuts the sorted list greedily into batches
whose *padded* size stays within a token budget, the way fairseq's `--max-tokens` does:

    cost(batch) = len(batch) * max(longest source, longest target)   <=   max_tokens

This single number is the paper's two budgets at once: `n * max(S, T) <= B` holds exactly when both
padded tensors fit, `n * S <= B` (source) and `n * T <= B` (target). Padding counts because the collator
pads every row to the longest one and the model computes on the pads too. (A collator with
`pad_to_multiple_of` pads further than this cost counts.)

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

`python -m vanilla_transformer.batching` measures training throughput on Multi30k, token buckets against
random batches of the same mean size (scripts/results/batching_multi30k.md).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

logger = logging.getLogger(__name__)


def batch_cost(source_lengths: Sequence[int], target_lengths: Sequence[int]) -> int:
    """Padded tokens of the larger side: rows times the longest source or target, whichever is longer."""
    if len(source_lengths) == 0:
        return 0
    return len(source_lengths) * max(max(source_lengths), max(target_lengths))


def example_lengths(dataset) -> tuple[np.ndarray, np.ndarray]:
    """Token counts of `input_ids` and `labels` (both including </s>) for every example of a tokenized split."""
    try:
        import datasets
        import pyarrow.compute as pc

        if isinstance(dataset, datasets.Dataset):
            table = dataset.with_format("arrow")[:]
            return tuple(pc.list_value_length(table[column]).to_numpy(zero_copy_only=False).astype(np.int64)
                         for column in ("input_ids", "labels"))
    except ImportError:  # pragma: no cover - datasets is a dependency; plain torch datasets work without it
        pass
    pairs = [(len(example["input_ids"]), len(example["labels"])) for example in dataset]
    lengths = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    return lengths[:, 0], lengths[:, 1]


def _greedy_boundaries(source: np.ndarray, target: np.ndarray, max_tokens: int) -> list[tuple[int, int]]:
    """Cut examples (already in sorted order) into [start, end) runs whose cost stays within the budget."""
    longest = np.maximum(source, target)
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
                 shuffle: bool = True, seed: int = 0, num_replicas: int = 1, rank: int = 0):
        source = np.asarray(source_lengths, dtype=np.int64)
        target = np.asarray(target_lengths, dtype=np.int64)
        if source.ndim != 1 or source.shape != target.shape:
            raise ValueError(f"source_lengths and target_lengths must be two flat sequences of the same size, got "
                             f"shapes {source.shape} and {target.shape}.")
        if source.size == 0:
            raise ValueError("Cannot batch an empty dataset.")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}.")
        if not isinstance(num_replicas, int) or num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"Need num_replicas >= 1 and 0 <= rank < num_replicas, got {num_replicas=}, {rank=}.")
        self.source_lengths, self.target_lengths = source, target
        self.max_tokens = max_tokens
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0

        # Any permutation of equal (source, target) pairs sorts to the same length sequence, so the
        # boundaries computed once here hold for every epoch's tie-breaking.
        order = np.lexsort((target, source))
        boundaries = _greedy_boundaries(source[order], target[order], max_tokens)
        self._boundaries = _split_for_replicas(boundaries, num_replicas)
        self._num_repeated = -len(self._boundaries) % num_replicas

        over_budget = np.maximum(source, target) > max_tokens
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


def token_batch_train_dataloader(trainer, max_tokens: int) -> DataLoader:
    """Trainer's training DataLoader with a `TokenBucketBatchSampler` in place of the fixed-size batches.

    The same DataLoader settings as `Trainer._get_dataloader` (collator, workers, worker seeding), prepared
    by accelerate. The sampler is already rank-aware, so accelerate's `BatchSamplerShard` wrapper is made a
    pass-through, as Trainer does for its own rank-aware `BatchRebalanceSampler`.
    """
    import datasets
    from transformers.trainer_utils import seed_worker

    args = trainer.args
    dataset = trainer.train_dataset
    if dataset is None:
        raise ValueError("Trainer: training requires a train_dataset.")
    if isinstance(dataset, (torch.utils.data.IterableDataset, datasets.IterableDataset)):
        raise ValueError("Token-based batching needs every example's length up front; it does not work with "
                         "an iterable (streaming) training set.")
    collator = trainer.data_collator
    if isinstance(dataset, datasets.Dataset):
        dataset = trainer._remove_unused_columns(dataset, description="Training")
    else:
        collator = trainer._get_collator_with_removed_columns(collator, description="Training")
    if getattr(args, "train_sampling_strategy", "random") not in ("random", None):
        logger.warning("--train_sampling_strategy %s is ignored: --max_tokens_per_batch sets the batches.",
                       args.train_sampling_strategy)
    source, target = example_lengths(dataset)
    sampler = TokenBucketBatchSampler(
        source, target, max_tokens, seed=args.data_seed if args.data_seed is not None else args.seed,
        num_replicas=max(1, args.world_size), rank=args.process_index if args.world_size > 1 else 0,
    )
    loader = DataLoader(
        dataset, batch_sampler=sampler, collate_fn=collator, num_workers=args.dataloader_num_workers,
        pin_memory=args.dataloader_pin_memory, persistent_workers=args.dataloader_persistent_workers,
        multiprocessing_context=args.dataloader_multiprocessing_context,
        prefetch_factor=args.dataloader_prefetch_factor, in_order=args.dataloader_in_order,
        worker_init_fn=partial(seed_worker, num_workers=args.dataloader_num_workers, rank=args.process_index),
    )
    loader = trainer.accelerator.prepare(loader)
    wrapper = getattr(loader, "batch_sampler", None)
    if wrapper is not sampler and getattr(wrapper, "batch_sampler", None) is sampler:
        wrapper.num_processes, wrapper.process_index = 1, 0
        # A resumed run skips into its epoch through one more wrapper (accelerate's SkipBatchSampler), from
        # which Trainer reaches only this one: it must pass the epoch on, or the epoch replays epoch 0's order.
        wrapper.set_epoch = sampler.set_epoch
    return loader


def padding_stats(batches: Sequence[Sequence[int]], source_lengths, target_lengths) -> dict[str, float]:
    """Real and padded source+target tokens over `batches`, and the share of padded positions that are real."""
    source, target = np.asarray(source_lengths), np.asarray(target_lengths)
    real = padded = 0
    for batch in batches:
        s, t = source[list(batch)], target[list(batch)]
        real += int(s.sum() + t.sum())
        padded += len(batch) * int(s.max() + t.max())
    return {"real_tokens": real, "padded_tokens": padded, "efficiency": real / padded if padded else math.nan,
            "batches": len(batches), "mean_sentences": sum(map(len, batches)) / max(len(batches), 1)}


def random_batches(num_examples: int, batch_size: int, seed: int = 0) -> list[list[int]]:
    """Fixed-size batches of a random permutation: what Trainer's RandomSampler gives, for comparison."""
    order = np.random.default_rng(seed).permutation(num_examples).tolist()
    return [order[i:i + batch_size] for i in range(0, num_examples, batch_size)]


def measure_step_throughput(model, optimizer, streams: dict[str, list[dict]], warmup: int = 1) -> dict[str, dict]:
    """Real (non-pad) source + target tokens per second of full training steps (forward, backward, Adam).

    The streams are interleaved step by step, so that the load of a shared machine falls on all of them
    alike; the first `warmup` steps of each are run but not counted.
    """
    totals = {name: {"steps": 0, "sentences": 0, "real_tokens": 0, "padded_tokens": 0, "seconds": 0.0}
              for name in streams}
    model.train()
    for step, batches in enumerate(zip(*streams.values())):
        for name, batch in zip(streams, batches):
            start = time.perf_counter()
            model(**batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            seconds = time.perf_counter() - start
            if step < warmup:
                continue
            total = totals[name]
            total["steps"] += 1
            total["sentences"] += len(batch["input_ids"])
            total["real_tokens"] += int(batch["attention_mask"].sum() + (batch["labels"] != -100).sum())
            total["padded_tokens"] += batch["input_ids"].numel() + batch["labels"].numel()
            total["seconds"] += seconds
    for total in totals.values():
        total["real_tokens_per_second"] = total["real_tokens"] / total["seconds"]
        total["seconds_per_step"] = total["seconds"] / total["steps"]
    return totals


def benchmark_multi30k(data_dir, max_tokens: int = 2000, steps: int = 30, warmup: int = 2, preset: str = "small",
                       vocab_size: int = 8000, threads: int = 1, seed: int = 0) -> dict:
    """Token buckets vs random batches of the same mean sentence count, training steps on Multi30k en->de."""
    from transformers import DataCollatorForSeq2Seq, set_seed

    from .configuration_vanilla_transformer import VanillaTransformerConfig
    from .data import tokenize_parallel
    from .modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
    from .parity import load_multi30k, shared_tokenizer_for
    from .schedule import paper_adam

    torch.set_num_threads(threads)
    raw = load_multi30k(data_dir)
    tokenizer = shared_tokenizer_for(raw, vocab_size)
    train, _ = tokenize_parallel(raw["train"], tokenizer, "en", "de", 128, 128)
    source, target = example_lengths(train)
    buckets = TokenBucketBatchSampler(source, target, max_tokens, seed=seed).global_batches()
    batch_size = round(len(train) / len(buckets))  # the same mean number of sentences per batch
    shuffled = random_batches(len(train), batch_size, seed)
    epoch = {"token_buckets": padding_stats(buckets, source, target),
             "random": padding_stats(shuffled, source, target)}

    config = VanillaTransformerConfig.from_preset(preset, vocab_size=len(tokenizer))
    set_seed(seed)
    model = VanillaTransformerForConditionalGeneration(config)
    optimizer = paper_adam(model)
    for group in optimizer.param_groups:
        group["lr"] = 1e-4  # throughput only: a small constant rate keeps the weights sane
    collate = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    streams = {name: [collate([train[i] for i in batch]) for batch in batches[: steps + warmup]]
               for name, batches in (("token_buckets", buckets), ("random", shuffled))}
    measured = measure_step_throughput(model, optimizer, streams, warmup)
    ratio = measured["token_buckets"]["real_tokens_per_second"] / measured["random"]["real_tokens_per_second"]
    return {"max_tokens": max_tokens, "random_batch_size": batch_size, "steps": steps, "warmup": warmup,
            "preset": preset, "vocab_size": len(tokenizer), "threads": threads, "seed": seed,
            "train_examples": len(train), "epoch_padding": epoch, "measured": measured,
            "speedup_real_tokens_per_second": ratio, "torch": torch.__version__}


def write_benchmark(results: dict, output_prefix, command: str) -> None:
    prefix = Path(output_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{prefix}.json").write_text(json.dumps({"command": command, **results}, indent=2) + "\n")
    m, e = results["measured"], results["epoch_padding"]
    rows = "\n".join(
        f"| {name} | {m[name]['sentences'] / m[name]['steps']:.1f} | {e[name]['efficiency']:.1%} | "
        f"{m[name]['real_tokens'] / m[name]['padded_tokens']:.1%} | {m[name]['seconds_per_step']:.2f} | "
        f"{m[name]['real_tokens_per_second']:,.0f} |" for name in m)
    Path(f"{prefix}.md").write_text(f"""# Token-based batching on Multi30k en→de: throughput

`{command}`

Training steps (forward, backward, Adam) of the `{results['preset']}` preset, {results['threads']} thread(s), on a CPU
shared with other jobs. Token buckets: `TokenBucketBatchSampler(max_tokens={results['max_tokens']})`, cost =
sentences × max(longest source, longest target). Random: shuffled fixed-size batches of
{results['random_batch_size']} sentences, the token buckets' mean over the epoch. {results['steps']} measured steps
of each after {results['warmup']} warm-up steps, interleaved one by one so machine load hits both alike.

| batching | sentences / step | real / padded tokens (epoch) | real / padded (measured) | s / step | real tokens / s |
|---|---|---|---|---|---|
{rows}

**Real tokens per second, token buckets ÷ random: {results['speedup_real_tokens_per_second']:.2f}×.**
""")


def main(argv=None):
    """`python -m vanilla_transformer.batching`: the Multi30k throughput benchmark (skips without the data)."""
    import argparse
    import shlex
    import sys

    parser = argparse.ArgumentParser(description=benchmark_multi30k.__doc__)
    parser.add_argument("--data_dir", default="../shared/data/multi30k")
    parser.add_argument("--output", default="scripts/results/batching_multi30k", help="Writes OUTPUT.json and OUTPUT.md.")
    parser.add_argument("--max_tokens", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from .parity import multi30k_missing

    reason = multi30k_missing(args.data_dir)
    if reason:
        print(f"skipped: {reason}")
        return None
    results = benchmark_multi30k(args.data_dir, args.max_tokens, args.steps, args.warmup, args.preset,
                                 threads=args.threads, seed=args.seed)
    command = shlex.join(["python", "-m", "vanilla_transformer.batching", *(sys.argv[1:] if argv is None else argv)])
    write_benchmark(results, args.output, command)
    print(f"token buckets / random, real tokens per second: {results['speedup_real_tokens_per_second']:.2f}x")
    return results


__all__ = ["TokenBucketBatchSampler", "token_batch_train_dataloader", "example_lengths", "batch_cost",
           "padding_stats", "random_batches", "measure_step_throughput", "benchmark_multi30k"]


if __name__ == "__main__":
    main()
