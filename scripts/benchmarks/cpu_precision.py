"""Training throughput on this CPU in float32 and in bf16 autocast (what Trainer's --bf16 runs), ours and
`MarianMTModel` of the same shape, interleaved; and a bf16 against a float32 matmul, which says whether the
processor multiplies bf16 natively (AVX-512 BF16, AMX) or emulates it. Optionally the float32 step with another
activation dropout (`--compare_activation_dropout`) and under torch.compile (`--compile`, inductor), both models.

    python -m scripts.benchmarks.cpu_precision --compare_activation_dropout 0.1 --compile   # the Multi30k recipe
    python -m scripts.benchmarks.cpu_precision --repeats 2 --batch_size 16
"""

import argparse
import dataclasses

import torch

from vanilla_transformer.training.precision import native_bf16

from .peers import time_steps
from .toolkit import command_line, environment, markdown_table, matmul_peak, write_report
from .workloads import BenchmarkSpec, build_models, token_counts, training_batch, training_steps


def parse_args(argv):
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
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    dropouts = dict(dropout=args.dropout, attention_dropout=args.attention_dropout,
                    activation_dropout=args.activation_dropout)
    spec = BenchmarkSpec(preset=args.preset, vocab_size=args.vocab_size, batch_size=args.batch_size,
                         source_length=args.length, target_length=args.length, repeats=args.repeats, warmup=0,
                         memory=False, config_overrides=dropouts)
    torch.set_num_threads(spec.threads)
    models = build_models(spec)
    batch = training_batch(spec, models["ours"].config)
    steps = {f"{name} {label}": step for label, dtype in (("fp32", None), ("bf16", torch.bfloat16))
             for name, step in training_steps(models, batch, autocast=dtype).items()}
    if args.compare_activation_dropout is not None:
        other = {**dropouts, "activation_dropout": args.compare_activation_dropout}
        steps.update({f"{name} fp32, activation dropout {args.compare_activation_dropout:g}": step for name, step in
                      training_steps(build_models(dataclasses.replace(spec, config_overrides=other)), batch).items()})
    if args.compile:
        compiled = training_steps(build_models(spec), batch, "inductor")
        steps.update({f"{name.removesuffix('_compiled')} fp32, torch.compile": compiled[name] for name in compiled
                      if name.endswith("_compiled")})
    timed, target_tokens = time_steps(steps, batch, spec), token_counts(batch)[1]  # compiling in the first steps
    if timed["errors"]:
        raise RuntimeError(f"training steps failed: {timed['errors']}")
    rows = {name: {"step_s": t["median_s"], "target_tokens_per_s": t["throughput"]}
            for name, t in timed["systems"].items()}
    flops = {name: matmul_peak(args.matmul_size, 3, dtype=dtype)["median_flops"]
             for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
    matmul = {"size": args.matmul_size, **{f"{name}_ms": 2e3 * args.matmul_size**3 / f for name, f in flops.items()}}
    results = {"command": command_line("cpu_precision", argv), "environment": environment(),
               "native_bf16": native_bf16(), "spec": vars(args), "target_tokens_per_step": target_tokens,
               "systems": rows, "matmul": matmul}
    lines = [f"# Training precision on this CPU ({results['environment']['cpu']}, {spec.threads} threads)", "",
             f"`{results['command']}`: preset `{args.preset}`, vocabulary {args.vocab_size:,}, {args.batch_size} "
             f"pairs of {args.length} tokens a side ({target_tokens:,} target tokens a step), median of "
             f"{spec.repeats} interleaved steps, dropout {args.dropout:g}, attention dropout "
             f"{args.attention_dropout:g}, activation dropout {args.activation_dropout:g} unless a row says otherwise. "
             f"Native bf16 matrix multiply: {'yes' if results['native_bf16'] else 'no'}.", "",
             *markdown_table(["system", "step", "target tokens / s", "vs ours fp32"],
                             [[name, f"{row['step_s'] * 1e3:,.0f} ms", f"{row['target_tokens_per_s']:,.0f}",
                               f"{rows['ours fp32']['step_s'] / row['step_s']:.2f}x"] for name, row in rows.items()]),
             "", f"A {args.matmul_size}³ matmul: float32 {matmul['fp32_ms']:.1f} ms, bf16 {matmul['bf16_ms']:.1f} ms "
             f"({matmul['fp32_ms'] / matmul['bf16_ms']:.2f}x).", ""]
    paths = write_report(f"{args.output_dir}/cpu_precision", results, "\n".join(lines))
    print("\n".join(lines))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return results


if __name__ == "__main__":
    main()
