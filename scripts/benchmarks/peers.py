"""The benchmark run (`make bench`, and the device check's run on a GPU): ours against `MarianMTModel` of the same
shape (the closest built-in peer: post-LN, sinusoidal positions, scaled shared embeddings; both with SDPA) and
against `TextbookDecoder` (the tutorials' decoding without a cache, on our weights), doing the same work in one
process, interleaved: a training step (also under torch.compile), greedy and beam decoding of a fixed length, beam
search against the textbook decoder as the output grows, and each workload's peak memory (`measure_memory`).

Each speed ratio comes with its ceiling on the machine at hand, from floors timed in the same run (floors.py): what
the unavoidable kernels of a workload cost, so that a peer's time over them bounds what any implementation could
gain over that peer. scripts/benchmarks/README.md gives the method and the latest figures.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch

from .floors import (AttentionFloor, ProjectionFloor, TrainingFloor, decoding_flops, generation_split, token_counts,
                     training_flops)
from .memory import MEMORY_RESOLUTION_MIB, measure_memory
from .toolkit import environment, load_average, matmul_peak, time_interleaved
from .workloads import (SYSTEMS, BenchmarkSpec, TextbookDecoder, build_models, first_steps, generate_fixed_length,
                        parameter_counts, source_batch, training_batch, training_steps)

# Slowest over fastest repeat of one system beyond which a run is reported as disturbed by other processes.
NOISY_SPREAD = 1.5


def _ratio(numerator, denominator):
    return None if numerator is None or denominator in (None, 0) else numerator / denominator


def run_benchmark(spec: BenchmarkSpec, log: Callable[[str], None] = print) -> dict:
    """Everything the benchmark reports, as one JSON-ready dict, on the spec's device."""
    torch.set_num_threads(spec.threads)
    device, started = torch.device(spec.device), time.perf_counter()
    models = build_models(spec)
    results = {"spec": dataclasses.asdict(spec), "environment": environment(device),
               "parameters": {name: parameter_counts(model) for name, model in models.items()}}
    log(f"threads: {torch.get_num_threads()}; parameters: {results['parameters']}")
    peaks, phases, outputs = [matmul_peak(spec.matmul_size, device=device)["flops"]], {}, {}

    def phase(name, measure, *args):
        mark = time.perf_counter()
        results[name] = measure(*args)
        phases[name] = time.perf_counter() - mark

    batch = training_batch(spec, models["ours"].config)
    phase("train", training, models, batch, spec, log)
    if spec.compile_backend:
        phase("train_compiled", compiled_training, models, batch, spec, log)
    for workload, beams in (("greedy", 1), ("beam", spec.num_beams)):
        phase(workload, decoding, models, spec, workload, beams, outputs, log)
    results["checks"] = {
        "output_shapes": {f"{n}/{w}": list(out.shape) for (n, w), out in outputs.items()},
        "textbook_greedy_equals_ours": torch.equal(outputs["textbook", "greedy"], outputs["ours", "greedy"]),
        "textbook_beam_equals_ours": torch.equal(outputs["textbook", "beam"], outputs["ours", "beam"])}
    phase("beam_curve", beam_curve, models["ours"], spec, log)
    peaks.append(matmul_peak(spec.matmul_size, device=device)["flops"])
    results["matmul_peak"] = {"size": spec.matmul_size, "flops": max(peaks), "samples": peaks}
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
    results["noisy"] = sorted(f"{w}/{n}" for w in ("train", "greedy", "beam")
                              for n, s in results[w]["systems"].items() if s["spread"] > NOISY_SPREAD)
    results["ratios"] = ratios(results)
    results["ratios_from_fastest_repeats"] = ratios(results, "min_s")
    results["paired_ratios"] = paired_ratios(results)
    results["verdicts"] = verdicts(results)
    results["environment"]["load_average_at_end"] = load_average()
    results["elapsed_s"], results["phase_s"] = time.perf_counter() - started, phases
    return results


def training(models: dict, batch: dict, spec: BenchmarkSpec, log: Callable[[str], None]) -> dict:
    """The training step of each model and the training floor (`TrainingFloor`), interleaved."""
    log("timing the training step ...")
    steps = {**training_steps(models, batch), "floor": TrainingFloor(models["ours"], batch)}
    target_tokens = token_counts(batch)[1]
    systems = summarize(time_interleaved(steps, spec.repeats, spec.warmup, spec.device), target_tokens)
    floor = systems.pop("floor")
    config, shape = models["ours"].config, (*batch["input_ids"].shape, batch["labels"].shape[1])
    return {"systems": systems, "target_tokens": target_tokens,
            "flops_per_step": training_flops(config, *shape, True, *token_counts(batch)),
            "flops_per_step_padded": training_flops(config, *shape), "floor": floor,
            "ceiling_vs_marian": systems["marian"]["median_s"] / floor["median_s"],
            "shape": {"batch": spec.batch_size, "source": shape[1], "target": shape[2]}}


