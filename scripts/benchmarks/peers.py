"""The benchmark run (`make bench`, and the device check's on a GPU): ours against `MarianMTModel` of the same shape
(the closest built-in peer: post-LN, sinusoidal positions, scaled shared embeddings; both with SDPA) and against
`generate(use_cache=False)` on our weights, doing the same work in one process, interleaved: a training step (also
compiled), greedy and beam decoding of a fixed length, and each workload's peak memory (`measure_memory`)."""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch

from .memory import MEMORY_RESOLUTION_MIB, measure_memory
from .toolkit import MODEL_CODE, environment, load_average, matmul_peak, time_interleaved
from .workloads import (SYSTEMS, BenchmarkSpec, build_models, decoders, parameter_counts, source_batch, token_counts,
                        training_batch, training_flops, training_steps)

# Slowest over fastest repeat of one system beyond which a run is reported as disturbed by other processes.
NOISY_SPREAD = 1.5
WORKLOADS = ("train", "greedy", "beam")


def _ratio(numerator, denominator):
    return None if numerator is None or denominator in (None, 0) else numerator / denominator


def run_benchmark(spec: BenchmarkSpec, log: Callable[[str], None] = print) -> dict:
    """Everything the benchmark reports, as one JSON-ready dict, on the spec's device."""
    torch.set_num_threads(spec.threads)
    device, started = torch.device(spec.device), time.perf_counter()
    models = build_models(spec)
    results = {"spec": dataclasses.asdict(spec), "environment": environment(device, measures=MODEL_CODE),
               "parameters": {name: parameter_counts(model) for name, model in models.items()}}
    log(f"threads: {torch.get_num_threads()}; parameters: {results['parameters']}")
    dtype = spec.autocast or torch.float32  # the precision the training step multiplies in: MFU's denominator
    peaks, phases, outputs = [matmul_peak(spec.matmul_size, device=device, dtype=dtype)["flops"]], {}, {}

    def phase(name, measure, *args):
        mark = time.perf_counter()
        results[name] = measure(*args)
        phases[name] = time.perf_counter() - mark

    batch = training_batch(spec, models["ours"].config)
    phase("train", training, models, batch, spec, log)
    if spec.compile_backend:
        log(f"compiling the training steps ({spec.compile_backend}) ...")
        phase("train_compiled", compiled_training,
              training_steps(models, batch, spec.compile_backend, autocast=spec.autocast), batch, spec)
        if results["train_compiled"]["errors"]:
            raise RuntimeError(f"training steps failed: {results['train_compiled']['errors']}")
    for workload, beams in (("greedy", 1), ("beam", spec.num_beams)):
        phase(workload, decoding, models, spec, workload, beams, outputs, log)
    results["checks"] = {
        "output_shapes": {f"{n}/{w}": list(out.shape) for (n, w), out in outputs.items()},
        "uncached_greedy_equals_ours": torch.equal(outputs["uncached", "greedy"], outputs["ours", "greedy"]),
        "uncached_beam_equals_ours": torch.equal(outputs["uncached", "beam"], outputs["ours", "beam"])}
    peaks.append(matmul_peak(spec.matmul_size, device=device, dtype=dtype)["flops"])
    results["matmul_peak"] = {"size": spec.matmul_size, "dtype": str(dtype).removeprefix("torch."),
                              "flops": max(peaks), "samples": peaks}
    train = results["train"]
    for system in train["systems"].values():  # model FLOPs count the batch's tokens; the padded ones what runs
        system["mfu"] = train["flops_per_step"] / system["median_s"] / max(peaks)
        system["matmul_utilisation"] = train["flops_per_step_padded"] / system["median_s"] / max(peaks)
    if spec.memory:
        log("measuring peak memory in subprocesses ...")
        phase("memory_mib", measure_memory, spec)
        results["memory_method"] = ("peak RSS growth over the RSS before the workload (VmHWM after resetting it via "
                                    "/proc/self/clear_refs), fresh process per system, glibc mmap threshold 64 KiB"
                                    + ("" if spec.isolate_memory else "; one process shared by all systems"))
    results.update(workloads=list(WORKLOADS), noisy_spread=NOISY_SPREAD, memory_resolution_mib=MEMORY_RESOLUTION_MIB)
    results["noisy"] = sorted(f"{w}/{n}" for w in WORKLOADS
                              for n, s in results[w]["systems"].items() if s["spread"] > NOISY_SPREAD)
    results["ratios"] = ratios(results)
    results["paired_ratios"] = paired_ratios(results)
    results["verdicts"] = verdicts(results)
    results["environment"]["load_average_at_end"] = load_average()
    results["elapsed_s"], results["phase_s"] = time.perf_counter() - started, phases
    return results


def training(models: dict, batch: dict, spec: BenchmarkSpec, log: Callable[[str], None]) -> dict:
    """The training step of each model, interleaved, and its model FLOPs (of the batch's tokens, and padded)."""
    log("timing the training step ...")
    target_tokens = token_counts(batch)[1]
    steps = training_steps(models, batch, autocast=spec.autocast)
    systems = summarize(time_interleaved(steps, spec.repeats, spec.warmup, spec.device), target_tokens)
    config, shape = models["ours"].config, (*batch["input_ids"].shape, batch["labels"].shape[1])
    return {"systems": systems, "target_tokens": target_tokens,
            "flops_per_step": training_flops(config, *shape, True, *token_counts(batch)),
            "flops_per_step_padded": training_flops(config, *shape),
            "shape": {"batch": spec.batch_size, "source": shape[1], "target": shape[2]}}


