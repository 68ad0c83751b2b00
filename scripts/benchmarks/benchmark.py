"""`make bench`: ours against `MarianMTModel` of the same shape and against itself without the key/value cache
(`generate(use_cache=False)`; the run: peers.py).

    python -m scripts.benchmarks.benchmark              # preset small, results into scripts/benchmarks/results/
    python -m scripts.benchmarks.benchmark --preset base --repeats 3
    python -m scripts.benchmarks.benchmark --bf16       # training under bf16 autocast (Trainer --bf16)
    python -m scripts.benchmarks.benchmark --quick      # seconds: checks the plumbing, numbers mean nothing
"""

import argparse
import dataclasses
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from vanilla_transformer.configuration_vanilla_transformer import PRESETS  # noqa: E402

from scripts.utils.reports import peer_report, write_report  # noqa: E402

from .peers import run_benchmark  # noqa: E402
from .workloads import BenchmarkSpec  # noqa: E402


def write_results(results: dict, output_dir: str | Path) -> dict[str, Path]:
    """results_<preset>[_bf16].json and its report, `peer_report`."""
    name = f"results_{results['spec']['preset']}{'_bf16' if results['spec'].get('bf16') else ''}"
    return write_report(Path(output_dir) / name, results, peer_report(results))


def main(argv=None):
    defaults = BenchmarkSpec()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None, help="model size (default: small)")
    for name in ("vocab_size", "batch_size", "source_length", "target_length", "generation_batch_size", "new_tokens",
                 "num_beams", "repeats", "threads"):  # what each means: BenchmarkSpec
        parser.add_argument(f"--{name}", type=int, help=f"BenchmarkSpec.{name} (default {getattr(defaults, name)})")
    parser.add_argument("--no_memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--bf16", action="store_true", default=None,
                        help="the training steps under bf16 autocast over float32 weights, as Trainer --bf16 runs them")
    parser.add_argument("--quick", action="store_true", help="tiny model and shapes, one repeat")
    parser.add_argument("--output_dir", type=Path, default=Path("scripts/benchmarks/results"))
    args = parser.parse_args(argv)
    overrides = {field.name: getattr(args, field.name) for field in dataclasses.fields(BenchmarkSpec)
                 if getattr(args, field.name, None) is not None}
    if args.no_memory:
        overrides["memory"] = False
    spec = BenchmarkSpec.quick(**overrides) if args.quick else BenchmarkSpec(**overrides)
    results = run_benchmark(spec)
    paths = write_results(results, args.output_dir)
    print(peer_report(results))
    print("wrote " + ", ".join(str(p) for p in paths.values()))


if __name__ == "__main__":
    main()
