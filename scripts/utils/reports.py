"""The reports of the measurements in scripts/benchmarks, each rendered from its results file alone (results/NAME.json
→ results/NAME.md), and the formatting they share: the benchmarks write them, and scripts/utils/pages.py renders them
again to check that every committed report agrees with its results."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "scripts" / "benchmarks" / "results"


# The instruction sets that decide how fast bf16 and int8 run on a CPU: engine speed-ups differ by them.
CPU_FLAGS_THAT_MATTER = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")

def format_load(load: list[float] | None) -> str:
    return "/".join(f"{value:.1f}" for value in load) if load else "–"

def describe_cpu(environment: dict) -> str:
    """The processor and the flags that matter, e.g. "AMD EPYC (avx2, avx512f)"."""
    flags = environment["cpu_flags"]
    return f"{environment['cpu']} ({', '.join(flags) or 'none of ' + ', '.join(CPU_FLAGS_THAT_MATTER)})"

def cpu_slug(environment: dict) -> str:
    """A file-name part naming the CPU a report was measured on, e.g. "intel_xeon" or "amd_epyc"."""
    words = [word for word in environment["cpu"].replace("(R)", "").split() if word.isalpha()]
    return "_".join(words[:2]).lower() or "cpu"

def markdown_table(header: list[str], rows: list[list]) -> list[str]:
    """A markdown table's lines, cells written with str(); a `|` in a cell (as in `|Y|^alpha`) is escaped."""
    def line(cells):
        return "| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |"

    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"a table row has {len(row)} cells for {len(header)} columns: {row!r}")
    return [line(header), "|" + "---|" * len(header), *(line(row) for row in rows)]

