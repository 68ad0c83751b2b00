"""The tables of scripts/recipes/README.md: what the recipes score as they ship, from the records their runs wrote
(results/multi30k_<recipe>.json, `multi30k_en_de.py --record`), and how they were chosen, from the log of every
earlier run (results/multi30k_recipes.json: each run's commit, machine, length and scores). `pages.py` calls them by
the block names in `RECIPE_BLOCKS`, each with the log, the results folder and the reader that notes what it read."""

from pathlib import Path

from .reports import markdown_table


def table(header: list[str], rows: list[list]) -> str:
    """A rendered block's table: its markdown lines and a final newline."""
    return "\n".join(markdown_table(header, rows)) + "\n"


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


def shipped(data, results: Path, read):
    """The literature's figure beside each recipe's recorded run, in the literature's BLEU and in sacreBLEU."""
    lit = data["literature"]["wu2021"]
    rows = [[lit["label"], DASH, DASH, lit["hardware"], count(lit["updates"]), DASH, METRIC_NAMES["multi30k_bleu"],
             *(bleu(lit.get(s)) for s in SETS)]]
    for path in sorted(results.glob("multi30k_*.json")):
        if path.name == "multi30k_recipes.json":
            continue
        run = read(path)
        machine = f"{run['environment']['cpu'].replace('(R)', '').replace(' Processor', '')}, {run['precision']}"
        rows += [[run["recipe"], run["environment"]["commit"], str(run["seed"]), machine, count(run["updates"]),
                  minutes(run["command_minutes"]), METRIC_NAMES[metric], *(score(run, s, metric) for s in SETS)]
                 for metric in ("multi30k_bleu", "sacrebleu")]
    return table(["recipe", "commit", "seed", "machine", "updates", "minutes", "BLEU", "validation", "test2016",
                  "test2017", "MSCOCO"], rows)


def wu2021_runs(data, *_):
    rows = [[str(r["order"]), r["label"], text(r["commit"]), text(r["precision"]), count(r["updates"]),
             minutes(r["command_minutes"]), text(r["stopped_by"]), *(score(r, s, "multi30k_bleu") for s in SETS)]
            for r in series(data, "literature")]
    return table(["#", "change", "commit", "precision", "updates", "minutes", "stopped by", "validation",
                  "test2016", "test2017", "MSCOCO"], rows)


def wu2021_sacrebleu(data, *_):
    def cell(r, s):
        sc = r["scores"].get(s) or {}
        return " / ".join(bleu(sc.get(m)) for m in ("sacrebleu", "sacrebleu_lowercased", "chrf"))
    rows = [[str(r["order"]), r["label"], *(cell(r, s) for s in SETS)] for r in series(data, "literature")]
    return table(["#", "change", "validation", "test2016", "test2017", "MSCOCO"], rows)


def ablations(data, *_):
    rows = [[str(r["order"]), r["label"], text(r["commit"]), text(r["seed"]), count(r["updates"]),
             minutes(r["command_minutes"]), score(r, "validation", "sacrebleu"),
             score(r, "validation", "sacrebleu_lowercased"), kept(r["kept"]), text(r["note"])]
            for r in series(data, "hour")]
    return table(["#", "change", "commit", "seed", "steps", "minutes", "validation", "lowercased", "kept", "note"],
                 rows)


def hour_greedy(data, *_):
    rows = [[str(r["order"]), r["label"], text(r["seed"]), *(bleu(r["greedy_curve"].get(str(k))) for k in GREEDY_STEPS)]
            for r in series(data, "hour")
            if any(str(k) in r.get("greedy_curve", {}) for k in GREEDY_STEPS)]
    return table(["#", "change", "seed", *(f"{k:,}" for k in GREEDY_STEPS)], rows)


def rescoring(data, *_):
    runs, groups = by_id(data), {}
    for e in data["rescoring"]:
        groups.setdefault((e["run"], e["weights"]), {})[e["decoding"]] = e["validation_sacrebleu"]
    rows = [[str(runs[rid]["order"]), runs[rid]["label"], text(runs[rid]["seed"]), weights,
             *(bleu(cells.get(d)) for d in DECODINGS)] for (rid, weights), cells in groups.items()]
    return table(["#", "change", "seed", "checkpoints averaged", *DECODINGS], rows)


def throughput(data, *_):
    def seconds(e):
        if e["seconds"]:
            return " / ".join(f"{x:.1f}" for x in e["seconds"])
        return DASH if e["seconds_mean"] is None else f"{e['seconds_mean']:.1f} mean"
    rows = [[e["study"], text(e["commit"]), e["setting"], seconds(e),
             " / ".join(f"{x:.1f}" for x in e["epochs_per_hour"]) or DASH, text(e["note"])]
            for e in data["throughput"]]
    return table(["study", "commit", "setting", "seconds", "epochs an hour", "note"], rows)


RECIPE_BLOCKS = {"multi30k_shipped": shipped, "multi30k_wu2021_runs": wu2021_runs,
                 "multi30k_wu2021_sacrebleu": wu2021_sacrebleu, "multi30k_ablations": ablations,
                 "multi30k_hour_greedy": hour_greedy, "multi30k_rescoring": rescoring,
                 "multi30k_throughput": throughput}
