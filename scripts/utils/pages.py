"""Pages that cannot drift: every figure a page quotes is rendered from the committed results file that measured it,
and no results file is older than a change to the code it measured.

    python -m scripts.utils.pages            # rewrite every rendered block and report from its results
    python -m scripts.utils.pages --check    # exit 1, naming each page that disagrees with its results or the code
    python -m scripts.utils.pages --record_demo demo_output   # results/demo.json from a `make demo` run

A page marks a rendered block with a line `<!-- rendered: NAME -->` and a line `<!-- end: NAME -->`; NAME is a key of
`BLOCKS`, a function of the results folder. A report, results/STEM.md, is its benchmark's own renderer applied to
results/STEM.json. Each results file names the commit it measured and the paths it measured
(`environment.measures`); a commit after it that changes one of those paths makes every figure drawn from it stale.
A log of past runs (`"history": true`, each run naming its commit) is the record of how a recipe was chosen, not a
claim about the code as it is, and is exempt. transformers keeps its documentation honest the same way
(`utils/check_copies.py`, `make fix-copies`); tests/test_pages.py runs the check.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

import subprocess


from .page_checks import broken_links, missing_commits, wrong_flags
from .recipe_tables import RECIPE_BLOCKS, table
from . import reports as rendered_by
from .reports import cpu_slug

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "scripts" / "benchmarks" / "results"
PAGES = ("README.md", "scripts/recipes/README.md", "scripts/benchmarks/README.md", "scripts/accelerate/README.md",
         "model_cards/README.md")
BLOCK = re.compile(r"^<!-- rendered: (?P<name>[\w-]+) -->\n(?P<body>.*?)^<!-- end: (?P=name) -->$",
                   re.MULTILINE | re.DOTALL)
ENGINE_SYSTEMS = ("onnxruntime float32", "onnxruntime int8", "ctranslate2 float32", "ctranslate2 int8")


# The results files read while a block renders: the figures it draws, for the staleness check.
READ: list[Path] = []


def read(path: Path) -> dict:
    READ.append(path)
    return json.loads(path.read_text(encoding="utf-8"))


def load(name: str, results: Path = RESULTS) -> dict:
    return read(results / f"{name}.json")


def cpu_name(environment: dict) -> str:
    """A CPU as the pages name it: vendor and family, and the fastest of its bf16 paths (the report lists them all)."""
    name = environment["cpu"].replace("(R)", "").replace(" Processor", "")
    flags = environment.get("cpu_flags")
    if flags is None:
        return name
    best = next((flag for flag in ("amx_bf16", "avx512_bf16", "avx512f", "avx2") if flag in flags), None)
    return f"{name} ({best or 'no avx2'}{' only' if best == 'avx2' else ''})"


# ---------------------------------------------------------------------------------------------- the figures
def engine_reports(results: Path = RESULTS) -> list[dict]:
    """Every CPU's engine run (results/engines_<cpu>.json), the newest commit's first."""
    runs = [read(path) for path in sorted(results.glob("engines_*.json"))]
    return sorted(runs, key=lambda run: run["environment"]["cpu"], reverse=True)


def speedup(report: dict, decoding: str, system: str) -> str:
    return f"{report['speed']['rows'][decoding][system]['speed_vs_generate']:.2f}×"


# ---------------------------------------------------------------------------------------------- README blocks
def glance(results: Path = RESULTS) -> str:
    hour, bench, engines = load("multi30k_ours", results), load("results_small", results), engine_reports(results)
    literature = read(results / "multi30k_recipes.json")["literature"]["wu2021"]
    machine = f"{hour['command_minutes']:.0f} min on {cpu_name(hour['environment'])}, {hour['precision']}"
    ratios, recipes = bench["ratios"], "[recipes](scripts/recipes/README.md#the-hours-recipe-the-default)"
    rows = [
        ["Multi30k test2016, the literature's BLEU, in an hour",
         f"**{hour['scores']['test2016']['multi30k_bleu']:.2f}**",
         f"{literature['test2016']:.2f}, Wu et al. (2021) on {literature['hardware']}",
         f"the default recipe, {machine}",
         recipes],
        ["Multi30k validation sacreBLEU, the same run", f"{hour['scores']['validation']['sacrebleu']:.2f}", "–",
         f"{hour['updates']:,} updates", recipes],
        ["`MarianMTModel` of the same shape", f"training {ratios['train_speed_vs_marian']:.2f}×, beam 4 "
         f"{ratios['beam_speed_vs_marian']:.2f}×; memory {ratios['train_memory_vs_marian']:.2f}×", "1.00×",
         f"`make bench`, {cpu_name(bench['environment'])}",
         "[report](scripts/benchmarks/README.md#the-peer-benchmark-cpu)"],
        ["CTranslate2 int8, beam 4, against `generate()`", ", ".join(
            f"{speedup(report, 'beam 4', 'ctranslate2 int8')} on {cpu_name(report['environment'])}"
            for report in engines), "1.00×", "`python -m scripts.benchmarks.engines`", "[engines](#deploy)"],
    ]
    return table(["", "here", "reference", "how", "more"], rows)


def demo_output(results: Path = RESULTS) -> str:
    demo = load("demo", results)
    examples = "".join(f"  EN  {ex['source']}\n  DE  {ex['translation']}\n  REF {ex['reference']}\n"
                       for ex in demo["examples"][:1])
    return (f"On {cpu_name(demo['environment'])}, `make demo` printed:\n\n```\n"
            f"BLEU on the built-in test split ({demo['num_sentences']} sentences, beam 4): {demo['bleu']:.2f}   "
            f"chrF: {demo['chrf']:.2f}\n{examples}"
            f"Reloaded with AutoModelForSeq2SeqLM: {demo['reload_identical']} translations identical to the trained "
            f"model.\nTotal time: {demo['minutes']:.1f} min\n```\n")


def engines(results: Path = RESULTS) -> str:
    reports = engine_reports(results)
    header = ["decoding", "CPU (its report)", "`generate()`, sentences/s", *ENGINE_SYSTEMS]
    rows = []
    for decoding in ("greedy", "beam 4"):
        for report in reports:
            row = report["speed"]["rows"][decoding]
            cpu = (f"[{cpu_name(report['environment'])}](scripts/benchmarks/results/"
                   f"engines_{cpu_slug(report['environment'])}.md)")
            rows.append([decoding, cpu, f"{row['generate()']['sentences_per_s']:.1f}",
                         *(speedup(report, decoding, system) for system in ENGINE_SYSTEMS)])
    return table(header, rows)


def serving_reports(results: Path = RESULTS) -> list[dict]:
    return [read(path) for path in sorted(results.glob("serving_*.json"))]


def _serving_rows(results: Path, wanted=None) -> list[list[str]]:
    rows = []
    for report in serving_reports(results):
        for name, server in report["servers"].items():
            if wanted is not None and name not in wanted:
                continue
            alone = report["engines"][server["engine"]]
            level = {level["clients"]: level for level in server["levels"]}
            busy, one = level[32], level[1]
            low, high = busy["spread"]
            checked = sum(level["sentences"] - level["failures"] for level in server["levels"])
            wrong = sum(level["sentences_wrong"] for level in server["levels"])
            rows.append([name, f"{busy['sentences_per_s']:.1f} ({low:.3g}–{high:.3g})",
                         f"{busy['sentences_per_s'] / alone['batched_sentences_per_s']:.0%}",
                         f"{one['p50_ms']:.1f} ms ({one['p50_ms'] - alone['single_p50_ms']:+.1f})",
                         f"{1 - wrong / checked:.1%}",
                         f"[{cpu_name(report['environment'])}](scripts/benchmarks/results/"
                         f"serving_{cpu_slug(report['environment'])}.md)"])
    return rows


SERVING_HEADER = ["server", "32 clients, sentences/s (spread of 3 runs)", "of the engine alone",
                  "p50 at 1 client (ms over one call)", "answers equal to the engine's", "CPU (its report)"]


def serving(results: Path = RESULTS) -> str:
    """Each server at 32 clients (the median of its runs, and their spread) against its engine alone, its p50 at one
    client against one translate call, and the share of its answers equal to the engine's own."""
    return table(SERVING_HEADER, _serving_rows(results))


