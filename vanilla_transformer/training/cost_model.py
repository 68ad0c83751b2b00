"""What the paper's full WMT14 runs cost on the GPU a device check measured: the bf16 training step of ours at the
paper's batch (scripts/device_check.sh's `paper_batch_training`), projected to 100k (base) and 300k (big) steps on
1, 8 and 64 GPUs. `scripts/recipes/wmt14_en_de.py --cost_table --step_times REPORT` prints it."""

from __future__ import annotations

from pathlib import Path

# §5.1: about 25,000 source and 25,000 target tokens a step. §5.2: base 100k steps in 12 hours, big 300k in 3.5
# days, on 8 P100s.
TOKENS_PER_SIDE = 25_000
PAPER_RUNS = {"base": dict(steps=100_000, gpus=8, hours=12.0), "big": dict(steps=300_000, gpus=8, hours=84.0)}
COLUMNS = ["model", "steps", "step on 1 GPU", "1 GPU", "8 GPUs", "64 GPUs", "GPU-hours", "paper (8 P100)",
           "measured as"]


def measured_step_seconds(report: dict) -> dict[str, dict]:
    """Seconds per optimizer step of 25k + 25k real tokens for each preset the report measured: its compiled bf16
    step of ours at the paper's batch, else the eager one (where compiling failed on that machine), scaled to the
    paper's tokens at the measured throughput."""
    paper_batch = report["sections"].get("paper_batch_training", {}).get("result") or {}
    tokens = paper_batch.get("source_tokens", 0) + paper_batch.get("target_tokens", 0)
    found = {}
    for preset in PAPER_RUNS:
        systems = paper_batch.get("presets", {}).get(preset, {}).get("systems", {})
        measured = next((name for name in ("ours_compiled", "ours_eager") if name in systems), None)
        if measured is not None:
            seconds = systems[measured]["step_ms"] / 1e3
            found[preset] = {"step_s": seconds * 2 * TOKENS_PER_SIDE / tokens,
                             "how": f"{measured.split('_')[1]} bf16 step at the paper batch"}
    return found


def cost_table(report: dict, source: Path) -> str:
    """The projection as markdown; a report without a paper-batch step of ours says so instead of a table."""
    device = report.get("environment", {}).get("gpu") or "the GPU"
    measured = measured_step_seconds(report)
    if not measured:
        return (f"`{source}` has no bf16 training step of ours at the paper's batch (the device check's "
                "paper_batch_training section): nothing to project.")
    rows = [COLUMNS, ["---"] * len(COLUMNS)]
    for preset, m in measured.items():
        paper = PAPER_RUNS[preset]
        hours = paper["steps"] * m["step_s"] / 3600
        rows.append([preset, f"{paper['steps']:,}", f"{m['step_s'] * 1e3:.0f} ms", f"{hours:.1f} h",
                     f"{hours / 8:.2f} h", f"{hours / 64 * 60:.0f} min", f"{hours:.1f}",
                     f"{paper['hours']:.0f} h = {paper['hours'] * paper['gpus']:.0f} GPU-hours", m["how"]])
    return "\n".join([
        f"Projected from `{source}` ({device}). Data parallelism is assumed to scale linearly, so the 8- and 64-GPU "
        "rows are lower bounds on the time: at 64 GPUs the paper's 25k-token batch leaves each card about 400 tokens "
        "per step.", "",
        *("| " + " | ".join(row) + " |" for row in rows)])
