"""The benchmark's report: a markdown page and a chart of a run's results (`write_results`)."""

from __future__ import annotations

from pathlib import Path

from .memory import MEMORY_RESOLUTION_MIB
from .peers import NOISY_SPREAD
from .workloads import SYSTEMS
from .toolkit import markdown_table, write_report



def _ms(seconds):
    return f"{seconds * 1000:,.0f} ms" if seconds >= 0.1 else f"{seconds * 1000:,.1f} ms"


def _loads(values):
    return "–" if not values else "/".join(f"{v:.1f}" for v in values)


def _x(value):
    return "–" if value is None else f"{value:.2f}x"


def render_markdown(results: dict) -> str:
    spec, env = results["spec"], results["environment"]
    r, train = results["ratios"], results["train"]
    lines = [
        f"# Benchmark: preset `{spec['preset']}` (vocabulary {spec['vocab_size']:,})",
        "",
        f"{env.get('gpu') or env['cpu']}, {env['torch_threads']} torch threads ({env['torch_interop_threads']} inter-op), "
        f"torch {env['torch']}, transformers {env['transformers']}. Medians of {spec['repeats']} interleaved "
        f"repeats after {spec['warmup']} warm-up. Ratios are ours/peer in throughput (> 1: ours faster) and in "
        "memory (< 1: ours smaller).",
        "",
        f"Load average (1/5/15 min) at start {_loads(env.get('load_average_at_start'))}, at end "
        f"{_loads(env.get('load_average_at_end'))}, on {env['cores_available']} cores: anything above the run's own "
        "threads is other processes sharing the cores, which inflates and scatters the times.",
        "",
        f"Trainable parameters: ours {results['parameters']['ours']['trainable']:,}, Marian "
        f"{results['parameters']['marian']['trainable']:,} (Marian also holds "
        f"{results['parameters']['marian']['frozen']:,} frozen position-table entries and a "
        f"{results['parameters']['marian']['buffers']:,}-entry `final_logits_bias` buffer).",
        "",
    ]
    shape = train["shape"]
    s = train["systems"]
    rows = [[f"training step (batch {shape['batch']}, source {shape['source']}, target {shape['target']} padded)",
             f"{_ms(s['ours']['median_s'])} ({s['ours']['throughput']:,.0f} tok/s)",
             f"{_ms(s['marian']['median_s'])} ({s['marian']['throughput']:,.0f} tok/s)", "–",
             _x(r.get('train_speed_vs_marian')), "–"]]
    compiled = results.get("train_compiled")
    if compiled:
        c = compiled["systems"]
        rows.append([f"training step, compiled (torch.compile, {compiled['backend']}; eager in the same run: ours "
                     f"{_ms(c['ours_eager']['median_s'])}, Marian {_ms(c['marian_eager']['median_s'])})",
                     f"{_ms(c['ours_compiled']['median_s'])} ({_x(compiled['compiled_speed_vs_eager']['ours'])} eager)",
                     f"{_ms(c['marian_compiled']['median_s'])} ({_x(compiled['compiled_speed_vs_eager']['marian'])} "
                     "eager)", "–", _x(compiled['compiled_speed_vs_marian_compiled']), "–"])
    for workload, label in (("greedy", "greedy"), ("beam", f"beam-{results['beam']['num_beams']}")):
        w = results[workload]
        s = w["systems"]
        rows.append([f"{label}, {w['new_tokens']} tokens x {w['batch']} sentences",
                     *(f"{_ms(s[n]['median_s'])} ({s[n]['throughput']:,.0f} tok/s)" for n in SYSTEMS),
                     _x(r.get(f'{workload}_speed_vs_marian')), _x(r.get(f'{workload}_speed_vs_textbook'))])
    lines += markdown_table(["workload", "ours", "Marian", "textbook", "ours/Marian", "ours/textbook"], rows)
    spreads = {f"{w}/{n}": s["spread"] for w in ("train", "greedy", "beam") for n, s in results[w]["systems"].items()}
    noisy = {k: v for k, v in spreads.items() if v > NOISY_SPREAD}
    if noisy:
        worst = ", ".join(f"{k} {v:.1f}x" for k, v in sorted(noisy.items(), key=lambda kv: -kv[1])[:4])
        fastest = results.get("ratios_from_fastest_repeats", {})
        alternative = ", ".join(f"{w} {_x(fastest.get(f'{w}_speed_vs_marian'))}" for w in ("train", "greedy", "beam"))
        lines += ["", f"**Noisy run**: the slowest repeat of some systems took over {NOISY_SPREAD}x their fastest "
                      f"({worst}); other processes were competing for the cores. From the fastest repeats, ours/Marian "
                      f"is: {alternative}. Rerun on an idle machine, or with fewer threads than cores, before trusting "
                      "the ratios."]
    paired = results["paired_ratios"]
    lines += ["", "Paired ratios (ours/Marian within each repetition; median, quartiles): " + ", ".join(
        f"{w} {p['median']:.2f}x ({p['q1']:.2f}–{p['q3']:.2f})"
        for w, p in ((k.split("_")[0], v) for k, v in paired.items())) + "."]
    lines += [
        "",
        f"Training-step model FLOPs: {train['flops_per_step'] / 1e9:.2f} GFLOP; fp32 matmul peak "
        f"({results['matmul_peak']['size']}³, best of the run): {results['matmul_peak']['flops'] / 1e9:.1f} GFLOP/s; "
        f"MFU ours {train['systems']['ours']['mfu']:.1%}, Marian {train['systems']['marian']['mfu']:.1%}.",
    ]
    lines += [
        f"Model FLOPs count the batch's tokens. Both models also compute its padding "
        f"({train['flops_per_step_padded'] / 1e9:.2f} GFLOP per step); counting the FLOPs each "
        f"actually runs, the matmul units are busy {train['systems']['ours']['matmul_utilisation']:.1%} (ours) "
        f"and {train['systems']['marian']['matmul_utilisation']:.1%} (Marian) of the peak."]
    lines += [""]
    if "memory_mib" in results:
        mem = results["memory_mib"]
        lines += ["## Peak memory (MiB above the resident set before the workload)", ""]
        lines += markdown_table(["workload", "ours", "Marian", "textbook", "ours/Marian", "ours/textbook"], [
            [workload, *(f"{mem[n][workload]:,.1f}" if workload in mem.get(n, {}) else "–" for n in SYSTEMS),
             _x(r.get(f'{workload}_memory_vs_marian')), _x(r.get(f'{workload}_memory_vs_textbook'))]
            for workload in ("train", "greedy", "beam")])
        lines += ["", f"Method: {results['memory_method']}. Peaks within {MEMORY_RESOLUTION_MIB:g} MiB are a tie "
                  "(Linux updates a process's resident count in per-thread batches of up to 256 KiB).", ""]
    curve = results["beam_curve"]
    lines += [f"## Beam-{curve['num_beams']} speedup over the textbook decoder ({curve['batch']} sentences, "
              f"median of {curve['repeats']})", ""]
    lines += markdown_table(
        ["output tokens", "ours", "textbook", "speedup", "projection floor", "attention floor", "generate() loop",
         "ceiling (projections alone)", "ceiling (floors + loop)", "FLOP ratio"],
        [[p["new_tokens"], _ms(p["ours_s"]), _ms(p["textbook_s"]), f"{p['speedup']:.1f}x",
          _ms(p["projection_floor_s"]), _ms(p["attention_floor_s"]), _ms(p["generate_loop_s"]), f"{p['ceiling']:.1f}x",
          f"{p['ceiling_through_generate']:.1f}x", f"{p['flop_ratio']:.1f}x"] for p in curve["points"]])
    floors = {w: results[w]["projection_floor"]["median_s"] for w in ("greedy", "beam")}
    lines += ["",
              f"Projection floor: the cached decoding's matmuls alone, back to back at the same shapes with the same "
              f"weights (`ProjectionFloor`): greedy {_ms(floors['greedy'])}, beam {_ms(floors['beam'])} in the table "
              "above. Any cached decoder of this model running the same matmul kernels needs at least that, so a "
              "peer's time over the floor is the most it could gain over that peer (the ceiling). FLOP ratio: the "
              "textbook decoder's FLOPs over ours (`decoding_flops`), what the cache saves in arithmetic; the "
              "speedup stays far below it because one position per step makes small matmuls, which run at a "
              "fraction of the speed of the textbook decoder's large ones.",
              ]
    attention = {w: results[w]["attention_floor"]["median_s"] for w in ("greedy", "beam")}
    lines += ["",
              "Attention floor: the decoding's attention alone, every scaled-dot-product-attention call of one "
              "run of ours replayed at the same shapes and masks, plus, in beam search, the reordering of the "
              f"self- and cross-attention caches between steps (`AttentionFloor`): greedy {_ms(attention['greedy'])}, beam "
              f"{_ms(attention['beam'])}. A cached decoder cannot skip these either."]

    def split(workload):
        parts = results[workload]["generation_split"]
        return ", ".join(f"{name} {_ms(v['loop_s'])} of {_ms(v['total_s'])}" for name, v in parts.items())
    lines += ["",
              "generate() loop: the time transformers' generation loop spends outside the model (logits "
              "processors, token choice, beam bookkeeping), which a model decoding through generate() pays "
              f"however fast it is (`generation_split`, median of up to 3 runs): greedy {split('greedy')}; beam "
              f"{split('beam')}. With it, the decoding ceilings tighten to the peer's time over the floors + loop "
              "(the smaller loop of the two systems).",
              ]
    lines += ["", "## Verdicts", "",
              "Ours is called faster or slower only where the median, the fastest repeats and the paired quartiles "
              "agree; otherwise level.", ""]
    lines += markdown_table(["ratio", "measured", "ceiling on this machine", "ours is"],
                            [[name, _x(v["value"]), _x(v.get("ceiling")), v["verdict"]]
                             for name, v in results["verdicts"].items()])
    lines += ["", "Ceilings: training, Marian's step time over the training floor (`TrainingFloor`: the step's "
                  "matmuls forward and backward on the batch's tokens, back to back, plus the AdamW update; "
                  f"{_ms(train['floor']['median_s'])}); decoding, the peer's time over the projection floor plus "
                  "the attention floor plus generate()'s loop."]
    checks = results["checks"]
    lines += ["", f"Checks: textbook greedy output equals ours: {checks['textbook_greedy_equals_ours']}; "
                  f"textbook beam output equals ours: {checks['textbook_beam_equals_ours']}.", ""]
    return "\n".join(lines)