def serving_glance(results: Path = RESULTS) -> str:
    """The README's rows of `serving`: the server as it ships, Ray Serve's Python proxy, and what a user writes
    first."""
    return table(SERVING_HEADER, _serving_rows(results, ("ctranslate2 int8: HAProxy ingress",
                                                         "ctranslate2 int8: Python proxy",
                                                         "generate(): pipeline() in a FastAPI handler")))


# ---------------------------------------------------------------------------------------------- the performance report
def peer_benchmark(results: Path = RESULTS) -> str:
    bench = load("results_small", results)
    r, paired = bench["ratios"], bench["paired_ratios"]

    def ms(workload, system):
        return f"{bench[workload]['systems'][system]['median_s'] * 1000:,.0f} ms"

    def against_marian(workload):
        p = paired[f"{workload}_speed_vs_marian"]
        return f"{r[f'{workload}_speed_vs_marian']:.2f}× ({p['q1']:.2f}–{p['q3']:.2f}×)"

    shape = bench["train"]["shape"]
    rows = [[f"training step, {shape['batch']} padded pairs (≤ {shape['source']} × {shape['target']})",
             ms("train", "ours"), ms("train", "marian"), against_marian("train"), "–", "–"]]
    if compiled := bench.get("train_compiled"):
        c = compiled["systems"]
        rows.append([f"the same step under `torch.compile` ({compiled['backend']})",
                     f"{c['ours_compiled']['median_s'] * 1000:,.0f} ms",
                     f"{c['marian_compiled']['median_s'] * 1000:,.0f} ms",
                     f"{compiled['compiled_speed_vs_marian_compiled']:.2f}×", "–", "–"])
    for workload, label in (("greedy", "greedy"), ("beam", f"beam {bench['beam']['num_beams']}")):
        w = bench[workload]
        rows.append([f"{label}, {w['new_tokens']} tokens × {w['batch']} sentences", ms(workload, "ours"),
                     ms(workload, "marian"), against_marian(workload), ms(workload, "uncached"),
                     f"{r[f'{workload}_speed_vs_uncached']:.2f}×"])
    rows.append(["peak memory: training / greedy / beam", "", "", " / ".join(
        f"{r[f'{w}_memory_vs_marian']:.2f}×" for w in ("train", "greedy", "beam")), "", ""])
    return table(["workload", "ours", "Marian", "ours / Marian (paired quartiles)", "ours, no cache",
                  "ours / no cache"], rows)


