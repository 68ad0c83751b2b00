"""Training throughput on this CPU in float32 and in bf16 autocast (what Trainer's --bf16 runs), ours and
`MarianMTModel` of the same shape, interleaved; and a bf16 against a float32 matmul, which says whether the
processor multiplies bf16 natively (AVX-512 BF16, AMX) or emulates it. Optionally the float32 step with another
activation dropout (`--compare_activation_dropout`) and under torch.compile (`--compile`, inductor), both models.

    python -m scripts.benchmarks.cpu_precision --compare_activation_dropout 0.1 --compile   # the Multi30k recipe
    python -m scripts.benchmarks.cpu_precision --repeats 2 --batch_size 16
"""

import argparse
import dataclasses
import shlex
import sys

import torch

from vanilla_transformer.training.arguments import native_bf16

from .toolkit import environment, markdown_table, time_interleaved, write_report
from .workloads import BenchmarkSpec, build_models, make_train_step, training_batch


def matmul_ms(dtype: torch.dtype, size: int = 1024, repeats: int = 3) -> float:
    a = torch.randn(size, size, dtype=dtype)
    times = time_interleaved({"matmul": lambda: a @ a}, repeats, warmup=1)["matmul"]
    return sorted(times)[len(times) // 2] * 1e3


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--vocab_size", type=int, default=6000)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--length", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--matmul_size", type=int, default=1024)
    # The dropouts results/cpu_precision.md was measured with: the Multi30k recipe's before its dropout went to 0.3.
    parser.add_argument("--dropout", type=float, default=0.2)
    parser.add_argument("--attention_dropout", type=float, default=0.1)
    parser.add_argument("--activation_dropout", type=float, default=0.0)
    parser.add_argument("--compare_activation_dropout", type=float, default=None,
                        help="also time the float32 step with this activation dropout")
    parser.add_argument("--compile", action="store_true", help="also time the float32 step under torch.compile")
    parser.add_argument("--output_dir", default="scripts/benchmarks/results")
    args = parser.parse_args(argv)
    dropouts = dict(dropout=args.dropout, attention_dropout=args.attention_dropout,
                    activation_dropout=args.activation_dropout)
    spec = BenchmarkSpec(preset=args.preset, vocab_size=args.vocab_size, batch_size=args.batch_size,
                         source_length=args.length, target_length=args.length, repeats=args.repeats, memory=False,
                         config_overrides=dropouts)
    torch.set_num_threads(spec.threads)
    models = build_models(spec)
    batch = training_batch(spec, models["ours"].config)
    target_tokens = int((batch["labels"] != -100).sum())
    steps = {f"{name} {label}": make_train_step(models[name], batch, autocast=dtype)
             for name in ("ours", "marian") for label, dtype in (("fp32", None), ("bf16", torch.bfloat16))}
    if args.compare_activation_dropout is not None:
        other = dataclasses.replace(spec, config_overrides={**dropouts,
                                                            "activation_dropout": args.compare_activation_dropout})
        for name, model in build_models(other).items():
            steps[f"{name} fp32, activation dropout {args.compare_activation_dropout:g}"] = make_train_step(model, batch)
    if args.compile:
        for name, model in build_models(spec).items():
            steps[f"{name} fp32, torch.compile"] = make_train_step(torch.compile(model), batch)
            steps[f"{name} fp32, torch.compile"]()  # compiled outside the timed repetitions
    times = time_interleaved(steps, spec.repeats, warmup=1)
    rows = {name: {"step_s": sorted(t)[len(t) // 2], "target_tokens_per_s": target_tokens / sorted(t)[len(t) // 2]}
            for name, t in times.items()}
    matmul = {"size": args.matmul_size, "fp32_ms": matmul_ms(torch.float32, args.matmul_size),
              "bf16_ms": matmul_ms(torch.bfloat16, args.matmul_size)}
    results = {"command": shlex.join(["python", "-m", "scripts.benchmarks.cpu_precision", *(argv or sys.argv[1:])]),
               "environment": environment(), "native_bf16": native_bf16(), "spec": vars(args),
               "target_tokens_per_step": target_tokens, "systems": rows, "matmul": matmul}
    lines = [f"# Training precision on this CPU ({results['environment']['cpu']}, {spec.threads} threads)", "",
             f"`{results['command']}`: preset `{args.preset}`, vocabulary {args.vocab_size:,}, {args.batch_size} "
             f"pairs of {args.length} tokens a side ({target_tokens:,} target tokens a step), median of "
             f"{spec.repeats} interleaved steps, dropout {args.dropout:g}, attention dropout {args.attention_dropout:g}, "
             f"activation dropout {args.activation_dropout:g} unless a row says otherwise. Native bf16 matrix "
             f"multiply: {'yes' if results['native_bf16'] else 'no'}.",
             ""]
    base = rows["ours fp32"]["step_s"]
    lines += markdown_table(["system", "step", "target tokens / s", "vs ours fp32"],
                            [[name, f"{row['step_s'] * 1e3:,.0f} ms", f"{row['target_tokens_per_s']:,.0f}",
                              f"{base / row['step_s']:.2f}x"] for name, row in rows.items()])
    lines += ["", f"A {args.matmul_size}³ matmul: float32 {matmul['fp32_ms']:.1f} ms, bf16 {matmul['bf16_ms']:.1f} ms "
                  f"({matmul['fp32_ms'] / matmul['bf16_ms']:.2f}x).", ""]
    paths = write_report(f"{args.output_dir}/cpu_precision", results, "\n".join(lines))
    print("\n".join(lines))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return results


if __name__ == "__main__":
    main()
