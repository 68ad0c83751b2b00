"""Our loss kernel and a dropout candidate against torch's, forward and backward at a training step's shapes: the
model's `label_smoothed_cross_entropy` against `F.cross_entropy(label_smoothing=)` (on float32 logits, as ours
computes), and `packed_dropout` (below, not in the model) against `F.dropout`, which the model runs. The model runs one
of each on every device, so a kernel goes into it only where the measurements on CPUs and on the GPU favour it: this
command times them on this CPU, scripts/device_check.sh on a GPU (`compare_kernels`).

    python -m scripts.benchmarks.kernels       # the Multi30k recipe's shapes; results/kernels_<cpu>.{json,md}
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

from vanilla_transformer.data.corpora import available_cores
from vanilla_transformer.support_vanilla_transformer import label_smoothed_cross_entropy  # as the model imports it

from .toolkit import (command_line, cpu_slug, environment, format_load, load_average, markdown_table, time_interleaved,
                      write_report)


def packed_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout (§5.4) with a mask that costs a quarter of the random numbers of `F.dropout`, which draws one per
    element: each 64-bit random word gives four 16-bit ones, each kept with probability 1 - p (p rounded to
    1/65536), and the kept values scaled by 1 / (1 - p) as usual."""
    if not training or p == 0:
        return x
    words = torch.empty((x.numel() + 3) // 4, dtype=torch.int64, device=x.device).random_(-(2**63), 2**63 - 1)
    keep = words.view(torch.int16)[: x.numel()].view(x.shape) >= round(p * 65536) - 32768
    return torch.where(keep, x * (1 / (1 - p)), 0)


def compare_kernels(tokens: int, vocab_size: int, d_model: int, dropout: float, label_smoothing: float,
                    dtypes=(torch.float32, torch.bfloat16), device="cpu", repeats: int = 10) -> list[dict]:
    """Per dtype, the median milliseconds of forward + backward, ours and torch's: the loss over `tokens` rows of
    `vocab_size` logits, and dropout `dropout` on a (`tokens`, `d_model`) activation; with the two losses' gap."""
    generator = torch.Generator(device).manual_seed(0)
    rows = []
    for dtype in dtypes:
        logits = torch.randn(tokens, vocab_size, device=device, dtype=dtype, generator=generator).requires_grad_()
        labels = torch.randint(0, vocab_size, (tokens,), device=device, generator=generator)
        x = torch.randn(tokens, d_model, device=device, dtype=dtype, generator=generator).requires_grad_()
        losses = {"ours": lambda: label_smoothed_cross_entropy(logits, labels, label_smoothing),
                  "torch": lambda: F.cross_entropy(logits.float(), labels, label_smoothing=label_smoothing)}
        drops = {"ours": lambda: packed_dropout(x, dropout, True), "torch": lambda: F.dropout(x, dropout)}
        tasks = {f"loss {name}": (lambda f=f: torch.autograd.grad(f(), logits)) for name, f in losses.items()}
        tasks.update({f"dropout {name}": (lambda f=f: torch.autograd.grad(f(), x, torch.ones_like(x)))
                      for name, f in drops.items()})
        ms = {name: statistics.median(t) * 1e3 for name, t in time_interleaved(tasks, repeats, 2, device).items()}
        gap = abs(losses["ours"]() - losses["torch"]()).item()
        rows.append({"dtype": str(dtype).removeprefix("torch."), "loss_gap": gap,
                     **{f"{kernel}_{name}_ms": ms[f"{kernel} {name}"] for kernel in ("loss", "dropout")
                        for name in ("ours", "torch")}})
    return rows


def kernel_table(rows: list[dict]) -> list[str]:
    """Both kernels in each dtype: ours, torch's, and torch's time over ours (> 1: ours faster)."""
    return markdown_table(["kernel (forward + backward)", "dtype", "ours", "torch", "torch / ours"], [
        [kernel, row["dtype"], f"{row[f'{kernel}_ours_ms']:.2f} ms", f"{row[f'{kernel}_torch_ms']:.2f} ms",
         f"{row[f'{kernel}_torch_ms'] / row[f'{kernel}_ours_ms']:.2f}x"] for kernel in ("loss", "dropout")
        for row in rows])


def main(argv=None) -> dict:
    from scripts.recipes.multi30k_en_de import RECIPE
    from vanilla_transformer.configuration_vanilla_transformer import PRESETS
    from vanilla_transformer.training.run import parse_config_overrides

    overrides = parse_config_overrides(RECIPE["config_overrides"])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=RECIPE["max_tokens_per_batch"], help="target tokens a step")
    parser.add_argument("--vocab_size", type=int, default=RECIPE["vocab_size"])
    parser.add_argument("--d_model", type=int, default=PRESETS[RECIPE["preset"]]["d_model"])
    parser.add_argument("--dropout", type=float, default=overrides["dropout"])
    parser.add_argument("--label_smoothing", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: every core)")
    parser.add_argument("--output", default=None,
                        help="Report path without extension (default: scripts/benchmarks/results/kernels_<cpu>).")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads or available_cores())
    shapes = dict(tokens=args.tokens, vocab_size=args.vocab_size, d_model=args.d_model, dropout=args.dropout,
                  label_smoothing=args.label_smoothing)
    results = {"command": command_line("kernels", argv), "environment": environment(measures=("vanilla_transformer/support_vanilla_transformer.py",)), "shapes": shapes,
               "rows": compare_kernels(**shapes, repeats=args.repeats), "load_average_at_end": load_average()}
    env = results["environment"]
    loads = (env["load_average_at_start"], results["load_average_at_end"])
    lines = [f"# Loss and dropout kernels: ours against torch's ({env['cpu']}, {env['torch_threads']} threads)", "",
             f"`{results['command']}`: {args.tokens:,} tokens, vocabulary {args.vocab_size:,}, d_model {args.d_model}, "
             f"dropout {args.dropout:g}, label smoothing {args.label_smoothing:g}; medians of {args.repeats} "
             "interleaved repeats; load average (1/5/15 min) at the start and the end: "
             + ", ".join(format_load(load) for load in loads) + ".",
             "", *kernel_table(results["rows"]), ""]
    output = args.output or f"scripts/benchmarks/results/kernels_{cpu_slug(results['environment'])}"
    write_report(output, results, "\n".join(lines))
    print("\n".join(lines))
    return results


if __name__ == "__main__":
    main()