def compiled_training(models: dict, batch: dict, spec: BenchmarkSpec, log: Callable[[str], None]) -> dict:
    """The training step eager and under torch.compile, each model, interleaved; each compiled step's first call
    (its compilation) is timed apart and kept out of the medians."""
    steps = training_steps(models, batch, spec.compile_backend)
    log(f"compiling the training steps ({spec.compile_backend}) ...")
    first, errors = first_steps(steps, spec.device)
    if errors:
        raise RuntimeError(f"training steps failed: {errors}")
    log("timing the training step, eager vs compiled ...")
    timed = summarize(time_interleaved(steps, spec.repeats, spec.warmup, spec.device), token_counts(batch)[1])
    median = {name: system["median_s"] for name, system in timed.items()}
    return {"backend": spec.compile_backend, "systems": timed,
            "compile_s": {name: first[f"{name}_compiled"] for name in models},
            "compiled_speed_vs_eager": {n: median[f"{n}_eager"] / median[f"{n}_compiled"] for n in models},
            "compiled_speed_vs_marian_compiled": median["marian_compiled"] / median["ours_compiled"]}


def decoding(models: dict, spec: BenchmarkSpec, workload: str, beams: int, outputs: dict,
             log: Callable[[str], None]) -> dict:
    """Fixed-length decoding by every system with the projection and attention floors, interleaved (each system's
    output kept in `outputs`), and, apart, the share of generate() that is its loop (`generation_split`)."""
    log(f"timing {workload} decoding ...")
    ours = models["ours"]
    source = source_batch(spec, ours.config, spec.generation_batch_size)
    runs = {name: partial(generate_fixed_length, model, **source, new_tokens=spec.new_tokens, num_beams=beams)
            for name, model in models.items()}
    runs["textbook"] = partial(TextbookDecoder(ours).decode, **source, new_tokens=spec.new_tokens, num_beams=beams)
    tasks = {name: partial(lambda n: outputs.__setitem__((n, workload), runs[n]()), name) for name in SYSTEMS}
    tasks["attention_floor"] = AttentionFloor(ours, runs["ours"])
    tasks["floor"] = ProjectionFloor(ours, spec.generation_batch_size, source["input_ids"].shape[1], spec.new_tokens,
                                     beams, int(source["attention_mask"].sum()))
    systems = summarize(time_interleaved(tasks, spec.repeats, spec.warmup, spec.device),
                        spec.generation_batch_size * spec.new_tokens)
    split = {name: generation_split(model, runs[name], min(spec.repeats, 3)) for name, model in models.items()}
    floor, attention = systems["floor"]["median_s"], systems["attention_floor"]["median_s"]
    marian, loop = systems["marian"]["median_s"], min(s["loop_s"] for s in split.values())
    return {"systems": {n: systems[n] for n in SYSTEMS}, "projection_floor": systems["floor"],
            "attention_floor": systems["attention_floor"], "num_beams": beams, "new_tokens": spec.new_tokens,
            "batch": spec.generation_batch_size, "generation_split": split, "ceiling_vs_marian": marian / floor,
            # The most a model could gain through generate(): its matmuls, its attention and the loop's time.
            "ceiling_through_generate": marian / (floor + attention + loop)}


def beam_curve(ours, spec: BenchmarkSpec, log: Callable[[str], None]) -> dict:
    """Our beam search against the textbook decoder's at each of `spec.curve_lengths` output tokens, with the floors
    and generate()'s loop at each."""
    source = source_batch(spec, ours.config, spec.curve_batch_size, seed=spec.seed + 3)
    width, source_tokens = source["input_ids"].shape[1], int(source["attention_mask"].sum())
    textbook = TextbookDecoder(ours)
    points = []
    for length in spec.curve_lengths:
        log(f"timing beam-{spec.num_beams} vs textbook at {length} tokens ...")
        run = partial(generate_fixed_length, ours, **source, new_tokens=length, num_beams=spec.num_beams)
        tasks = {"ours": run, "textbook": partial(textbook.beam, **source, new_tokens=length, num_beams=spec.num_beams),
                 "floor": ProjectionFloor(ours, spec.curve_batch_size, width, length, spec.num_beams, source_tokens),
                 "attention_floor": AttentionFloor(ours, run)}
        # No warm-up: the decoding workloads before already ran both code paths.
        t = {n: statistics.median(ts) for n, ts in time_interleaved(tasks, spec.curve_repeats, 0, spec.device).items()}
        loop = generation_split(ours, run, spec.curve_repeats)["loop_s"]
        shape = (ours.config, spec.curve_batch_size, width, length, spec.num_beams)
        points.append({"new_tokens": length, "ours_s": t["ours"], "textbook_s": t["textbook"],
                       "speedup": t["textbook"] / t["ours"], "projection_floor_s": t["floor"],
                       "attention_floor_s": t["attention_floor"], "generate_loop_s": loop,
                       # The most a cached decoder could gain here: no time beyond its projections (then its
                       # attention and generate()'s loop).
                       "ceiling": t["textbook"] / t["floor"],
                       "ceiling_through_generate": t["textbook"] / (t["floor"] + t["attention_floor"] + loop),
                       # What a cache saves in arithmetic.
                       "flop_ratio": decoding_flops(*shape, cached=False, source_tokens=source_tokens)
                                     / decoding_flops(*shape, source_tokens=source_tokens)})
    return {"batch": spec.curve_batch_size, "num_beams": spec.num_beams, "repeats": spec.curve_repeats,
            "points": points}



