"""Where the time goes: operator and Python profiles of our model's training step and beam search, beside
Marian's (`benchmark.py --profile`)."""

from __future__ import annotations

import cProfile
import io
import pstats
import time
from collections.abc import Callable

from .workloads import BenchmarkSpec, build_models, generate_fixed_length, make_train_step, source_batch, training_batch

import torch


def _operator_times(prof) -> dict[str, tuple[float, int]]:
    """Self CPU microseconds and call count per operator, from a torch.profiler run."""
    return {event.key: (event.self_cpu_time_total, event.count) for event in prof.key_averages()}


def _operator_diff(ours: dict, marian: dict, per: int, rows: int) -> str:
    """Operators whose self time differs most between ours and Marian, per call of the workload."""
    names = sorted(set(ours) | set(marian), key=lambda n: -abs(ours.get(n, (0, 0))[0] - marian.get(n, (0, 0))[0]))
    lines = [f"{'operator':<58} {'ours ms':>9} {'Marian ms':>10} {'diff ms':>9} {'ours calls':>11} "
             f"{'Marian calls':>13}"]
    for name in names[:rows]:
        (o, oc), (m, mc) = ours.get(name, (0, 0)), marian.get(name, (0, 0))
        lines.append(f"{name[:58]:<58} {o / 1e3 / per:>9.2f} {m / 1e3 / per:>10.2f} {(o - m) / 1e3 / per:>+9.2f} "
                     f"{oc / per:>11.1f} {mc / per:>13.1f}")
    total_o = sum(v[0] for v in ours.values()) / 1e3 / per
    total_m = sum(v[0] for v in marian.values()) / 1e3 / per
    calls_o = sum(v[1] for v in ours.values()) / per
    calls_m = sum(v[1] for v in marian.values()) / per
    lines.append(f"{'total (calls include nested operators)':<58} {total_o:>9.2f} {total_m:>10.2f} "
                 f"{total_o - total_m:>+9.2f} {calls_o:>11.1f} {calls_m:>13.1f}")
    return "\n".join(lines)


def _python_profile(fn: Callable, rows: int, restrict: str | None = None, sort: str = "tottime") -> tuple[str, float]:
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    fn()
    profiler.disable()
    wall = time.perf_counter() - start
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream).sort_stats(sort)
    stats.print_stats(*([restrict] if restrict else []), rows)
    text = stream.getvalue()
    return text[text.index("ncalls") - 3:] if "ncalls" in text else text, wall


def profile_ours(spec: BenchmarkSpec, repeats: int = 3, rows: int = 25) -> str:
    """Where our training step, greedy and beam decoding spend their time, next to Marian doing the same work.

    For each workload: torch.profiler's operators for ours (self CPU time), the operators whose time differs
    most from Marian's (per call of the workload), cProfile's Python functions for ours, and the time inside
    our own model code, transformers' masking and cache helpers (per call of the workload)."""
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(spec.threads)
    models = build_models(spec)
    config = models["ours"].config
    batch = training_batch(spec, config)
    source = source_batch(spec, config, spec.generation_batch_size)
    workloads = {}
    for name, model in models.items():
        step = make_train_step(model, batch)
        workloads["training step", name] = step
        for beams in (1, spec.num_beams):
            label = "greedy" if beams == 1 else f"beam-{beams}"
            workloads[f"{label} decoding, {spec.new_tokens} tokens x {spec.generation_batch_size}", name] = (
                lambda m=model, b=beams: generate_fixed_length(m, **source, new_tokens=spec.new_tokens, num_beams=b))
    for fn in workloads.values():  # warm up; the training warm-up also creates AdamW's state
        fn()

    sections = [f"# Profile of ours (and Marian for comparison), preset {spec.preset}, vocabulary {spec.vocab_size}, "
                f"{torch.get_num_threads()} threads; figures per call of the workload, averaged over {repeats} calls "
                "interleaved with Marian's"]
    for title in dict.fromkeys(t for t, _ in workloads):
        # Interleaved, one profiled call at a time, so that load from other processes hits both systems alike.
        operators = {"ours": {}, "marian": {}}
        walls = {"ours": 0.0, "marian": 0.0}
        tables = []
        for rep in range(repeats):
            for name in ("ours", "marian") if rep % 2 == 0 else ("marian", "ours"):
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    start = time.perf_counter()
                    workloads[title, name]()
                    walls[name] += (time.perf_counter() - start) / repeats
                for op, (us, count) in _operator_times(prof).items():
                    total = operators[name].get(op, (0.0, 0))
                    operators[name][op] = (total[0] + us, total[1] + count)
                if name == "ours" and rep == repeats - 1:
                    tables.append(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))
        table = tables[0]

        def ours_repeated(fn=workloads[title, "ours"]):
            for _ in range(repeats):
                fn()

        by_self, _ = _python_profile(ours_repeated, rows)
        own, _ = _python_profile(ours_repeated, 2 * rows, "modeling_vanilla_transformer|masking_utils|cache_utils|"
                                 "generation/utils|logits_process|stopping_criteria", sort="cumulative")
        sections.append(
            f"## {title}\n\nWall time under torch.profiler, per call: ours {walls['ours'] * 1e3:.0f} ms, Marian "
            f"{walls['marian'] * 1e3:.0f} ms.\n\n### Ours: operators by self CPU time (the last call)\n\n"
            f"{table}\n\n### Ours minus Marian, by operator (ms per call)\n\n"
            f"{_operator_diff(operators['ours'], operators['marian'], repeats, rows)}\n\n"
            f"### Ours: Python functions by own time (cProfile, all {repeats} calls)\n\n{by_self}\n"
            f"### Ours: our model code, transformers' masks, caches and generation loop, by cumulative time "
            f"(cProfile, all {repeats} calls)\n\n{own}"
        )
    return "\n\n".join(sections) + "\n"



__all__ = ["profile_ours"]


def top_kernels(step, device, rows: int = 10) -> dict:
    """Where one step's device time goes: the kernels (CPU ops on the CPU) with the most self time, and their share
    (the device check's view of a compiled training step)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    attribute = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, attribute, 0) > 0]
    total = sum(getattr(e, attribute) for e in events)
    events.sort(key=lambda e: getattr(e, attribute), reverse=True)
    return {"total_ms": total / 1e3, "kernels": [
        {"name": e.key[:120], "ms": getattr(e, attribute) / 1e3, "share": getattr(e, attribute) / total,
         "calls": e.count} for e in events[:rows]]}