def write_report(stem: str | Path, results: dict, markdown: str) -> dict[str, Path]:
    """`stem`.json (every number) and `stem`.md (the report a person reads)."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = {"json": stem.with_name(stem.name + ".json"), "md": stem.with_name(stem.name + ".md")}
    paths["json"].write_text(json.dumps(results, indent=2, default=str) + "\n")
    paths["md"].write_text(markdown)
    return paths

def write_cpu_report(module: str, output: str | Path | None, results: dict, markdown: str) -> dict[str, Path]:
    """`write_report` to `output`, by default results/<module>_<cpu> (figures differ by processor); prints it."""
    paths = write_report(output or RESULTS / f"{module}_{cpu_slug(results['environment'])}",
                         results, markdown)
    print(markdown)
    return paths


def _ms(seconds):
    return f"{seconds * 1000:,.0f} ms" if seconds >= 0.1 else f"{seconds * 1000:,.1f} ms"

def _x(value):
    return "–" if value is None else f"{value:.2f}x"

def _timed(system):
    return f"{_ms(system['median_s'])} ({system['throughput']:,.0f} tok/s)"

def peer_report(results: dict) -> str:
    """`make bench`'s report (results/results_<preset>.md): the method behind each figure is in
    scripts/benchmarks/README.md."""
    return "\n".join([*_peer_header(results), *_peer_speed(results), *_peer_utilisation(results),
                      *_peer_memory(results),
                      *_peer_verdicts(results)])

def _peer_header(results: dict) -> list[str]:
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

def _peer_speed(results: dict) -> list[str]:
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
                     *(_timed(system) for system in w["systems"].values()),
                     _x(r.get(f"{workload}_speed_vs_marian")), _x(r.get(f"{workload}_speed_vs_uncached"))])
    lines = markdown_table(["workload", "ours", "Marian", "ours, no cache", "ours/Marian", "ours/no cache"], rows)
    spreads = {f"{w}/{n}": s["spread"] for w in results["workloads"] for n, s in results[w]["systems"].items()}
    noisy = sorted(((v, k) for k, v in spreads.items() if v > results["noisy_spread"]), reverse=True)
    if noisy:
        lines += ["", f"**Noisy run**: the slowest repeat of some systems took over {results['noisy_spread']}x their "
                  "fastest ("
                  + ", ".join(f"{k} {v:.1f}x" for v, k in noisy[:4]) + "): other processes were competing for the "
                  "cores."]
    return lines + ["", "Paired ratios (ours/Marian within each repetition; median, quartiles): " + ", ".join(
        f"{name.split('_')[0]} {p['median']:.2f}x ({p['q1']:.2f}–{p['q3']:.2f})"
        for name, p in results["paired_ratios"].items()) + "."]

def _peer_utilisation(results: dict) -> list[str]:
    train, peak = results["train"], results["matmul_peak"]
    ours, marian = train["systems"]["ours"], train["systems"]["marian"]
    return ["", f"Training-step model FLOPs: {train['flops_per_step'] / 1e9:.2f} GFLOP of the batch's tokens "
                f"({train['flops_per_step_padded'] / 1e9:.2f} GFLOP with the padding both models compute); "
                f"{peak['dtype']} matmul peak ({peak['size']}³, best of the run): {peak['flops'] / 1e9:.1f} GFLOP/s; "
                f"MFU ours {ours['mfu']:.1%}, Marian {marian['mfu']:.1%}; counting the padding, the matmul units are "
                f"busy {ours['matmul_utilisation']:.1%} (ours) and {marian['matmul_utilisation']:.1%} (Marian).", ""]

def _peer_memory(results: dict) -> list[str]:
    if "memory_mib" not in results:
        return []
    mem, r = results["memory_mib"], results["ratios"]
    return ["## Peak memory (MiB above the resident set before the workload)", "", *markdown_table(
        ["workload", "ours", "Marian", "ours, no cache", "ours/Marian", "ours/no cache"],
        [[workload, *(f"{mem[n][workload]:,.1f}" if workload in mem.get(n, {}) else "–"
                      for n in results["greedy"]["systems"]),
          _x(r.get(f"{workload}_memory_vs_marian")), _x(r.get(f"{workload}_memory_vs_uncached"))]
         for workload in results["workloads"]]),
        "", f"Method: {results['memory_method']}. Peaks within {results['memory_resolution_mib']:g} MiB are a tie.", ""]

def _peer_verdicts(results: dict) -> list[str]:
    checks = results["checks"]
    return ["## Verdicts", "", "Ours is called faster or slower only where the median and the paired quartiles "
            "agree; otherwise level.", "",
            *markdown_table(["ratio", "measured", "ours is"],
                            [[name, _x(v["value"]), v["verdict"]] for name, v in results["verdicts"].items()]),
            "", f"Checks: without the cache, greedy output equals ours: {checks['uncached_greedy_equals_ours']}; beam "
            f"output equals ours: {checks['uncached_beam_equals_ours']}.", ""]

def kernel_table(rows: list[dict]) -> list[str]:
    """The loss in each dtype: ours, torch's, and torch's time over ours (> 1: ours faster)."""
    return markdown_table(["kernel (forward + backward)", "dtype", "ours", "torch", "torch / ours"], [
        ["loss", row["dtype"], f"{row['loss_ours_ms']:.2f} ms", f"{row['loss_torch_ms']:.2f} ms",
         f"{row['loss_torch_ms'] / row['loss_ours_ms']:.2f}x"] for row in rows])

def kernels_report(results: dict) -> str:
    """`scripts.benchmarks.kernels`' report (results/kernels_<cpu>.md)."""
    env, shapes = results["environment"], results["shapes"]
    loads = ", ".join(format_load(load) for load in (env["load_average_at_start"], results["load_average_at_end"]))
    return "\n".join([f"# The loss kernel: ours against torch's ({env['cpu']}, {env['torch_threads']} threads)", "",
                      f"`{results['command']}`: {shapes['tokens']:,} tokens, vocabulary {shapes['vocab_size']:,}, "
                      f"label smoothing {shapes['label_smoothing']:g}; medians of {results['repeats']} interleaved "
                      f"repeats; load average (1/5/15 min) at the start and the end: {loads}.", "",
                      *kernel_table(results["rows"]), ""])


