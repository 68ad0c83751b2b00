"""Pages that cannot drift: every figure a page quotes is rendered from the committed results file that measured it.

    python -m scripts.benchmarks.pages            # rewrite every rendered block and report from its results
    python -m scripts.benchmarks.pages --check    # exit 1, naming each page that disagrees with its results
    python -m scripts.benchmarks.pages --record_demo demo_output   # results/demo.json from a `make demo` run

A page marks a rendered block with a line `<!-- rendered: NAME -->` and a line `<!-- end: NAME -->`; NAME is a key of
`BLOCKS`, a function of the results folder. A report, results/STEM.md, is its benchmark's own renderer applied to
results/STEM.json. transformers keeps its documentation honest the same way (`utils/check_copies.py`,
`make fix-copies`); tests/test_pages.py runs the check.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from .recipe_tables import RECIPE_BLOCKS, load_recipes, table

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "scripts" / "benchmarks" / "results"
PAGES = ("README.md", "scripts/recipes/README.md", "scripts/benchmarks/README.md", "scripts/accelerate/README.md",
         "model_cards/README.md")
BLOCK = re.compile(r"^<!-- rendered: (?P<name>[\w-]+) -->\n(?P<body>.*?)^<!-- end: (?P=name) -->$",
                   re.MULTILINE | re.DOTALL)
ENGINE_SYSTEMS = ("onnxruntime float32", "onnxruntime int8", "ctranslate2 float32", "ctranslate2 int8")
LITERATURE_SETS = {"validation": "validation", "test2016": "test2016", "test2017": "test2017",
                   "mscoco2017": "MSCOCO 2017"}


def load(name: str, results: Path = RESULTS) -> dict:
    return json.loads((results / f"{name}.json").read_text(encoding="utf-8"))


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
    runs = [json.loads(path.read_text(encoding="utf-8")) for path in sorted(results.glob("engines_*.json"))]
    return sorted(runs, key=lambda run: run["environment"]["cpu"], reverse=True)


def parity_runs(results: Path = RESULTS) -> list[dict]:
    runs = [json.loads(path.read_text(encoding="utf-8")) for path in sorted(results.glob("parity_multi30k*.json"))]
    return sorted(runs, key=lambda run: run["settings"]["seed"])


def shipped_run(recipes: dict, recipe: str) -> dict:
    wanted = recipes["shipped"][recipe]
    return next(run for run in recipes["runs"] if run["id"] == wanted)


def _run_machine(run: dict) -> str:
    return f"{cpu_name({'cpu': run['cpu'], 'cpu_flags': run['cpu_flags'].split()})}, {run['precision']}"


def speedup(report: dict, decoding: str, system: str) -> str:
    return f"{report['speed']['rows'][decoding][system]['speed_vs_generate']:.2f}×"


# ---------------------------------------------------------------------------------------------- README blocks
def glance(results: Path = RESULTS) -> str:
    recipes, bench = load("multi30k_recipes", results), load("results_small", results)
    wu, hour = shipped_run(recipes, "wu2021"), shipped_run(recipes, "hour")
    literature = recipes["literature"]["wu2021"]
    gaps = [run["bleu_gap"] for run in parity_runs(results)]
    ratios = bench["ratios"]
    engines = engine_reports(results)
    rows = [
        ["Multi30k test2016, the literature's BLEU", f"**{wu['scores']['test2016']['multi30k_bleu']:.2f}**",
         f"{literature['test2016']:.2f}, Wu et al. (2021) on {literature['hardware']}",
         f"`--recipe wu2021`, {wu['command_minutes']:.0f} min on {_run_machine(wu)}",
         "[recipes](scripts/recipes/README.md#like-for-like-with-the-literature-wu-et-al-2021s-transformer-tiny)"],
        ["Multi30k validation sacreBLEU in an hour", f"{hour['scores']['validation']['sacrebleu']:.2f}",
         "–", f"the default recipe, {hour['command_minutes']:.0f} min on {_run_machine(hour)}",
         "[recipes](scripts/recipes/README.md#the-hours-recipe-the-default)"],
        ["BLEU against `MarianMTModel`, same shape and training", f"{sum(gaps) / len(gaps):+.2f} (mean of "
         f"{len(gaps)} seeds)", "0: level", "`python -m scripts.benchmarks.quality_parity`",
         "[parity](scripts/benchmarks/README.md#quality-parity-with-marianmtmodel)"],
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
            cpu = f"[{cpu_name(report['environment'])}](scripts/benchmarks/results/engines_{_slug(report)}.md)"
            rows.append([decoding, cpu, f"{row['generate()']['sentences_per_s']:.1f}",
                         *(speedup(report, decoding, system) for system in ENGINE_SYSTEMS)])
    return table(header, rows)


def _slug(report: dict) -> str:
    from .toolkit import cpu_slug

    return cpu_slug(report["environment"])


def serving_reports(results: Path = RESULTS) -> list[dict]:
    return [json.loads(path.read_text(encoding="utf-8")) for path in sorted(results.glob("serving_*.json"))]


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
                         f"[{cpu_name(report['environment'])}](scripts/benchmarks/results/serving_{_slug(report)}.md)"])
    return rows


SERVING_HEADER = ["server", "32 clients, sentences/s (spread of 3 runs)", "of the engine alone",
                  "p50 at 1 client (ms over one call)", "answers equal to the engine's", "CPU (its report)"]


def serving(results: Path = RESULTS) -> str:
    """Each server at 32 clients (the median of its runs, and their spread) against its engine alone, its p50 at one
    client against one translate call, and the share of its answers equal to the engine's own."""
    return table(SERVING_HEADER, _serving_rows(results))


