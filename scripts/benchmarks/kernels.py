"""The model's loss kernel, `label_smoothed_cross_entropy`, against `F.cross_entropy(label_smoothing=)` on the same
float32 logits, forward and backward, at a training step's shapes; and the gap between the two losses. The model
runs one kernel on every device, so it keeps its own only where the CPUs and the GPU favour it: this command times
them on this CPU, scripts/device_check.sh on a GPU (`compare_kernels`).

    python -m scripts.benchmarks.kernels       # the Multi30k recipe's shapes; results/kernels_<cpu>.{json,md}
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

from vanilla_transformer.data.corpora import available_cores
from vanilla_transformer.support_vanilla_transformer import label_smoothed_cross_entropy  # as the model imports it

from scripts.utils.reports import kernels_report, write_cpu_report

from .toolkit import command_line, environment, load_average, time_interleaved


def compare_kernels(tokens: int, vocab_size: int, label_smoothing: float, dtypes=(torch.float32, torch.bfloat16),
                    device="cpu", repeats: int = 10) -> list[dict]:
    """Per dtype of the logits (`tokens` rows of `vocab_size`), the median milliseconds of the loss's forward +
    backward, ours and torch's, and the gap between the two losses."""
    generator = torch.Generator(device).manual_seed(0)
    rows = []
    for dtype in dtypes:
        logits = torch.randn(tokens, vocab_size, device=device, dtype=dtype, generator=generator).requires_grad_()
        labels = torch.randint(0, vocab_size, (tokens,), device=device, generator=generator)
        losses = {"ours": lambda: label_smoothed_cross_entropy(logits, labels, label_smoothing),
                  "torch": lambda: F.cross_entropy(logits.float(), labels, label_smoothing=label_smoothing)}
        tasks = {name: (lambda f=f: torch.autograd.grad(f(), logits)) for name, f in losses.items()}
        ms = {name: statistics.median(t) * 1e3 for name, t in time_interleaved(tasks, repeats, 2, device).items()}
        rows.append({"dtype": str(dtype).removeprefix("torch."),
                     "loss_gap": abs(losses["ours"]() - losses["torch"]()).item(),
                     "loss_ours_ms": ms["ours"], "loss_torch_ms": ms["torch"]})
    return rows


def main(argv=None) -> dict:
    from scripts.recipes.multi30k_en_de import RECIPE

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=RECIPE["max_tokens_per_batch"], help="target tokens a step")
    parser.add_argument("--vocab_size", type=int, default=RECIPE["vocab_size"])
    parser.add_argument("--label_smoothing", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: every core)")
    parser.add_argument("--output", default=None,
                        help="Report path without extension (default: scripts/benchmarks/results/kernels_<cpu>).")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads or available_cores())
    shapes = dict(tokens=args.tokens, vocab_size=args.vocab_size, label_smoothing=args.label_smoothing)
    env = environment(measures=("vanilla_transformer/support_vanilla_transformer.py",))
    results = {"command": command_line("kernels", argv), "environment": env, "shapes": shapes, "repeats": args.repeats,
               "rows": compare_kernels(**shapes, repeats=args.repeats), "load_average_at_end": load_average()}
    write_cpu_report("kernels", args.output, results, kernels_report(results))
    return results


if __name__ == "__main__":
    main()