def engines_report(results: Path = RESULTS) -> str:
    header = ["CPU", "decoding", "`generate()`", *ENGINE_SYSTEMS]
    rows = []
    for report in engine_reports(results):
        cpu, speed_rows = cpu_name(report["environment"]), report["speed"]["rows"]
        for decoding in ("greedy", "beam 4"):
            row = speed_rows[decoding]
            rows.append([cpu, f"{decoding}, sentences/s", f"{row['generate()']['sentences_per_s']:.1f}",
                         *(f"{row[s]['sentences_per_s']:.1f} ({speedup(report, decoding, s)})"
                           for s in ENGINE_SYSTEMS)])
        model = report["models"][report["speed"]["model"]]
        rows.append([cpu, f"BLEU, all {model['sentences']:,} sentences, beam as saved",
                     *(f"{model['bleu'][f'{name}, as saved']:.2f}" for name in ("generate()", *ENGINE_SYSTEMS))])
    return table(header, rows)


def data_stage_table(results: Path = RESULTS) -> str:
    stage = load("data_stage_intel_xeon", results)
    stages = ("read", "vocabulary", "tokenize", "plan", "first_step")
    rows = []
    for size in stage["sizes"]:
        for cache in ("cold", "warm"):
            run = size[cache]
            bold = "**" if size is stage["sizes"][-1] else ""
            rows.append([f"{size['pairs']:,}", cache,
                         *(f"{run['stages'][s]['seconds']:.1f} s / {run['stages'][s]['peak_rss_mib']:,}"
                           for s in stages),
                         f"{bold}{run['seconds'] / 60:.2f} min{bold}", f"{bold}{run['peak_rss_mib']:,} MiB{bold}"])
    return table(["pairs", "cache", "read", "vocabulary", "tokenize", "plan", "first step", "whole command",
                  "peak RSS"], rows)