def engines_report(results: dict, command: str) -> str:
    """`scripts.benchmarks.engines`' report (results/engines_<cpu>.md)."""
    env, s = results["environment"], results["speed"]
    lines = ["# Engines: generate(), onnxruntime, CTranslate2, transformers.js", "", f"`{command}`", "",
             f"{describe_cpu(env)}, commit {env.get('commit')}, torch {env['torch']}.", "",
             f"## Speed: {s['sentences']} {s['model']} sentences in batches of {s['batch_size']}, {s['threads']} "
             f"threads, each system to its own end, timed in a fresh process of its own ({s['processes']} "
             "processes)", "",
             *markdown_table(["decoding", "system", "ms", "sentences/s", "vs generate()"],
                             [[label, name, f"{r['ms']:.0f}", f"{r['sentences_per_s']:.1f}",
                               f"{r['speed_vs_generate']:.2f}x"]
                              for label, systems in s["rows"].items() for name, r in systems.items()]), ""]
    for name, r in results["models"].items():
        lines += [f"## {name}: {r['sentences']} sentences", "",
                  f"Exports (ONNX float32 and int8, CTranslate2 float32 and int8, each verified): "
                  f"{r['export_seconds']:.0f} s. Shares of the sentences on which two systems give the same "
                  f"translation (saved beam: {r['num_beams_as_saved']}):", "",
                  *markdown_table(["export, decoding", "identical to generate()"],
                                  [[what, f"{rate:.1%}"] for what, rate in r["identity"].items()]), "",
                  *markdown_table(["system, decoding", "BLEU"], [[k, f"{bleu:.2f}"] for k, bleu in r["bleu"].items()]),
                  "", *markdown_table(["file", "MB"], [[f, f"{size / 1e6:.2f}"] for f, size in r["files"].items()])]
        if r["differences"]:
            lines += ["", "Where the ONNX float32 export's beam output differs (first 10):", "",
                      *markdown_table(["source", "ours", "onnx"], [[d["source"], d["ours"], d["onnx"]]
                                                                   for d in r["differences"]])]
        lines.append("")
    for js in results.get("transformers.js", []):
        lines += [f"transformers.js 4.3.2 in Node ({js['dtype']}), {js['sentences']} built-in test sentences, greedy: "
                  f"**{js['identity_vs_our_greedy']:.1%}** identical to our greedy generate()"
                  f"{'' if js['dtype'] == 'fp32' else ' (float32)'}; {js['seconds_with_node_start']:.0f} s.", ""]
    return "\n".join(lines) + "\n"

def serving_report(results: dict, command: str) -> str:
    """`scripts.benchmarks.serving`' report (results/serving_<cpu>.md)."""
    env = results["environment"]
    rows = []
    for name, server in results["servers"].items():
        alone = results["engines"][server["engine"]]["batched_sentences_per_s"]
        for level in server["levels"] + ([server["lists_of_8"]] if "lists_of_8" in server else []):
            low, high = level["spread"]
            clients = f"{level['clients']}" + (f" × lists of {level['q_size']}" if level["q_size"] > 1 else "")
            checked = level["sentences"] - level["failures"]
            rows.append([name, clients,
                         f"{level['sentences_per_s']:.1f} ({low:.3g}–{high:.3g})",
                         f"{level['sentences_per_s'] / alone:.0%}", f"{level['p50_ms']:,.1f}",
                         f"{level['p99_ms']:,.1f}", level["failures"],
                         f"{1 - level['sentences_wrong'] / checked:.1%}" if checked else "–"])
    engines = [[name, e["compute_type"], f"{e['batched_sentences_per_s']:.1f}", f"{e['single_p50_ms']:,.1f}"]
               for name, e in results["engines"].items()]
    ceilings = [[name, f"{server['health_requests_per_s']:,.0f}"] for name, server in results["servers"].items()
                if "health_requests_per_s" in server]
    speeds = ", ".join(f"{name} {speed:.0f}" for name, speed in results["compute_type_speeds"].items())
    return "\n".join([
        "# The translation server under load", "", f"`{command}`", "",
        f"{describe_cpu(env)}, commit {env.get('commit')}; each server {results['num_replicas']} replica(s) of one "
        f"thread; {results['sentences']} Multi30k validation sentences, each client sending one request at a time "
        f"over loopback; each level {results['runs']} runs of {results['requests']:,} requests "
        f"({results['requests'] // 4:,} at one client, and in lists of 8), or of {results['max_run_s']:g} s where a "
        "server is slower: the median run, and the lowest and highest throughput of the runs.", "",
        f"CTranslate2's compute types measured here (sentences/s, one thread): {speeds}; the servers and the engine "
        "run the fastest.", "",
        "## Each engine alone (no server)", "",
        "As many processes as a server has replicas, each of one thread, translating the sentences in arrival order in "
        "batches of 32 at once; and one sentence at a time in one process (whose translations every answer below is "
        "checked against).", "",
        *markdown_table(["engine", "compute type", "batches of 32 in arrival order, sentences/s", "one sentence, ms"],
                        engines), "",
        "## Served", "",
        *markdown_table(["server", "clients", "sentences/s (spread)", "of the engine alone", "p50 ms", "p99 ms",
                         "failed", "answers equal to the engine's"], rows), "",
        "## The ingress alone", "",
        "`GET /health` (no model work) from 32 clients: the requests a second each ingress carries on this machine.",
        "", *markdown_table(["server", "requests/s"], ceilings), ""])