def ratios(results: dict, statistic: str = "median_s") -> dict:
    """Ours over each peer: throughput (> 1: ours faster) and peak memory (< 1: ours smaller). Speed ratios use
    the median repeat; `statistic="min_s"` gives them from the fastest repeats, the least disturbed ones."""
    out = {}
    for workload in ("train", "greedy", "beam"):
        systems = results[workload]["systems"]
        for peer in ("marian", "textbook"):
            if peer in systems:
                out[f"{workload}_speed_vs_{peer}"] = systems[peer][statistic] / systems["ours"][statistic]
        memory = results.get("memory_mib", {})
        for peer in ("marian", "textbook"):
            if workload in memory.get(peer, {}) and workload in memory.get("ours", {}):
                out[f"{workload}_memory_vs_{peer}"] = _ratio(memory["ours"][workload], memory[peer][workload])
    for point in results["beam_curve"]["points"]:
        out[f"beam_speed_vs_textbook_at_{point['new_tokens']}"] = point["speedup"]
    return out


def paired_ratios(results: dict) -> dict:
    """Ours over Marian per repetition (both ran back to back in it, under the same machine load): the median
    and quartiles of those ratios, steadier than a ratio of medians when the load drifts during the run."""
    out = {}
    for workload in ("train", "greedy", "beam"):
        systems = results[workload]["systems"]
        pairs = sorted(m / o for m, o in zip(systems["marian"]["times_s"], systems["ours"]["times_s"]))
        quartiles = statistics.quantiles(pairs, n=4) if len(pairs) > 1 else pairs * 3
        out[f"{workload}_speed_vs_marian"] = {"median": statistics.median(pairs), "q1": quartiles[0],
                                              "q3": quartiles[2]}
    return out


def verdicts(results: dict) -> dict:
    """Each ratio of ours to a peer, its ceiling where measured, and what it says: ours "faster" or "slower" only
    where the median, the fastest repeats and the paired quartiles (where measured) all fall on one side of 1,
    else "level" (a difference the machine's noise could make); memory within its resolution is "level" too."""
    out, ceiling = {}, ceilings(results)
    for name, value in results["ratios"].items():
        if "_memory_vs_" in name:
            workload, peer = name.split("_memory_vs_")
            difference = results["memory_mib"]["ours"][workload] - results["memory_mib"][peer][workload]
            verdict = "level" if abs(difference) <= MEMORY_RESOLUTION_MIB else "smaller" if difference < 0 else "larger"
        else:
            estimates = [value, results.get("ratios_from_fastest_repeats", {}).get(name)]
            paired = results.get("paired_ratios", {}).get(name)
            estimates += [paired["q1"], paired["q3"]] if paired else []
            sides = {estimate > 1 for estimate in estimates if estimate is not None and estimate != 1}
            verdict = "faster" if sides == {True} else "slower" if sides == {False} else "level"
        out[name] = {"value": value, "verdict": verdict, "ceiling": ceiling.get(name)}
    return out


def ceilings(results: dict) -> dict:
    """For each speed ratio against a peer, the most any implementation could reach on this machine, as measured:
    training, if the step took no time beyond its matmuls and the AdamW update (`TrainingFloor`); decoding
    through generate(), if the model took no time beyond its projections and its attention (the projection and
    attention floors) and generate() no more than its measured loop, against Marian and against the textbook
    decoder."""
    out = {"train_speed_vs_marian": results["train"]["ceiling_vs_marian"]}
    for workload in ("greedy", "beam"):
        out[f"{workload}_speed_vs_marian"] = results[workload]["ceiling_through_generate"]
    for point in results["beam_curve"]["points"]:
        out[f"beam_speed_vs_textbook_at_{point['new_tokens']}"] = point["ceiling_through_generate"]
    return out


def summarize(times: dict[str, list[float]], work: float) -> dict[str, dict]:
    """Median seconds and `work` units (tokens) per second for each system."""
    return {
        name: {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts), "spread": max(ts) / min(ts),
               "times_s": ts, "throughput": work / statistics.median(ts)}
        for name, ts in times.items()
    }