def kernels_table(results: Path = RESULTS) -> str:
    rows = []
    for path in sorted(results.glob("kernels_*.json"), reverse=True):
        kernels = read(path)
        rows += [[cpu_name(kernels["environment"]), row["dtype"], f"{row['loss_ours_ms']:.1f} ms",
                  f"{row['loss_torch_ms']:.1f} ms", f"{row['loss_torch_ms'] / row['loss_ours_ms']:.2f}×"]
                 for row in kernels["rows"]]
    return table(["CPU", "dtype", "ours", "`F.cross_entropy`", "torch / ours"], rows)


BLOCKS: dict[str, Callable[[Path], str]] = {
    "glance": glance, "demo_output": demo_output, "engines": engines, "serving": serving,
    "serving_glance": serving_glance, "peer_benchmark": peer_benchmark, "engines_report": engines_report,
    "data_stage": data_stage_table, "kernels": kernels_table,
    **{name: (lambda results, block=block: block(read(results / "multi30k_recipes.json"), results, read))
       for name, block in RECIPE_BLOCKS.items()},
}


# ---------------------------------------------------------------------------------------------- reports
def reports(results: Path = RESULTS) -> dict[Path, str]:
    """Each committed report as its benchmark renders it from the committed JSON beside it."""
    renderers = {"engines_": lambda data, stem: rendered_by.engines_report(data, data["command"]),
                 "results_": lambda data, stem: rendered_by.peer_report(data),
                 "kernels_": lambda data, stem: rendered_by.kernels_report(data),
                 "data_stage_": lambda data, stem: rendered_by.data_stage_report(data),
                 "serving_": lambda data, stem: rendered_by.serving_report(data, data["command"]),
                 "parity_": lambda data, stem: rendered_by.parity_report(data, data["command"], f"{stem}.png")}
    rendered = {}
    for path in sorted(results.glob("*.json")):
        render = next((r for prefix, r in renderers.items() if path.stem.startswith(prefix)), None)
        if render is not None:
            rendered[path.with_suffix(".md")] = render(json.loads(path.read_text(encoding="utf-8")), path.stem)
    return rendered


# ---------------------------------------------------------------------------------------------- check and fix
def render_page(text: str, results: Path = RESULTS, page: str = "page") -> str:
    """`text` with every rendered block replaced by what its results say now."""
    def replace(match):
        name = match["name"]
        if name not in BLOCKS:
            raise KeyError(f"{page}: `<!-- rendered: {name} -->` names no block; known: {', '.join(BLOCKS)}")
        return f"<!-- rendered: {name} -->\n{relative_links(BLOCKS[name](results), page)}<!-- end: {name} -->"

    return BLOCK.sub(replace, text)


def relative_links(markdown: str, page: str) -> str:
    """Blocks link from the repository root; a page in a folder gets the same links from where it is."""
    folder = (ROOT / page).parent
    return re.sub(r"\]\((scripts/[^)#]+)", lambda m: f"]({os.path.relpath(ROOT / m[1], folder)}", markdown)


def expected_pages(root: Path = ROOT, results: Path = RESULTS) -> dict[Path, str]:
    """Every page and report as its results render it now."""
    expected = reports(results)
    for page in PAGES:
        if (root / page).is_file():
            expected[root / page] = render_page((root / page).read_text(encoding="utf-8"), results, page)
    return expected


def disagreements(root: Path = ROOT, results: Path = RESULTS) -> list[str]:
    """Every page and report whose text differs from what its results render, each with its first differing line."""
    found = []
    for path, expected in expected_pages(root, results).items():
        text = path.read_text(encoding="utf-8") if path.is_file() else ""
        if text != expected:
            line = next((i for i, (a, b) in enumerate(zip(text.splitlines(), expected.splitlines()), 1) if a != b),
                        min(len(text.splitlines()), len(expected.splitlines())) + 1)
            found.append(f"{path.relative_to(root) if path.is_relative_to(root) else path}:{line} disagrees with its "
                         "results (`python -m scripts.utils.pages` rewrites it)")
    return found


def fix(root: Path = ROOT, results: Path = RESULTS) -> list[Path]:
    changed = []
    for path, text in expected_pages(root, results).items():
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed


