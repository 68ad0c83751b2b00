"""The benchmark run: speed and memory of our Transformer against its closest built-in peer and against a textbook decoder.

Three systems do the same work in one process, interleaved (each repetition runs every system, alternating
their order), so machine noise falls on all of them alike:

* ``ours``: `VanillaTransformerForConditionalGeneration` with transformers' `generate()` and its key/value cache;
* ``marian``: `transformers.MarianMTModel` configured to the same shape (the closest built-in peer: a post-LN
  encoder-decoder with sinusoidal positions, scaled and shared embeddings); both use SDPA attention;
* ``textbook``: `TextbookDecoder`, decoding as the tutorials do (the Annotated Transformer's `greedy_decode`):
  the source is encoded once, then the whole decoder re-runs over the growing prefix at every step, with no
  cache. It runs on our model's weights, so its greedy output equals ours.

Workloads: a training step (forward, backward and AdamW on a right-padded batch with -100 labels), greedy and
beam-search decoding of a fixed number of tokens (eos is suppressed, `min_new_tokens == max_new_tokens`, so
every system does the same work), and the peak memory of each, measured in a fresh subprocess per system (see
`measure_memory`). Results: medians, ratios, the training step's model-FLOPs utilisation against a matmul
peak measured in the same run, and beam search's speedup over the textbook decoder as the output grows.

Each speed ratio comes with its ceiling on the machine at hand, measured in the same run: `ProjectionFloor`
times the cached decoding's matmuls alone (what any cached decoder of this shape must compute), so a peer's
time over it bounds what any implementation could gain over that peer. `AttentionFloor` adds the attention
kernels (and beam search's reordering of the cache), which no cached decoder skips either. Through `generate()`
the bound is tighter still: `generation_split` measures the time transformers' generation loop spends outside
the model (logits processing, token selection, beam bookkeeping), which any model decoding through it pays on
top of its kernels. `decoding_flops` counts what the cache saves in arithmetic.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

import torch
from .floors import AttentionFloor, ProjectionFloor, TrainingFloor, decoding_flops, generation_split, token_counts, training_flops
from .memory import MEMORY_RESOLUTION_MIB, measure_memory
from .workloads import BenchmarkSpec, SYSTEMS, TextbookDecoder, build_models, generate_fixed_length, make_train_step, parameter_counts, source_batch, training_batch
from .toolkit import environment, load_average, matmul_peak, time_interleaved



# Slowest over fastest repeat of one system beyond which a run is reported as disturbed by other processes.
NOISY_SPREAD = 1.5


def _ratio(numerator, denominator):
    return None if numerator is None or denominator in (None, 0) else numerator / denominator


def run_benchmark(spec: BenchmarkSpec, log: Callable[[str], None] = print) -> dict:
    """Everything the script reports, as one JSON-ready dict, on the spec's device: the CPU benchmark
    (`make bench`) and the GPU check (device_check.py) are this one run."""
    torch.set_num_threads(spec.threads)
    device = torch.device(spec.device)
    started = time.perf_counter()
    models = build_models(spec)
    ours = models["ours"]
    config = ours.config
    textbook = TextbookDecoder(ours)
    results = {"spec": dataclasses.asdict(spec), "environment": environment(device),
               "parameters": {name: parameter_counts(model) for name, model in models.items()}}
    log(f"threads: {torch.get_num_threads()}; parameters: {results['parameters']}")
    peaks = [matmul_peak(spec.matmul_size, device=device)["flops"]]

    # Training step.
    batch = training_batch(spec, config)
    steps = {name: make_train_step(model, batch) for name, model in models.items()}
    steps["floor"] = TrainingFloor(ours, batch)
    phases = {}
    mark = time.perf_counter()
    log("timing the training step ...")
    target_tokens = int((batch["labels"] != -100).sum())
    train = summarize(time_interleaved(steps, spec.repeats, spec.warmup, device), target_tokens)
    floor = train.pop("floor")
    shape = (*batch["input_ids"].shape, batch["labels"].shape[1])
    # Model FLOPs count the batch's tokens; a dense implementation also computes the padding.
    flops = training_flops(config, *shape, True, *token_counts(batch))
    executed = {"ours": training_flops(config, *shape), "marian": training_flops(config, *shape)}
    phases["train"] = time.perf_counter() - mark
    results["train"] = {"systems": train, "target_tokens": target_tokens, "flops_per_step": flops,
                        "flops_per_step_padded": executed["marian"],
                        "floor": floor, "ceiling_vs_marian": train["marian"]["median_s"] / floor["median_s"],
                        "shape": {"batch": spec.batch_size, "source": batch["input_ids"].shape[1],
                                  "target": batch["labels"].shape[1]}}

    if spec.compile_backend:
        mark = time.perf_counter()
        results["train_compiled"] = compiled_training(models, batch, spec, log)
        phases["train_compiled"] = time.perf_counter() - mark

    # Decoding: greedy and beam search, fixed length.
    source = source_batch(spec, config, spec.generation_batch_size)
    outputs = {}
    for workload, beams in (("greedy", 1), ("beam", spec.num_beams)):
        log(f"timing {workload} decoding ...")
        mark = time.perf_counter()

        tasks = {name: (lambda m=model, b=beams: generate_fixed_length(m, **source, new_tokens=spec.new_tokens,
                                                                        num_beams=b))
                 for name, model in models.items()}
        tasks["textbook"] = lambda b=beams: textbook.decode(**source, new_tokens=spec.new_tokens, num_beams=b)
        tasks["attention_floor"] = AttentionFloor(ours, tasks["ours"])
        tasks = {name: (lambda f=f, n=name, w=workload: outputs.__setitem__((n, w), f())) if name in SYSTEMS else f
                 for name, f in tasks.items()}
        tasks["floor"] = ProjectionFloor(ours, spec.generation_batch_size, source["input_ids"].shape[1],
                                         spec.new_tokens, beams, int(source["attention_mask"].sum()))
        tokens = spec.generation_batch_size * spec.new_tokens
        systems = summarize(time_interleaved(tasks, spec.repeats, spec.warmup, device), tokens)
        # Separately (the timing hooks cost a little): how much of generate() is the loop around the model.
        split = {name: generation_split(models[name], tasks[name], min(spec.repeats, 3)) for name in models}
        floor, loop = systems["floor"]["median_s"], min(s["loop_s"] for s in split.values())
        attention = systems["attention_floor"]["median_s"]
        results[workload] = {"systems": {n: systems[n] for n in SYSTEMS}, "projection_floor": systems["floor"],
                             "attention_floor": systems["attention_floor"],
                             "num_beams": beams, "new_tokens": spec.new_tokens,
                             "batch": spec.generation_batch_size, "generation_split": split,
                             "ceiling_vs_marian": systems["marian"]["median_s"] / floor,
                             # The most a model could gain through generate(): its matmuls, its attention and
                             # the loop's time.
                             "ceiling_through_generate": systems["marian"]["median_s"] / (floor + attention + loop)}
        phases[workload] = time.perf_counter() - mark
    results["checks"] = {
        "output_shapes": {f"{n}/{w}": list(out.shape) for (n, w), out in outputs.items()},
        "textbook_greedy_equals_ours": torch.equal(outputs["textbook", "greedy"], outputs["ours", "greedy"]),
        "textbook_beam_equals_ours": torch.equal(outputs["textbook", "beam"], outputs["ours", "beam"]),
    }

    # Beam search against the textbook decoder as the output grows.
    curve_source = source_batch(spec, config, spec.curve_batch_size, seed=spec.seed + 3)
    curve = []
    mark = time.perf_counter()
    for length in spec.curve_lengths:
        log(f"timing beam-{spec.num_beams} vs textbook at {length} tokens ...")
        tasks = {
            "ours": lambda n=length: generate_fixed_length(ours, **curve_source, new_tokens=n,
                                                           num_beams=spec.num_beams),
            "textbook": lambda n=length: textbook.beam(**curve_source, new_tokens=n, num_beams=spec.num_beams),
            "floor": ProjectionFloor(ours, spec.curve_batch_size, curve_source["input_ids"].shape[1], length,
                                     spec.num_beams, int(curve_source["attention_mask"].sum())),
        }
        tasks["attention_floor"] = AttentionFloor(ours, tasks["ours"])
        # No warm-up: the decoding workloads above already ran both code paths.
        timed = summarize(time_interleaved(tasks, spec.curve_repeats, 0, device), spec.curve_batch_size * length)
        loop = generation_split(ours, tasks["ours"], spec.curve_repeats)["loop_s"]
        floors = timed["floor"]["median_s"] + timed["attention_floor"]["median_s"]
        shape = (config, spec.curve_batch_size, curve_source["input_ids"].shape[1], length, spec.num_beams)
        source_tokens = int(curve_source["attention_mask"].sum())
        curve.append({"new_tokens": length, "ours_s": timed["ours"]["median_s"],
                      "textbook_s": timed["textbook"]["median_s"],
                      "speedup": timed["textbook"]["median_s"] / timed["ours"]["median_s"],
                      "projection_floor_s": timed["floor"]["median_s"],
                      "attention_floor_s": timed["attention_floor"]["median_s"],
                      # The most a cached decoder could gain here: no time beyond its projections.
                      "ceiling": timed["textbook"]["median_s"] / timed["floor"]["median_s"],
                      "generate_loop_s": loop,
                      "ceiling_through_generate": timed["textbook"]["median_s"] / (floors + loop),
                      # What a cache saves in arithmetic.
                      "flop_ratio": decoding_flops(*shape, cached=False, source_tokens=source_tokens)
                                    / decoding_flops(*shape, source_tokens=source_tokens)})
    phases["beam_curve"] = time.perf_counter() - mark
    results["beam_curve"] = {"batch": spec.curve_batch_size, "num_beams": spec.num_beams,
                             "repeats": spec.curve_repeats, "points": curve}

    peaks.append(matmul_peak(spec.matmul_size, device=device)["flops"])
    peak = max(peaks)
    results["matmul_peak"] = {"size": spec.matmul_size, "flops": peak, "samples": peaks}
    for name, system in train.items():
        system["mfu"] = flops / system["median_s"] / peak
        system["matmul_utilisation"] = executed[name] / system["median_s"] / peak  # the FLOPs it actually runs

    if spec.memory:
        log("measuring peak memory in subprocesses ...")
        mark = time.perf_counter()
        results["memory_mib"] = measure_memory(spec)
        phases["memory"] = time.perf_counter() - mark
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
    results["elapsed_s"] = time.perf_counter() - started
    results["phase_s"] = phases
    return results


def compiled_training(models: dict, batch: dict, spec: BenchmarkSpec, log: Callable[[str], None]) -> dict:
    """The training step eager and under torch.compile, ours and Marian, interleaved. Each compiled system trains
    a copy of its model; its first step (the compilation) is timed apart and kept out of the medians."""
    import copy

    steps, compile_s = {}, {}
    for name in ("ours", "marian"):
        steps[f"{name}_eager"] = make_train_step(models[name], batch)
        steps[f"{name}_compiled"] = make_train_step(torch.compile(copy.deepcopy(models[name]),
                                                                  backend=spec.compile_backend), batch)
        log(f"compiling the training step of {name} ({spec.compile_backend}) ...")
        mark = time.perf_counter()
        steps[f"{name}_compiled"]()
        compile_s[name] = time.perf_counter() - mark
    log("timing the training step, eager vs compiled ...")
    timed = summarize(time_interleaved(steps, spec.repeats, spec.warmup, spec.device),
                      int((batch["labels"] != -100).sum()))
    median = {name: system["median_s"] for name, system in timed.items()}
    return {"backend": spec.compile_backend, "systems": timed, "compile_s": compile_s,
            "compiled_speed_vs_eager": {n: median[f"{n}_eager"] / median[f"{n}_compiled"] for n in ("ours", "marian")},
            "compiled_speed_vs_marian_compiled": median["marian_compiled"] / median["ours_compiled"]}


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