def serving_glance(results: Path = RESULTS) -> str:
    """The README's rows of `serving`: the server as it ships, Ray Serve's Python proxy, and what a user writes first."""
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


DATA_STAGE, DATA_STAGE_BEFORE = "data_stage_intel_xeon", "data_stage_intel_xeon_before"


def data_stage_table(results: Path = RESULTS) -> str:
    stage = load(DATA_STAGE, results)
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


def data_stage_change(results: Path = RESULTS) -> str:
    """The largest corpus before and after the data stage moved onto datasets' builder, on the same machine."""
    before, now = load(DATA_STAGE_BEFORE, results), load(DATA_STAGE, results)
    (old,), (new,) = ([size for size in run["sizes"] if size["pairs"] == now["sizes"][-1]["pairs"]]
                      for run in (before, now))
    rows = []
    for cache in ("cold", "warm"):
        for label, value, unit in (("read", lambda r: r["stages"]["read"]["seconds"], "{:.1f} s"),
                                   ("whole command", lambda r: r["seconds"] / 60, "{:.2f} min"),
                                   ("peak RSS", lambda r: r["peak_rss_mib"], "{:,} MiB")):
            was, is_ = value(old[cache]), value(new[cache])
            if unit.format(was) != unit.format(0):  # a warm read takes no time worth a ratio
                rows.append([f"{new['pairs']:,}, {cache}", label, unit.format(was), unit.format(is_),
                             f"{is_ / was:.2f}×"])
    commits = (before["environment"]["commit"], now["environment"]["commit"])
    return table(["pairs, cache", "", f"before ({commits[0]})", f"now ({commits[1]})", "now / before"], rows)


def parity_table(results: Path = RESULTS) -> str:
    rows = []
    for run in parity_runs(results):
        seed = run["settings"]["seed"]
        for kind, name in (("ours", "ours"), ("marian", "MarianMTModel")):
            losses = {entry["step"]: entry["eval_loss"] for entry in run["runs"][kind]["log_history"]
                      if "eval_loss" in entry}
            rows.append([name + (f", `--seed {seed}`" if seed else ""),
                         " / ".join(f"{losses[step]:.3f}" for step in (4000, 6000, max(losses))),
                         f"{run['runs'][kind]['bleu']:.2f}", f"{run['runs'][kind]['chrf']:.2f}"])
    return table(["", "validation loss at 4,000 / 6,000 / last step", "BLEU", "chrF"], rows)