def data_stage_report(results: dict) -> str:
    """`scripts.benchmarks.data_stage`' report (results/data_stage_<cpu>.md), its stages in the order they ran."""
    stages = list(dict.fromkeys(stage for size in results["sizes"] for kind in ("cold", "warm")
                                for stage in size[kind]["stages"]))
    rows = []
    for size in results["sizes"]:
        for kind in ("cold", "warm"):
            run = size[kind]
            cells = [f"{run['stages'][stage]['seconds']:.1f} s / {run['stages'][stage]['peak_rss_mib']:,}"
                     if stage in run["stages"] else "-" for stage in stages]
            rows.append([f"{size['pairs']:,}", kind, *cells, f"{run['seconds'] / 60:.2f} min",
                         f"{run['peak_rss_mib']:,} MiB"])
    env = results["environment"]
    return "\n".join([
        "# The data stage at WMT14's size", "",
        f"`{results['command']}` on {env['cpu']} ({env['cores_available']} cores), load average at the start "
        f"{format_load(env['load_average_at_start'])}. Each cell: seconds in that stage / peak RSS (MiB) so far.", "",
        *markdown_table(["pairs", "cache", *stages, "whole command", "peak RSS"], rows), ""])

def parity_report(results: dict, command: str, plot_name: str) -> str:
    """`scripts.benchmarks.quality_parity`' report (results/<report_name>.md)."""
    s, runs, env = results["settings"], results["runs"], results.get("environment")
    rows = "\n".join(markdown_table(
        ["run", "class", "parameters", "steps", "epochs", "train loss", "last val loss", "BLEU", "chrF", "train min",
         "decode min"],
        [[kind, run["model"], f"{run['parameters']:,}", run["steps"], f"{run['epochs']:.2f}",
          f"{run['train_loss']:.3f}", f"{_last_eval_loss(run):.3f}", f"**{run['bleu']:.2f}**", f"{run['chrf']:.2f}",
          f"{run['train_seconds'] / 60:.1f}", f"{run['decode_seconds'] / 60:.1f}"] for kind, run in runs.items()]))
    together = f"both trained at once, {s['threads_per_model']} thread each" if s["parallel"] else "one after the other"
    if env is None:  # the first run recorded no environment
        machine = "on a machine the run did not record"
    else:
        machine = (f"on {describe_cpu(env)} ({env['cores_available']} cores available; load average (1/5/15 min) "
                   f"{format_load(env['load_average_at_start'])} at the start, "
                   f"{format_load(env.get('load_average_at_end'))} at the end)")
    return f"""# Quality parity on Multi30k en→de: ours vs `MarianMTModel`

`{command}`

Both models: preset `{s['preset']}` with `{s['config_overrides']}`, shared BPE of {results['vocab_size']} tokens,
ReLU, post-LN, scaled shared and tied embeddings; `PaperTrainer` with the Noam schedule (warmup
{s['noam_warmup_steps']}, factor {s['noam_factor']}), label smoothing {s['label_smoothing']} (our model's loss
function, Marian's through `compute_loss_func`), token batches of
{s['max_tokens_per_batch']} padded tokens per side (identical batches for both), {s['max_steps']} steps, seed
{s['seed']}, {'bf16 autocast' if runs['ours']['bf16'] else 'float32'}, each library's own initialisation (both
N(0, 0.02), drawn independently); scored:
{f"the average of the last {s['average_last_checkpoints']} checkpoints (one every {s['save_steps']} steps)"
 if s['average_last_checkpoints'] else 'the last weights'}. Validation: all {results['validation_examples']} sentences
of val, beam {s['num_beams']}, length penalty {s['length_penalty']} (|Y|^α), at most {s['max_new_tokens']} new tokens.

{rows}

BLEU(ours) − BLEU(Marian) = **{results['bleu_gap']:+.2f}** (target ≥ −0.3). sacreBLEU:
`{runs['ours']['bleu_signature']}`. Wall time of the whole comparison: {results['wall_seconds'] / 60:.1f} min
({together}), {machine}.

![curves]({plot_name})
"""

