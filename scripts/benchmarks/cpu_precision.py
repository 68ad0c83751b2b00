"""Training throughput on this CPU in float32 and in bf16 autocast (what Trainer's --bf16 runs), ours and
`MarianMTModel` of the same shape, interleaved; and a bf16 against a float32 matmul, which says whether the
processor multiplies bf16 natively (AVX-512 BF16, AMX) or emulates it.

    python -m scripts.benchmarks.cpu_precision                 # the Multi30k recipe's shape; writes results/
    python -m scripts.benchmarks.cpu_precision --repeats 2 --batch_size 16
"""

import argparse
import shlex
import sys

import torch

from vanilla_transformer.training.arguments import native_bf16

from .toolkit import environment, time_interleaved, write_report
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
    parser.add_argument("--output_dir", default="scripts/benchmarks/results")
    args = parser.parse_args(argv)
    spec = BenchmarkSpec(preset=args.preset, vocab_size=args.vocab_size, batch_size=args.batch_size,
                         source_length=args.length, target_length=args.length, repeats=args.repeats, memory=False)
    torch.set_num_threads(spec.threads)
    models = build_models(spec)
    batch = training_batch(spec, models["ours"].config)
    target_tokens = int((batch["labels"] != -100).sum())
    steps = {f"{name} {label}": make_train_step(models[name], batch, autocast=dtype)
             for name in ("ours", "marian") for label, dtype in (("fp32", None), ("bf16", torch.bfloat16))}
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
             f"{spec.repeats} interleaved steps. Native bf16 matrix multiply: {'yes' if results['native_bf16'] else 'no'}.",
             "", "| system | step | target tokens / s | vs ours fp32 |", "| --- | --- | --- | --- |"]
    base = rows["ours fp32"]["step_s"]
    for name, row in rows.items():
        lines.append(f"| {name} | {row['step_s'] * 1e3:,.0f} ms | {row['target_tokens_per_s']:,.0f} | "
                     f"{base / row['step_s']:.2f}x |")
    lines += ["", f"A {args.matmul_size}³ matmul: float32 {matmul['fp32_ms']:.1f} ms, bf16 {matmul['bf16_ms']:.1f} ms "
                  f"({matmul['fp32_ms'] / matmul['bf16_ms']:.2f}x).", ""]
    paths = write_report(f"{args.output_dir}/cpu_precision", results, "\n".join(lines))
    print("\n".join(lines))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return results


if __name__ == "__main__":
    main()
