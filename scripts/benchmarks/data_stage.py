"""The data stage at WMT14's size: minutes and peak memory of each stage of `scripts/train.py` (read, vocabulary,
tokenize, plan, first step) and of the whole command, cold (an empty datasets cache) and warm (the same data, the
first run's vocabulary, a new output folder), at 0.45M and 4.5M pairs: Multi30k's training pairs repeated.

    python -m scripts.benchmarks.data_stage                       # 0.45M and 4.5M pairs, about 10 minutes on 2 cores
    python -m scripts.benchmarks.data_stage --pairs 100000        # a quick look

Each run is scripts/train.py's `run()` with the base preset, a 37,000-token vocabulary, 4,000-token batches and 2
steps, in a process of its own, timed stage by stage by `StageClock` (run's `on_stage_end`, and a Trainer callback
for the first step); its peak RSS is the largest of its processes (the main one or a tokenizing worker), as
`/usr/bin/time -v` reports it. The corpora and runs go to --work_dir (never into the repository: the data is for
research use only).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from transformers import TrainerCallback

from .toolkit import (MODEL_CODE, command_line, cpu_slug, environment, format_load, markdown_table, multi30k_missing,
                      write_report)

ROOT = Path(__file__).resolve().parents[2]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"
RESULTS = Path(__file__).with_name("results")
STAGES = ("read", "vocabulary", "tokenize", "plan", "first_step")
TRAIN_FLAGS = ["--preset", "base", "--vocab_size", "37000", "--max_tokens_per_batch", "4000", "--max_steps", "2",
               "--eval_strategy", "no", "--save_strategy", "no", "--report_to", "none", "--logging_steps", "1"]


def write_corpus(folder: Path, pairs: int) -> dict[str, Path]:
    """Multi30k's training pairs repeated to `pairs` lines, as train.en / train.de in `folder` (kept between runs)."""
    files = {lang: folder / f"train.{lang}" for lang in ("en", "de")}
    if not all(path.is_file() for path in files.values()):
        folder.mkdir(parents=True, exist_ok=True)
        for lang, path in files.items():
            lines = (MULTI30K / f"train.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)
            with open(path, "w", encoding="utf-8") as out:
                out.writelines(itertools.islice(itertools.cycle(lines), pairs))
    return files


class StageClock(TrainerCallback):
    """Seconds and peak memory (MiB, this process or its largest worker) at the end of each stage of a run, up to
    the first optimizer step."""

    def __init__(self):
        self.started = self.last = time.perf_counter()
        self.times: dict[str, dict[str, float]] = {}

    def stage(self, name: str):
        now = time.perf_counter()
        peak_kib = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        self.times[name] = {"seconds": round(now - self.last, 2), "peak_rss_mib": round(peak_kib / 1024)}
        logging.getLogger(__name__).warning("%s: %.1f s (%.1f s since the start), peak RSS %d MiB", name,
                                            now - self.last, now - self.started, peak_kib // 1024)
        self.last = now

    def on_step_end(self, args, state, control, **kwargs):
        if "first_step" not in self.times:
            self.stage("first_step")


def timed_training(argv: list[str]):
    """What scripts/train.py does with `argv`, its stages timed into OUTPUT_DIR/data_stage.json."""
    from vanilla_transformer.training import parse_training_args, run

    model_args, data, recipe, args = parse_training_args(argv)
    clock = StageClock()  # from where scripts/train.py's run() starts, as its stages are
    run(model_args, data, recipe, args, callbacks=[clock], on_stage_end=clock.stage)
    (Path(args.output_dir) / "data_stage.json").write_text(json.dumps(clock.times, indent=2))


def timed_run(files: dict[str, Path], output_dir: Path, cache: Path, extra: list[str]) -> dict:
    """scripts/train.py's run in a fresh process: its stage times, wall time and peak RSS."""
    flags = ["--output_dir", str(output_dir), "--train_source_file", str(files["en"]),
             "--train_target_file", str(files["de"]), *TRAIN_FLAGS, *extra]
    command = [sys.executable, "-c", "import sys; from scripts.benchmarks.data_stage import timed_training; "
               "timed_training(sys.argv[1:])", *flags]
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    log = output_dir.with_name(output_dir.name + ".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(log, "w") as stream:
        process = subprocess.Popen(command, env=env, stdout=stream, stderr=subprocess.STDOUT, cwd=ROOT)
        _, status, usage = os.wait4(process.pid, 0)  # this child's own rusage: its peak, or its largest worker's
    seconds = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(command)} failed (log: {log}):\n{log.read_text()[-4000:]}")
    stages = json.loads((output_dir / "data_stage.json").read_text())
    return {"seconds": round(seconds, 1), "peak_rss_mib": round(usage.ru_maxrss / 1024), "stages": stages,
            "command": " ".join(["timed_training:", "scripts/train.py", *flags])}


def measure(pairs: int, work_dir: Path) -> dict:
    files = write_corpus(work_dir / f"corpus_{pairs}", pairs)
    cache, runs = work_dir / f"cache_{pairs}", work_dir / f"runs_{pairs}"
    for folder in (cache, runs):
        shutil.rmtree(folder, ignore_errors=True)
    cold = timed_run(files, runs / "cold", cache, [])
    warm = timed_run(files, runs / "warm", cache, ["--tokenizer_name_or_path", str(runs / "cold")])
    return {"pairs": pairs, "cold": cold, "warm": warm}


def render(results: dict) -> str:
    rows = []
    for size in results["sizes"]:
        for kind in ("cold", "warm"):
            run = size[kind]
            cells = [f"{run['stages'][stage]['seconds']:.1f} s / {run['stages'][stage]['peak_rss_mib']:,}"
                     if stage in run["stages"] else "-" for stage in STAGES]
            rows.append([f"{size['pairs']:,}", kind, *cells, f"{run['seconds'] / 60:.2f} min",
                         f"{run['peak_rss_mib']:,} MiB"])
    env = results["environment"]
    return "\n".join([
        "# The data stage at WMT14's size", "",
        f"`{results['command']}` on {env['cpu']} ({env['cores_available']} cores), load average at the start "
        f"{format_load(env['load_average_at_start'])}. Each cell: seconds in that stage / peak RSS (MiB) so far.", "",
        *markdown_table(["pairs", "cache", *STAGES, "whole command", "peak RSS"], rows), ""])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, nargs="+", default=[450_000, 4_500_000])
    parser.add_argument("--work_dir", type=Path, default=ROOT / "runs" / "data_stage")
    parser.add_argument("--report", type=Path,
                        help="the report's path without suffix (default: scripts/benchmarks/results/data_stage_<cpu>)")
    args = parser.parse_args(argv)
    if (reason := multi30k_missing(MULTI30K)) is not None:
        parser.error(reason)
    results = {"command": command_line("data_stage", argv), "environment": environment(measures=("vanilla_transformer/data", "vanilla_transformer/training", *MODEL_CODE)),
               "sizes": [measure(pairs, args.work_dir) for pairs in args.pairs]}
    write_report(args.report or RESULTS / f"data_stage_{cpu_slug(results['environment'])}", results, render(results))
    print(render(results))
    return results


if __name__ == "__main__":
    main()