def _last_eval_loss(run: dict) -> float:
    losses = [e["eval_loss"] for e in run["log_history"] if "eval_loss" in e]
    return losses[-1] if losses else math.nan

def _flat(value) -> bool:
    """A number, string or bool, or a dict of them: what fits on one line."""
    return not isinstance(value, (dict, list)) or isinstance(value, dict) and not any(
        isinstance(v, (dict, list)) for v in value.values())

def _fmt(value):
    if isinstance(value, dict):
        return ", ".join(f"{key} {_fmt(v)}" for key, v in value.items())
    if value is None or isinstance(value, str):
        return " ".join((value or "–").split())[:300]  # an error's traceback: its start, on one line
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:,}" if isinstance(value, int) else f"{value:,.4g}"

def _table(records: list[dict]) -> list[str]:
    """Records with the same keys as a markdown table, the keys its header."""
    return markdown_table(list(records[0]), [[_fmt(value) for value in r.values()] for r in records])

def _render(result, depth: int = 3) -> list[str]:
    """A section's result as markdown: a list of records as a table; a dict's flat values on one line, then each
    other value under a heading of its name (a dict of flat records as a table, their names first)."""
    if isinstance(result, list):
        return _table(result) if result and isinstance(result[0], dict) else [str(result)]
    flat = {key: value for key, value in result.items() if _flat(value) and value != {}}
    lines = ["; ".join(f"{key}: {_fmt(value)}" for key, value in flat.items()), ""] if flat else []
    for key, value in result.items():
        if key not in flat and value:
            records = isinstance(value, dict) and all(isinstance(v, dict) and _flat(v) for v in value.values())
            body = _table([{"name": k, **v} for k, v in value.items()]) if records else _render(value, depth + 1)
            lines += [f"{'#' * depth} {key}", "", *body, ""]
    return lines

RENDERERS = {  # the sections rendered their own way
    "kernels": kernel_table,
    # make bench's report under its own headings, one level down.
    "benchmark": lambda r: ["#" + line if line.startswith("#") else line
                            for line in peer_report(r).splitlines()],
}

def device_check_report(check: dict) -> str:
    """`scripts/device_check.sh`'s report: each section's result, the problems, and whether every check passed."""
    env = check.get("environment", {})
    lines = [f"# vanilla_transformer device check "
             f"({'CPU smoke, numbers mean nothing' if check['cpu_smoke'] else env.get('gpu', '?')})", "",
             f"torch {env.get('torch')} (CUDA {env.get('cuda_build')}), transformers {env.get('transformers')}, "
             f"accelerate {env.get('accelerate')}; flash-attention packages: "
             f"{env.get('flash_attention_packages') or 'none'}; total {check['wall_s']:.0f} s", ""]
    for name, section in check["sections"].items():
        if section.get("result") and name != "environment":
            heading = [] if name == "benchmark" else [f"## {name}", ""]
            lines += [*heading, *RENDERERS.get(name, _render)(section["result"]), ""]
    problems = [f"- **{k}**: {v.get('error', 'failed')[:1000]}" for k, v in check["sections"].items() if not v["ok"]]
    lines += ["## Problems", "", *problems, ""] if problems else []
    if not check.get("complete", True):
        lines += [f"**Incomplete**: written after {len(check['sections'])} sections; the check had not finished.", ""]
    return re.sub(r"\n{3,}", "\n\n", "\n".join([*lines, f"All checks passed: **{_fmt(check['ok'])}**"])) + "\n"
