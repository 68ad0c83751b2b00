"""The data stage at WMT14's size: minutes and peak memory of each stage of scripts/train.py's `run()` (`STAGES`)
and of the whole command, cold (an empty datasets cache) and warm (the first run's vocabulary), each in a process of
its own, on Multi30k's training pairs repeated. The corpora and runs go to --work_dir, never into the repository:
the data is for research use only.

    python -m scripts.benchmarks.data_stage                       # 0.45M and 4.5M pairs, about 10 minutes on 2 cores
    python -m scripts.benchmarks.data_stage --pairs 100000        # a quick look
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

from scripts.utils.reports import data_stage_report, write_cpu_report

from .toolkit import MODEL_CODE, command_line, environment, multi30k_missing

ROOT = Path(__file__).resolve().parents[2]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"
STAGES = ("read", "vocabulary", "tokenize", "plan", "first_step")
TRAIN_FLAGS = ["--preset", "base", "--vocab_size", "37000", "--max_tokens_per_batch", "4000", "--max_steps", "2",
               "--eval_strategy", "no", "--save_strategy", "no", "--report_to", "none", "--logging_steps", "1"]


class StageClock(TrainerCallback):
    """Seconds and peak memory (MiB, this process or its largest worker) at the end of each stage of a run (`run()`'s
    `on_stage_end`), up to the first optimizer step."""

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
    """scripts/train.py's run in a fresh process: its stage times, wall time and peak RSS (of its largest process,
    as `/usr/bin/time -v` reports it)."""
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
    """Cold and warm runs on Multi30k's training pairs repeated to `pairs` lines (the corpus kept between runs)."""
    folder = work_dir / f"corpus_{pairs}"
    files = {lang: folder / f"train.{lang}" for lang in ("en", "de")}
    if not all(path.is_file() for path in files.values()):
        folder.mkdir(parents=True, exist_ok=True)
        for lang, path in files.items():
            lines = (MULTI30K / f"train.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)
            with open(path, "w", encoding="utf-8") as out:
                out.writelines(itertools.islice(itertools.cycle(lines), pairs))
    cache, runs = work_dir / f"cache_{pairs}", work_dir / f"runs_{pairs}"
    for folder in (cache, runs):
        shutil.rmtree(folder, ignore_errors=True)
    cold = timed_run(files, runs / "cold", cache, [])
    warm = timed_run(files, runs / "warm", cache, ["--tokenizer_name_or_path", str(runs / "cold")])
    return {"pairs": pairs, "cold": cold, "warm": warm}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, nargs="+", default=[450_000, 4_500_000])
    parser.add_argument("--work_dir", type=Path, default=ROOT / "runs" / "data_stage")
    parser.add_argument("--report", type=Path,
                        help="the report's path without suffix (default: scripts/benchmarks/results/data_stage_<cpu>)")
    args = parser.parse_args(argv)
    if (reason := multi30k_missing(MULTI30K)) is not None:
        parser.error(reason)
    measured = ("vanilla_transformer/data", "vanilla_transformer/training", *MODEL_CODE)
    results = {"command": command_line("data_stage", argv), "environment": environment(measures=measured),
               "sizes": [measure(pairs, args.work_dir) for pairs in args.pairs]}
    write_cpu_report("data_stage", args.report, results, data_stage_report(results))
    return results


if __name__ == "__main__":
    main()