def plot_results(results: dict, path: Path):
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = results["ratios"]
    panels = 3 if "memory_mib" in results else 2
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4))
    workloads = ["train", "greedy", "beam"]
    labels = ["training step", "greedy", f"beam-{results['beam']['num_beams']}"]
    x = range(len(workloads))
    ax = axes[0]
    for offset, peer, colour in ((-0.2, "marian", "tab:blue"), (0.2, "textbook", "tab:orange")):
        values = [r.get(f"{w}_speed_vs_{peer}") or 0 for w in workloads]
        bars = ax.bar([i + offset for i in x], values, 0.4, label=f"vs {peer}", color=colour)
        ax.bar_label(bars, [f"{v:.2f}" if v else "" for v in values], fontsize=8)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(list(x), labels)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_yticks([0.5, 1, 1.5, 2, 3, 5, 10, 20])
    ax.set_ylabel("throughput ratio ours/peer (> 1: ours faster)")
    ax.set_title("Speed")
    ax.legend()
    if "memory_mib" in results:
        mem = results["memory_mib"]
        ax = axes[1]
        for offset, name, colour in ((-0.27, "ours", "tab:green"), (0, "marian", "tab:blue"),
                                     (0.27, "textbook", "tab:orange")):
            values = [mem.get(name, {}).get(w, 0) for w in workloads]
            ax.bar([i + offset for i in x], values, 0.27, label=name, color=colour)
        ax.set_xticks(list(x), labels)
        ax.set_ylabel("peak memory growth (MiB)")
        ax.set_title("Peak memory")
        ax.legend()
    ax = axes[-1]
    points = results["beam_curve"]["points"]
    ax.plot([p["new_tokens"] for p in points], [p["speedup"] for p in points], "o-", color="tab:orange")
    for p in points:
        ax.annotate(f"{p['speedup']:.1f}x", (p["new_tokens"], p["speedup"]), textcoords="offset points",
                    xytext=(0, 6), ha="center", fontsize=8)
    ax.set_xscale("log")
    ax.set_xticks([p["new_tokens"] for p in points], [str(p["new_tokens"]) for p in points])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_ylim(bottom=0)
    ax.set_xlabel("output tokens")
    ax.set_ylabel("speedup over the textbook decoder")
    ax.set_title(f"Beam-{results['beam_curve']['num_beams']}: cache vs full recompute")
    fig.suptitle(f"preset {results['spec']['preset']}, {results['environment']['torch_threads']} threads")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_results(results: dict, output_dir: str | Path, plot: bool = True) -> dict[str, Path]:
    stem = Path(output_dir) / f"results_{results['spec']['preset']}"
    paths = write_report(stem, results, render_markdown(results))
    if plot:
        paths["png"] = stem.with_suffix(".png")
        plot_results(results, paths["png"])
    return paths
