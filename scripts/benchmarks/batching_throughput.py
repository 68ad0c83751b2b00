"""§5.1 token-based batching, measured: real (non-pad) tokens per second of training steps on Multi30k en->de
with `TokenBucketBatchSampler` against random fixed-size batches of the same mean size.

    python -m scripts.benchmarks.batching_throughput     # writes scripts/benchmarks/results/batching_multi30k.*
"""

import argparse
import math
from collections.abc import Sequence
from functools import partial

import numpy as np
import torch
from transformers import DataCollatorForSeq2Seq, set_seed

from vanilla_transformer.configuration_vanilla_transformer import VanillaTransformerConfig
from vanilla_transformer.data.batching import TokenBucketBatchSampler, example_lengths
from vanilla_transformer.data.corpora import tokenize_parallel
from vanilla_transformer.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.training.schedule import paper_adam

from .toolkit import (command_line, load_multi30k, markdown_table, multi30k_missing, shared_tokenizer_for,
                      time_interleaved, write_report)


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
    """Real (non-pad) source + target tokens per second of full training steps (forward, backward, Adam), the streams
    interleaved step by step (`time_interleaved`), so that the load of a shared machine falls on all of them alike;
    the first `warmup` steps of each are run but not counted."""
    def step(batches):
        model(**next(batches)).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    model.train()
    steps = min(map(len, streams.values())) - warmup
    times = time_interleaved({name: partial(step, iter(batches)) for name, batches in streams.items()}, steps, warmup)
    totals = {}
    for name, batches in streams.items():
        counted, seconds = batches[warmup:warmup + steps], sum(times[name])
        real = sum(int(b["attention_mask"].sum() + (b["labels"] != -100).sum()) for b in counted)
        totals[name] = {"steps": steps, "sentences": sum(len(b["input_ids"]) for b in counted), "real_tokens": real,
                        "padded_tokens": sum(b["input_ids"].numel() + b["labels"].numel() for b in counted),
                        "seconds": seconds, "real_tokens_per_second": real / seconds,
                        "seconds_per_step": seconds / steps}
    return totals


def benchmark_multi30k(data_dir, max_tokens: int = 2000, steps: int = 30, warmup: int = 2, preset: str = "small",
                       vocab_size: int = 8000, threads: int = 1, seed: int = 0) -> dict:
    """Token buckets vs random batches of the same mean sentence count, training steps on Multi30k en->de."""
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
    m, e = results["measured"], results["epoch_padding"]
    rows = "\n".join(markdown_table(
        ["batching", "sentences / step", "real / padded tokens (epoch)", "real / padded (measured)", "s / step",
         "real tokens / s"],
        [[name, f"{m[name]['sentences'] / m[name]['steps']:.1f}", f"{e[name]['efficiency']:.1%}",
          f"{m[name]['real_tokens'] / m[name]['padded_tokens']:.1%}", f"{m[name]['seconds_per_step']:.2f}",
          f"{m[name]['real_tokens_per_second']:,.0f}"] for name in m]))
    markdown = f"""# Token-based batching on Multi30k en→de: throughput

`{command}`

Training steps (forward, backward, Adam) of the `{results['preset']}` preset, {results['threads']} thread(s), on a CPU
shared with other jobs. Token buckets: `TokenBucketBatchSampler(max_tokens={results['max_tokens']})`, cost =
sentences × max(longest source, longest target). Random: shuffled fixed-size batches of
{results['random_batch_size']} sentences, the token buckets' mean over the epoch. {results['steps']} measured steps
of each after {results['warmup']} warm-up steps, interleaved one by one so machine load hits both alike.

{rows}

**Real tokens per second, token buckets ÷ random: {results['speedup_real_tokens_per_second']:.2f}×.**
"""
    write_report(output_prefix, {"command": command, **results}, markdown)


def main(argv=None):
    """The Multi30k throughput benchmark (skips without the data)."""
    parser = argparse.ArgumentParser(description=benchmark_multi30k.__doc__)
    parser.add_argument("--data_dir", default="../shared/data/multi30k")
    parser.add_argument("--output", default="scripts/benchmarks/results/batching_multi30k",
                        help="Writes OUTPUT.json and OUTPUT.md.")
    parser.add_argument("--max_tokens", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    reason = multi30k_missing(args.data_dir)
    if reason:
        print(f"skipped: {reason}")
        return None
    results = benchmark_multi30k(args.data_dir, args.max_tokens, args.steps, args.warmup, args.preset,
                                 threads=args.threads, seed=args.seed)
    write_benchmark(results, args.output, command_line("batching_throughput", argv))
    print(f"token buckets / random, real tokens per second: {results['speedup_real_tokens_per_second']:.2f}x")
    return results


if __name__ == "__main__":
    main()
