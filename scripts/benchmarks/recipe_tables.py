"""The tables of scripts/recipes/README.md, rendered from results/multi30k_recipes.json (each Multi30k run the
recipes report: commit, machine, length and scores). `pages.py` calls them by the block names in `RECIPE_BLOCKS`."""

import json
from pathlib import Path

from .toolkit import markdown_table


def table(header: list[str], rows: list[list]) -> str:
    """A rendered block's table: its markdown lines and a final newline."""
    return "\n".join(markdown_table(header, rows)) + "\n"


def load_recipes(results: Path) -> dict:
    return json.loads((results / "multi30k_recipes.json").read_text(encoding="utf-8"))


DASH = "–"
SETS = ("validation", "test2016", "test2017", "mscoco2017")
METRIC_NAMES = {"multi30k_bleu": "literature's", "sacrebleu": "sacreBLEU"}
GREEDY_STEPS = [1000 * i for i in range(1, 9)]
DECODINGS = ["greedy", "beam 4, α 0.6", "beam 4, α 1.0", "beam 4, α 0", "beam 5, α 1.0", "beam 6, α 0.6"]


def bleu(x):
    return DASH if x is None else f"{x:.2f}"


def count(x):
    return DASH if x is None else f"{x:,}"


def minutes(x):
    return DASH if x is None else f"{x:.1f}"


def text(x):
    return DASH if x is None else str(x)


def kept(x):
    return {True: "yes", False: "no", None: DASH}[x]


def score(run, split, metric):
    return bleu((run["scores"].get(split) or {}).get(metric))


def series(data, name):
    return sorted((r for r in data["runs"] if r["series"] == name), key=lambda r: r["order"])


def by_id(data):
    return {r["id"]: r for r in data["runs"]}


def shipped(data):
    runs, rows = by_id(data), []
    for entry in data["shipped_table"]:
        if "literature" in entry:
            lit = data["literature"][entry["literature"]]
            rows.append([lit["label"], DASH, DASH, lit["hardware"], count(lit["updates"]), DASH,
                         METRIC_NAMES["multi30k_bleu"], *(bleu(lit.get(s)) for s in SETS)])
            continue
        run, metric = runs[entry["run"]], entry["metric"]
        machine = DASH if run["cpu"] is None or run["precision"] is None else f"{run['cpu']}, {run['precision']}"
        rows.append([run["recipe"], text(run["commit"]), text(run["seed"]), machine, count(run["updates"]),
                     minutes(run["command_minutes"]), METRIC_NAMES[metric], *(score(run, s, metric) for s in SETS)])
    return table(["recipe", "commit", "seed", "machine", "updates", "minutes", "BLEU", "validation", "test2016",
                  "test2017", "MSCOCO"], rows)


def wu2021_runs(data):
    rows = [[str(r["order"]), r["label"], text(r["commit"]), text(r["precision"]), count(r["updates"]),
             minutes(r["command_minutes"]), text(r["stopped_by"]), *(score(r, s, "multi30k_bleu") for s in SETS)]
            for r in series(data, "literature")]
    return table(["#", "change", "commit", "precision", "updates", "minutes", "stopped by", "validation",
                  "test2016", "test2017", "MSCOCO"], rows)


def wu2021_sacrebleu(data):
    def cell(r, s):
        sc = r["scores"].get(s) or {}
        return " / ".join(bleu(sc.get(m)) for m in ("sacrebleu", "sacrebleu_lowercased", "chrf"))
    rows = [[str(r["order"]), r["label"], *(cell(r, s) for s in SETS)] for r in series(data, "literature")]
    return table(["#", "change", "validation", "test2016", "test2017", "MSCOCO"], rows)


def ablations(data):
    rows = [[str(r["order"]), r["label"], text(r["commit"]), text(r["seed"]), count(r["updates"]),
             minutes(r["command_minutes"]), score(r, "validation", "sacrebleu"),
             score(r, "validation", "sacrebleu_lowercased"), kept(r["kept"]), text(r["note"])]
            for r in series(data, "hour")]
    return table(["#", "change", "commit", "seed", "steps", "minutes", "validation", "lowercased", "kept", "note"],
                 rows)


def hour_greedy(data):
    rows = [[str(r["order"]), r["label"], text(r["seed"]), *(bleu(r["greedy_curve"].get(str(k))) for k in GREEDY_STEPS)]
            for r in series(data, "hour")
            if any(str(k) in r.get("greedy_curve", {}) for k in GREEDY_STEPS)]
    return table(["#", "change", "seed", *(f"{k:,}" for k in GREEDY_STEPS)], rows)


def rescoring(data):
    runs, groups = by_id(data), {}
    for e in data["rescoring"]:
        groups.setdefault((e["run"], e["weights"]), {})[e["decoding"]] = e["validation_sacrebleu"]
    rows = [[str(runs[rid]["order"]), runs[rid]["label"], text(runs[rid]["seed"]), weights,
             *(bleu(cells.get(d)) for d in DECODINGS)] for (rid, weights), cells in groups.items()]
    return table(["#", "change", "seed", "checkpoints averaged", *DECODINGS], rows)


def throughput(data):
    def seconds(e):
        if e["seconds"]:
            return " / ".join(f"{x:.1f}" for x in e["seconds"])
        return DASH if e["seconds_mean"] is None else f"{e['seconds_mean']:.1f} mean"
    rows = [[e["study"], text(e["commit"]), e["setting"], seconds(e),
             " / ".join(f"{x:.1f}" for x in e["epochs_per_hour"]) or DASH, text(e["note"])]
            for e in data["throughput"]]
    return table(["study", "commit", "setting", "seconds", "epochs an hour", "note"], rows)


def wmt14_tiny(data):
    rows = []
    for r in series(data, "wmt14_tiny"):
        t = r["scores"]["test"]
        rows.append([text(r["commit"]), count(r["updates"]), minutes(r["command_minutes"]), str(t["sentences"]),
                     bleu(t["sacrebleu"]), bleu(t["chrf"]), bleu(t["paper_bleu"])])
    return table(["commit", "steps", "minutes", "test sentences", "sacreBLEU", "chrF", "paper's BLEU"], rows)


RECIPE_BLOCKS = {"multi30k_shipped": shipped, "multi30k_wu2021_runs": wu2021_runs,
                 "multi30k_wu2021_sacrebleu": wu2021_sacrebleu, "multi30k_ablations": ablations,
                 "multi30k_hour_greedy": hour_greedy, "multi30k_rescoring": rescoring,
                 "multi30k_throughput": throughput, "multi30k_wmt14_tiny": wmt14_tiny}