def kernels_table(results: Path = RESULTS) -> str:
    rows = []
    for path in sorted(results.glob("kernels_*.json"), reverse=True):
        kernels = json.loads(path.read_text(encoding="utf-8"))
        rows += [[cpu_name(kernels["environment"]), "loss" if kernel == "loss" else "dropout (`packed_dropout`)",
                  row["dtype"], f"{row[f'{kernel}_ours_ms']:.1f} ms", f"{row[f'{kernel}_torch_ms']:.1f} ms",
                  f"{row[f'{kernel}_torch_ms'] / row[f'{kernel}_ours_ms']:.2f}×"]
                 for kernel in ("loss", "dropout") for row in kernels["rows"]]
    return table(["CPU", "kernel (forward + backward)", "dtype", "ours", "torch", "torch / ours"], rows)


BLOCKS: dict[str, Callable[[Path], str]] = {
    "glance": glance, "demo_output": demo_output, "engines": engines, "serving": serving,
    "serving_glance": serving_glance,
    "peer_benchmark": peer_benchmark, "engines_report": engines_report, "data_stage": data_stage_table,
    "data_stage_change": data_stage_change,
    "parity": parity_table, "kernels": kernels_table,
    **{name: (lambda results, block=block: block(load_recipes(results))) for name, block in RECIPE_BLOCKS.items()},
}


# ---------------------------------------------------------------------------------------------- reports
def reports(results: Path = RESULTS) -> dict[Path, str]:
    """Each committed report as its benchmark renders it from the committed JSON beside it."""
    from . import data_stage, engines as engines_benchmark, quality_parity, report, serving as serving_benchmark

    rendered = {}
    for path in sorted(results.glob("*.json")):
        data, stem = json.loads(path.read_text(encoding="utf-8")), path.stem
        if stem.startswith("engines_"):
            rendered[path.with_suffix(".md")] = engines_benchmark.render(data, data["command"])
        elif stem.startswith("results_"):
            rendered[path.with_suffix(".md")] = report.render_markdown(data)
        elif stem.startswith("data_stage_"):
            rendered[path.with_suffix(".md")] = data_stage.render(data)
        elif stem.startswith("serving_"):
            rendered[path.with_suffix(".md")] = serving_benchmark.render(data, data["command"])
        elif stem.startswith("parity_"):
            rendered[path.with_suffix(".md")] = quality_parity.render_report(data, data["command"], f"{stem}.png")
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


def disagreements(root: Path = ROOT, results: Path = RESULTS) -> list[str]:
    """Every page and report whose text differs from what its results render, each with its first differing line."""
    found = []
    targets = {root / page: None for page in PAGES if (root / page).is_file()}
    targets.update(reports(results))
    for path, expected in targets.items():
        text = path.read_text(encoding="utf-8")
        expected = render_page(text, results, str(path.relative_to(root))) if expected is None else expected
        if text != expected:
            line = next((i for i, (a, b) in enumerate(zip(text.splitlines(), expected.splitlines()), 1) if a != b),
                        min(len(text.splitlines()), len(expected.splitlines())) + 1)
            found.append(f"{path.relative_to(root)}:{line} disagrees with its results "
                         f"(`python -m scripts.benchmarks.pages` rewrites it)")
    return found


def fix(root: Path = ROOT, results: Path = RESULTS) -> list[Path]:
    changed = []
    for page in PAGES:
        path = root / page
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            if (new := render_page(text, results, page)) != text:
                path.write_text(new, encoding="utf-8")
                changed.append(path)
    for path, text in reports(results).items():
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed


