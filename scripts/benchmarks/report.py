"""The benchmark's report: a markdown page of a run's results (`write_results`). The method behind each figure is in
scripts/benchmarks/README.md."""

from __future__ import annotations

from pathlib import Path

from .memory import MEMORY_RESOLUTION_MIB
from .peers import NOISY_SPREAD
from .toolkit import format_load, markdown_table, write_report
from .workloads import SYSTEMS

WORKLOADS = ("train", "greedy", "beam")


def _ms(seconds):
    return f"{seconds * 1000:,.0f} ms" if seconds >= 0.1 else f"{seconds * 1000:,.1f} ms"


def _x(value):
    return "–" if value is None else f"{value:.2f}x"


def _timed(system):
    return f"{_ms(system['median_s'])} ({system['throughput']:,.0f} tok/s)"


def render_markdown(results: dict) -> str:
    return "\n".join([*_header(results), *_speed(results), *_utilisation(results), *_memory(results),
                      *_verdicts(results)])


def _header(results: dict) -> list[str]:
    spec, env, parameters = results["spec"], results["environment"], results["parameters"]
    loads = [format_load(env.get(key)) for key in ("load_average_at_start", "load_average_at_end")]
    return [f"# Benchmark: preset `{spec['preset']}` (vocabulary {spec['vocab_size']:,})", "",
            f"{env.get('gpu') or env['cpu']}, {env['torch_threads']} torch threads ({env['torch_interop_threads']} "
            f"inter-op), torch {env['torch']}, transformers {env['transformers']}; training in "
            f"{'bf16 autocast' if spec.get('bf16') else 'float32'}. Medians of {spec['repeats']} "
            f"interleaved repeats after {spec['warmup']} warm-up. Ratios are ours/peer in throughput (> 1: ours "
            "faster) and in memory (< 1: ours smaller).", "",
            f"Load average (1/5/15 min) at start {loads[0]}, at end {loads[1]}, on {env['cores_available']} cores: "
            "anything above the run's own threads is other processes sharing the cores.", "",
            f"Trainable parameters: ours {parameters['ours']['trainable']:,}, Marian "
            f"{parameters['marian']['trainable']:,} (Marian also holds {parameters['marian']['frozen']:,} frozen "
            f"position-table entries and a {parameters['marian']['buffers']:,}-entry `final_logits_bias` buffer).", ""]


def _speed(results: dict) -> list[str]:
    r, train, compiled = results["ratios"], results["train"], results.get("train_compiled")
    s, shape = train["systems"], train["shape"]
    rows = [[f"training step (batch {shape['batch']}, source {shape['source']}, target {shape['target']} padded)",
             _timed(s["ours"]), _timed(s["marian"]), "–", _x(r.get("train_speed_vs_marian")), "–"]]
    if compiled:
        c, eager = compiled["systems"], compiled["compiled_speed_vs_eager"]
        rows.append([f"training step, compiled (torch.compile, {compiled['backend']}; eager in the same run: ours "
                     f"{_ms(c['ours_eager']['median_s'])}, Marian {_ms(c['marian_eager']['median_s'])})",
                     f"{_ms(c['ours_compiled']['median_s'])} ({_x(eager['ours'])} eager)",
                     f"{_ms(c['marian_compiled']['median_s'])} ({_x(eager['marian'])} eager)", "–",
                     _x(compiled["compiled_speed_vs_marian_compiled"]), "–"])
    for workload, label in (("greedy", "greedy"), ("beam", f"beam-{results['beam']['num_beams']}")):
        w = results[workload]
        rows.append([f"{label}, {w['new_tokens']} tokens x {w['batch']} sentences",
                     *(_timed(w["systems"][n]) for n in SYSTEMS),
                     _x(r.get(f"{workload}_speed_vs_marian")), _x(r.get(f"{workload}_speed_vs_uncached"))])
    lines = markdown_table(["workload", "ours", "Marian", "ours, no cache", "ours/Marian", "ours/no cache"], rows)
    spreads = {f"{w}/{n}": s["spread"] for w in WORKLOADS for n, s in results[w]["systems"].items()}
    noisy = sorted(((v, k) for k, v in spreads.items() if v > NOISY_SPREAD), reverse=True)
    if noisy:
        lines += ["", f"**Noisy run**: the slowest repeat of some systems took over {NOISY_SPREAD}x their fastest ("
                  + ", ".join(f"{k} {v:.1f}x" for v, k in noisy[:4]) + "): other processes were competing for the "
                  "cores."]
    return lines + ["", "Paired ratios (ours/Marian within each repetition; median, quartiles): " + ", ".join(
        f"{name.split('_')[0]} {p['median']:.2f}x ({p['q1']:.2f}–{p['q3']:.2f})"
        for name, p in results["paired_ratios"].items()) + "."]


def _utilisation(results: dict) -> list[str]:
    train, peak = results["train"], results["matmul_peak"]
    ours, marian = train["systems"]["ours"], train["systems"]["marian"]
    return ["", f"Training-step model FLOPs: {train['flops_per_step'] / 1e9:.2f} GFLOP of the batch's tokens "
                f"({train['flops_per_step_padded'] / 1e9:.2f} GFLOP with the padding both models compute); "
                f"{peak['dtype']} matmul peak ({peak['size']}³, best of the run): {peak['flops'] / 1e9:.1f} GFLOP/s; "
                f"MFU ours {ours['mfu']:.1%}, Marian {marian['mfu']:.1%}; counting the padding, the matmul units are "
                f"busy {ours['matmul_utilisation']:.1%} (ours) and {marian['matmul_utilisation']:.1%} (Marian).", ""]


def _memory(results: dict) -> list[str]:
    if "memory_mib" not in results:
        return []
    mem, r = results["memory_mib"], results["ratios"]
    return ["## Peak memory (MiB above the resident set before the workload)", "", *markdown_table(
        ["workload", "ours", "Marian", "ours, no cache", "ours/Marian", "ours/no cache"],
        [[workload, *(f"{mem[n][workload]:,.1f}" if workload in mem.get(n, {}) else "–" for n in SYSTEMS),
          _x(r.get(f"{workload}_memory_vs_marian")), _x(r.get(f"{workload}_memory_vs_uncached"))]
         for workload in WORKLOADS]),
        "", f"Method: {results['memory_method']}. Peaks within {MEMORY_RESOLUTION_MIB:g} MiB are a tie.", ""]


def _verdicts(results: dict) -> list[str]:
    checks = results["checks"]
    return ["## Verdicts", "", "Ours is called faster or slower only where the median and the paired quartiles "
            "agree; otherwise level.", "",
            *markdown_table(["ratio", "measured", "ours is"],
                            [[name, _x(v["value"]), v["verdict"]] for name, v in results["verdicts"].items()]),
            "", f"Checks: without the cache, greedy output equals ours: {checks['uncached_greedy_equals_ours']}; beam "
            f"output equals ours: {checks['uncached_beam_equals_ours']}.", ""]


def write_results(results: dict, output_dir: str | Path) -> dict[str, Path]:
    name = f"results_{results['spec']['preset']}{'_bf16' if results['spec'].get('bf16') else ''}"
    return write_report(Path(output_dir) / name, results, render_markdown(results))