def time_steps(steps: dict[str, Callable[[], float]], batch: dict, spec: BenchmarkSpec) -> dict:
    """Training steps interleaved, each one's first call (its compilation) timed apart as `compile_s`; a step whose
    first call fails (inductor without a C compiler, say) is left out, its error in `errors`."""
    losses, first, errors = {name: [] for name in steps}, {}, {}
    recorded = {name: (lambda n=name, step=step: losses[n].append(step())) for name, step in steps.items()}
    for name, step in recorded.items():
        try:
            first[name] = time_interleaved({name: step}, 1, 0, spec.device)[name][0]
        except Exception as error:  # noqa: BLE001 - recorded; the other systems still run
            errors[name] = f"{type(error).__name__}: {error}"[:1000]
    timed = summarize(time_interleaved({name: recorded[name] for name in first}, spec.repeats, spec.warmup,
                                       spec.device), token_counts(batch)[1])
    for name, system in timed.items():
        system.update(compile_s=first[name], loss_finite=all(map(math.isfinite, losses[name])))
    return {"systems": timed, "errors": errors}


def compiled_training(steps: dict[str, Callable[[], float]], batch: dict, spec: BenchmarkSpec) -> dict:
    """Eager and compiled steps (`time_steps`) and the speed-ups, None where a system is missing."""
    timed = time_steps(steps, batch, spec)
    median = {name: system["median_s"] for name, system in timed["systems"].items()}
    return {"backend": spec.compile_backend, **timed,
            "compiled_speed_vs_eager": {n: _ratio(median.get(f"{n}_eager"), median.get(f"{n}_compiled"))
                                        for n in ("ours", "marian")},
            "compiled_speed_vs_marian_compiled": _ratio(median.get("marian_compiled"), median.get("ours_compiled")),
            "eager_speed_vs_marian_eager": _ratio(median.get("marian_eager"), median.get("ours_eager"))}


def decoding(models: dict, spec: BenchmarkSpec, workload: str, beams: int, outputs: dict,
             log: Callable[[str], None]) -> dict:
    """Fixed-length decoding by every system, interleaved (each system's output kept in `outputs`)."""
    log(f"timing {workload} decoding ...")
    runs = decoders(models, source_batch(spec, models["ours"].config, spec.generation_batch_size), beams)
    tasks = {name: partial(lambda n: outputs.__setitem__((n, workload), runs[n](new_tokens=spec.new_tokens)), name)
             for name in SYSTEMS}
    systems = summarize(time_interleaved(tasks, spec.repeats, spec.warmup, spec.device),
                        spec.generation_batch_size * spec.new_tokens)
    return {"systems": systems, "num_beams": beams, "new_tokens": spec.new_tokens, "batch": spec.generation_batch_size}


def ratios(results: dict) -> dict:
    """Ours over each peer, of the medians: throughput (> 1: ours faster) and peak memory (< 1: ours smaller)."""
    out = {}
    for workload in WORKLOADS:
        systems = results[workload]["systems"]
        for peer in ("marian", "uncached"):
            if peer in systems:
                out[f"{workload}_speed_vs_{peer}"] = systems[peer]["median_s"] / systems["ours"]["median_s"]
        memory = results.get("memory_mib", {})
        for peer in ("marian", "uncached"):
            if workload in memory.get(peer, {}) and workload in memory.get("ours", {}):
                out[f"{workload}_memory_vs_{peer}"] = _ratio(memory["ours"][workload], memory[peer][workload])
    return out


def paired_ratios(results: dict) -> dict:
    """Ours over Marian per repetition (back to back, under the same load): their median and quartiles, steadier than
    a ratio of medians when the load drifts during the run."""
    out = {}
    for workload in WORKLOADS:
        systems = results[workload]["systems"]
        pairs = sorted(m / o for m, o in zip(systems["marian"]["times_s"], systems["ours"]["times_s"]))
        quartiles = statistics.quantiles(pairs, n=4) if len(pairs) > 1 else pairs * 3
        out[f"{workload}_speed_vs_marian"] = {"median": statistics.median(pairs), "q1": quartiles[0],
                                              "q3": quartiles[2]}
    return out


def verdicts(results: dict) -> dict:
    """Each ratio and what it says: "faster" or "slower" only where the median and the paired quartiles (where
    measured) fall on one side of 1, else "level" (the noise could make it); memory within its resolution too."""
    out = {}
    for name, value in results["ratios"].items():
        if "_memory_vs_" in name:
            workload, peer = name.split("_memory_vs_")
            difference = results["memory_mib"]["ours"][workload] - results["memory_mib"][peer][workload]
            verdict = "level" if abs(difference) <= MEMORY_RESOLUTION_MIB else "smaller" if difference < 0 else "larger"
        else:
            paired = results.get("paired_ratios", {}).get(name)
            estimates = [value, *([paired["q1"], paired["q3"]] if paired else [])]
            sides = {estimate > 1 for estimate in estimates if estimate != 1}
            verdict = "faster" if sides == {True} else "slower" if sides == {False} else "level"
        out[name] = {"value": value, "verdict": verdict}
    return out


def summarize(times: dict[str, list[float]], work: float) -> dict[str, dict]:
    """Median seconds and `work` units (tokens) per second for each system."""
    return {name: {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts), "spread": max(ts) / min(ts),
                   "times_s": ts, "throughput": work / statistics.median(ts)} for name, ts in times.items()}