# ------------------------------------------------------------------------------------------ commands, links, commits
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.MULTILINE)
COMMIT = re.compile(r"(?<![\w/.@+-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w.-])")
SCRIPT = re.compile(r"^(?:\./)?(scripts/[\w/]+\.(?:py|sh))$")


def markdown_pages(root: Path = ROOT) -> list[Path]:
    """Every page a person reads: the READMEs and reports (the model card template is filled in, not read)."""
    return sorted(path for path in root.glob("**/*.md") if not _ignored(path.relative_to(root)))


def _ignored(relative: Path) -> bool:
    parts = relative.parts
    return (parts[0].startswith(".") or "node_modules" in parts or parts[0] in ("runs", "demo_output", "build")
            or relative.name == "model_card_template.md" or parts[:2] == ("tests", "upstream"))


def _prose(text: str) -> str:
    return FENCE.sub("", text)


def command_lines(text: str) -> list[str]:
    """Commands a page shows: lines of its code blocks (continuations joined) and inline code spans."""
    commands = []
    for block in FENCE.findall(text):
        commands += [line.split(" #")[0].strip() for line in block.replace("\\\n", " ").splitlines()]
    commands += INLINE_CODE.findall(_prose(text))
    return [command for command in commands if command]


def _script_and_flags(command: str, root: Path) -> tuple[str, list[str]] | None:
    """The project script a command runs (a path or `-m scripts.…`) and the flags given to it, or None."""
    words = command.replace("=", " ").split()
    for i, word in enumerate(words):
        module = words[i + 1] if word == "-m" and i + 1 < len(words) else None
        if module and re.fullmatch(r"scripts(\.[a-z_]+)+", module):  # not a placeholder such as scripts.NAME
            script = module.replace(".", "/") + ".py"
        elif SCRIPT.match(word):
            script = SCRIPT.match(word)[1]
        else:
            continue
        return (script if (root / script).is_file() else f"{script} (missing)",
                [w for w in words[i + 1:] if w.startswith("--") and len(w) > 2])
    return None


def known_flags(script: str, root: Path = ROOT, cache: dict | None = None) -> set[str]:
    """The flags `script --help` lists; a recipe that passes the rest on to scripts/train.py accepts its flags too,
    and a shell wrapper accepts those of the script it runs."""
    cache = {} if cache is None else cache
    if script in cache:
        return cache[script]
    source = (root / script).read_text(encoding="utf-8")
    if script.endswith(".sh"):
        wrapped = SCRIPT.match(next(w for w in source.split() if SCRIPT.match(w) and w != script))[1]
        flags = known_flags(wrapped, root, cache)
    else:
        flags = _help_flags(script, root)
        if "parse_known_args" in source:
            flags |= known_flags("scripts/train.py", root, cache)
    cache[script] = flags
    return flags


def _help_flags(script: str, root: Path) -> set[str]:
    import contextlib
    import io
    import runpy
    import warnings

    out, argv = io.StringIO(), sys.argv
    sys.argv = [script, "--help"]
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module was imported before, as here
            runpy.run_module(script.removesuffix(".py").replace("/", "."), run_name="__main__")
    finally:
        sys.argv = argv
    return set(re.findall(r"(?<![\w-])--[A-Za-z][\w-]*", out.getvalue()))


def launcher_flags() -> set[str]:
    """Flags of the launchers the pages put before a script: accelerate launch and torchrun."""
    from accelerate.commands.launch import launch_command_parser
    from torch.distributed.run import get_args_parser

    return {option for parser in (launch_command_parser(), get_args_parser()) for action in parser._actions
            for option in action.option_strings if option.startswith("--")}