# ---------------------------------------------------------------------------------------------- stale figures
def figures(root: Path = ROOT, results: Path = RESULTS) -> dict[str, set[Path]]:
    """Each rendered block (as `PAGE: block NAME`) and each report with the results files its figures come from."""
    drawn = {}
    for page in PAGES:
        if (root / page).is_file():
            for match in BLOCK.finditer((root / page).read_text(encoding="utf-8")):
                READ.clear()
                if match["name"] in BLOCKS:
                    BLOCKS[match["name"]](results)
                drawn[f"{page}: block `{match['name']}`"] = set(READ)
    for report in reports(results):
        drawn[str(report.relative_to(root) if report.is_relative_to(root) else report)] = {report.with_suffix(".json")}
    return drawn


def _git(repository: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repository), *args], capture_output=True, text=True, check=True).stdout


def staleness(path: Path, repository: Path = ROOT) -> str | None:
    """Why the figures of results file `path` are stale, or None: measured on uncommitted code, naming no code, or
    older than a commit that changed a path it measured."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("history"):
        return None
    measured = data.get("environment", {})
    commit, paths = measured.get("commit"), measured.get("measures")
    if not paths:
        return f"{path.name} names no code it measured (environment.measures)"
    if commit is None or commit.endswith("+"):
        return f"{path.name} was measured at {commit}: not a commit (uncommitted changes)"
    changes = _git(repository, "log", "--format=%h %s", f"{commit}..HEAD", "--", *paths).splitlines()
    if changes:
        changed = sorted(set(_git(repository, "diff", "--name-only", commit, "HEAD", "--", *paths).split()))
        return (f"{path.name} measured {commit}; since then {', '.join(changed) or 'its code'} changed, last in "
                f"{changes[0][:100]} ({len(changes)} commit{'s' * (len(changes) > 1)}): measure it again or take the "
                "figure off the page")
    return None


def stale_figures(root: Path = ROOT, results: Path = RESULTS, repository: Path = ROOT) -> list[str]:
    """Every figure on a page or in a report drawn from a stale results file, naming the figure and the change."""
    found, why = [], {}
    for figure, paths in figures(root, results).items():
        for path in sorted(paths):
            if path not in why:
                why[path] = staleness(path, repository)
            if why[path]:
                found.append(f"{figure}: stale, {why[path]}")
    return found


def record_demo(demo_dir: Path, results: Path = RESULTS) -> Path:
    """results/demo.json from a finished `make demo` folder, with the machine and commit it ran on."""
    from scripts.benchmarks.toolkit import environment

    measured = environment(measures=("vanilla_transformer", "scripts/demo.py"))
    if measured["commit"] is None or measured["commit"].endswith("+"):
        raise ValueError(f"--record_demo names the commit the demo ran at, but the work tree is at "
                         f"{measured['commit']}: run `make demo` on a commit, then record it")
    summary = json.loads((demo_dir / "demo_summary.json").read_text(encoding="utf-8"))
    test = json.loads((demo_dir / "model" / "results.json").read_text(encoding="utf-8"))["test"]
    record = {"command": "make demo", "environment": measured, **summary, "num_sentences": test["num_sentences"],
              "examples": test["examples"]}
    path = results / "demo.json"
    path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="Change nothing; exit 1 where a page disagrees with its results, draws a figure from a "
                             "results file older than a change to the code it measured, or names a flag, link or "
                             "commit that does not exist.")
    parser.add_argument("--record_demo", type=Path, metavar="DEMO_OUTPUT_DIR",
                        help="Record a finished `make demo` folder as results/demo.json, then render.")
    args = parser.parse_args(argv)
    if args.record_demo is not None:
        if not (args.record_demo / "demo_summary.json").is_file():
            parser.error(f"--record_demo {args.record_demo}: no demo_summary.json there (run `make demo` first)")
        print(f"recorded {record_demo(args.record_demo)}")
    if args.check:
        found = disagreements() + stale_figures() + wrong_flags() + broken_links() + missing_commits()
        print("\n".join(found) or "every page agrees with its results")
        return 1 if found else 0
    for path in fix():
        print(f"rewrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
