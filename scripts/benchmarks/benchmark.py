"""Benchmark ours against Marian (same shape) and a textbook no-cache decoder (`make bench`); see peers.py (the run), workloads.py, floors.py, memory.py, report.py.

    python -m scripts.benchmarks.benchmark              # preset small, results into scripts/benchmarks/results/
    python -m scripts.benchmarks.benchmark --preset base --repeats 3
    python -m scripts.benchmarks.benchmark --quick      # seconds: checks the plumbing, numbers mean nothing
    python -m scripts.benchmarks.benchmark --profile --threads 1   # operator and Python profiles of ours vs Marian
    python -m scripts.benchmarks.benchmark --render scripts/benchmarks/results/results_small.json   # re-render only
"""

import argparse
import dataclasses
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from .peers import run_benchmark, verdicts  # noqa: E402
from .profiling import profile_ours  # noqa: E402
from .report import render_markdown, write_results  # noqa: E402
from .workloads import BenchmarkSpec  # noqa: E402

from vanilla_transformer.configuration_vanilla_transformer import PRESETS  # noqa: E402


def main(argv=None):
    defaults = BenchmarkSpec()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None, help="model size (default: small)")
    parser.add_argument("--vocab_size", type=int, help="default: 8000 for small, 37000 for base")
    parser.add_argument("--batch_size", type=int, help=f"training batch (default {defaults.batch_size})")
    parser.add_argument("--source_length", type=int, help=f"longest source (default {defaults.source_length})")
    parser.add_argument("--target_length", type=int, help=f"longest training target (default {defaults.target_length})")
    parser.add_argument("--generation_batch_size", type=int,
                        help=f"sentences per decoding call (default {defaults.generation_batch_size})")
    parser.add_argument("--new_tokens", type=int, help=f"tokens decoded per sentence (default {defaults.new_tokens})")
    parser.add_argument("--num_beams", type=int, help=f"default {defaults.num_beams}")
    parser.add_argument("--curve_lengths", type=int, nargs="+", help="output lengths of the beam-vs-textbook curve")
    parser.add_argument("--curve_batch_size", type=int, help=f"default {defaults.curve_batch_size}")
    parser.add_argument("--repeats", type=int, help=f"timed repeats per system (default {defaults.repeats})")
    parser.add_argument("--threads", type=int, help="torch threads (default: all available cores)")
    parser.add_argument("--no_memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--quick", action="store_true", help="tiny model and shapes, one repeat")
    parser.add_argument("--profile", action="store_true", help="profile ours (training step, beam search) and exit")
    parser.add_argument("--output_dir", type=Path, default=Path("scripts/benchmarks/results"))
    parser.add_argument("--render", type=Path, metavar="RESULTS_JSON",
                        help="rewrite the markdown and chart of a saved run beside it (verdicts recomputed)")
    args = parser.parse_args(argv)
    if args.render:
        results = json.loads(args.render.read_text())
        results["verdicts"] = verdicts(results)
        paths = write_results(results, args.render.parent)
        print("wrote " + ", ".join(str(p) for p in paths.values()))
        return

    overrides = {field.name: getattr(args, field.name) for field in dataclasses.fields(BenchmarkSpec)
                 if getattr(args, field.name, None) is not None}
    if args.no_memory:
        overrides["memory"] = False
    spec = BenchmarkSpec.quick(**overrides) if args.quick else BenchmarkSpec(**overrides)

    if args.profile:
        args.output_dir.mkdir(parents=True, exist_ok=True)
        path = args.output_dir / f"profile_{spec.preset}.txt"
        path.write_text(profile_ours(spec))
        print(f"wrote {path}")
        return
    results = run_benchmark(spec)
    paths = write_results(results, args.output_dir)
    print(render_markdown(results))
    print("wrote " + ", ".join(str(p) for p in paths.values()))


if __name__ == "__main__":
    main()