def wrong_flags(root: Path = ROOT) -> list[str]:
    """Each flag a page passes to a project script that the script does not know, and each inline flag (`--x`) no
    project script or launcher knows."""
    cache, found, everything = {}, [], None
    for page in markdown_pages(root):
        if page.parent.name == "results":  # a report quotes the command as it ran then
            continue
        text = page.read_text(encoding="utf-8")
        for command in command_lines(text):
            target = _script_and_flags(command, root)
            if target is not None:
                script, flags = target
                if script.endswith("(missing)"):
                    found.append(f"{page.relative_to(root)}: `{command}` runs {script}")
                    continue
                found += [f"{page.relative_to(root)}: {script} has no {flag} (in `{command}`)"
                          for flag in flags if flag not in known_flags(script, root, cache)]
            elif command.startswith("--"):
                if everything is None:
                    scripts = sorted({str(p.relative_to(root)) for p in root.glob("scripts/**/*.py")
                                      if "__" not in p.name and "def main" in p.read_text(encoding="utf-8")})
                    everything = launcher_flags().union(*(known_flags(s, root, cache) for s in scripts))
                flag = command.split()[0].split("=")[0]
                if flag not in everything:
                    found.append(f"{page.relative_to(root)}: no script or launcher knows {flag} (in `{command}`)")
    return found


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def broken_links(root: Path = ROOT) -> list[str]:
    """Each relative link whose file, or whose #anchor among that file's headings, does not exist."""
    found = []
    for page in markdown_pages(root):
        for target in LINK.findall(_prose(page.read_text(encoding="utf-8"))):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                found.append(f"{page.relative_to(root)}: link to {target}: no such file")
            elif anchor and linked.suffix == ".md":
                anchors = {github_anchor(h) for h in HEADING.findall(_prose(linked.read_text(encoding="utf-8")))}
                if anchor not in anchors:
                    found.append(f"{page.relative_to(root)}: link to {target}: no heading #{anchor} there")
    return found


def named_commits(root: Path = ROOT) -> dict[str, set[str]]:
    """Every commit a page or a results file names, with where (a hash after `@` or `/` is another repository's)."""
    named = {}
    for path in [*markdown_pages(root), *sorted((root / "scripts" / "benchmarks" / "results").glob("*.json"))]:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            text = " ".join(re.findall(r'"commit": "([0-9a-f]+)\+?"', text))
        for commit in COMMIT.findall(text):
            named.setdefault(commit, set()).add(str(path.relative_to(root)))
    return named


def missing_commits(root: Path = ROOT, repository: Path = ROOT) -> list[str]:
    import subprocess

    found = []
    for commit, where in sorted(named_commits(root).items()):
        exists = subprocess.run(["git", "-C", str(repository), "cat-file", "-e", f"{commit}^{{commit}}"],
                                capture_output=True).returncode == 0
        if not exists:
            found.append(f"{', '.join(sorted(where))}: commit {commit} is not in this repository's history")
    return found


def record_demo(demo_dir: Path, results: Path = RESULTS) -> Path:
    """results/demo.json from a finished `make demo` folder, with the machine and commit it ran on."""
    from .toolkit import environment

    summary = json.loads((demo_dir / "demo_summary.json").read_text(encoding="utf-8"))
    test = json.loads((demo_dir / "model" / "results.json").read_text(encoding="utf-8"))["test"]
    record = {"command": "make demo", "environment": environment(), **summary,
              "num_sentences": test["num_sentences"], "examples": test["examples"]}
    path = results / "demo.json"
    path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="Change nothing; exit 1 where a page disagrees with its results or names a flag, link "
                             "or commit that does not exist.")
    parser.add_argument("--record_demo", type=Path, metavar="DEMO_OUTPUT_DIR",
                        help="Record a finished `make demo` folder as results/demo.json, then render.")
    args = parser.parse_args(argv)
    if args.record_demo is not None:
        if not (args.record_demo / "demo_summary.json").is_file():
            parser.error(f"--record_demo {args.record_demo}: no demo_summary.json there (run `make demo` first)")
        print(f"recorded {record_demo(args.record_demo)}")
    if args.check:
        found = disagreements() + wrong_flags() + broken_links() + missing_commits()
        print("\n".join(found) or "every page agrees with its results")
        return 1 if found else 0
    for path in fix():
        print(f"rewrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
