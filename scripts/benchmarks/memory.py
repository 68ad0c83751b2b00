"""Peak memory of a workload: the growth of the resident set above where it stood before, each system in a fresh
subprocess (`measure_memory`)."""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from .toolkit import offline_env
from .workloads import SYSTEMS, BenchmarkSpec, build_models, decoders, make_train_step, source_batch, training_batch

# Linux counts resident pages per thread in batches of up to 64 pages (256 KiB) before updating the process
# total, so peaks closer than this are a tie.
MEMORY_RESOLUTION_MIB = 1.0


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def peak_growth_mib(fn: Callable) -> float:
    """How far the resident set grows above where it stood before `fn`, at its highest, in MiB: Linux resets the
    high-water mark (VmHWM) when "5" is written to /proc/self/clear_refs. Run it where glibc returns freed blocks to
    the system (`measure_memory`), or memory freed earlier and reused would hide part of the peak."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
    before = _rss_kib("VmRSS")
    fn()
    # Linux batches per-thread RSS counters (up to 64 pages each), so a flat workload can read slightly negative.
    return max(0.0, (_rss_kib("VmHWM") - before) / 1024)


def memory_workloads(spec: BenchmarkSpec, system: str) -> dict[str, float]:
    """Peak growth of each workload of one system, each after a warm-up call (which creates AdamW's state: the
    measured step counts gradients, activations and temporaries)."""
    torch.set_num_threads(spec.threads)
    models = build_models(spec)
    if system != "marian":  # the uncached system decodes with ours
        del models["marian"]
    config, results = models["ours"].config, {}
    source = source_batch(spec, config, spec.generation_batch_size)
    if system != "uncached":
        step = make_train_step(models[system], training_batch(spec, config), autocast=spec.autocast)
        step()
        results["train"] = peak_growth_mib(step)
    for workload, beams in (("greedy", 1), ("beam", spec.num_beams)):
        run = decoders(models, source, beams)[system]
        run(new_tokens=min(2, spec.new_tokens))
        results[workload] = peak_growth_mib(lambda r=run: r(new_tokens=spec.new_tokens))
    return results


def memory_worker():
    """The measuring subprocess: a spec and systems as JSON on stdin, results as JSON on stdout."""
    request = json.loads(sys.stdin.read())
    spec = BenchmarkSpec(**request["spec"])
    print(json.dumps({system: memory_workloads(spec, system) for system in request["systems"]}))


def memory_method_available() -> bool:
    return os.access("/proc/self/clear_refs", os.W_OK) and os.path.exists("/proc/self/status")


def measure_memory(spec: BenchmarkSpec) -> dict[str, dict[str, float]]:
    """Peak resident-memory growth per workload and system, in MiB, each system in a fresh Python (one shared where
    `spec.isolate_memory` is off): glibc, told to map every block of 64 KiB or more and give it back on free, makes the
    resident set follow torch's CPU tensors, which neither `tracemalloc` nor torch counts."""
    if not memory_method_available():
        raise RuntimeError("Peak-memory measurement needs Linux's /proc/self/clear_refs and /proc/self/status.")
    env = offline_env(MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0", MALLOC_TOP_PAD_="0")
    groups = [[s] for s in SYSTEMS] if spec.isolate_memory else [list(SYSTEMS)]
    results = {}
    for group in groups:
        request = json.dumps({"spec": dataclasses.asdict(spec), "systems": group})
        code = "from scripts.benchmarks.memory import memory_worker; memory_worker()"
        done = subprocess.run([sys.executable, "-c", code], input=request, capture_output=True, text=True, env=env,
                              cwd=Path(__file__).resolve().parents[2])
        if done.returncode != 0:
            raise RuntimeError(f"The memory subprocess for {group} failed:\n{done.stderr[-4000:]}")
        results.update(json.loads(done.stdout.strip().splitlines()[-1]))
    return results
