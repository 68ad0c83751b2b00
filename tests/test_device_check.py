"""scripts/device_check.sh, the GPU check, in its CPU smoke mode: every section's code runs end to end with tiny
sizes, and without CUDA it says so and exits cleanly."""

import math
import sys
from pathlib import Path

import pytest
import torch

from scripts.utils.reports import device_check_report

REPO = Path(__file__).resolve().parents[1]


def _device_check(*args, **env):
    import os
    import subprocess

    environment = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", **env}
    environment.pop("OUT", None)
    return subprocess.run(["bash", str(REPO / "scripts" / "device_check.sh"), *args], cwd=REPO, env=environment,
                          capture_output=True, text=True, timeout=300)


def test_device_check_without_cuda_says_so_and_exits_cleanly(tmp_path):
    out = tmp_path / "out"
    result = _device_check("--out", str(out), CUDA_VISIBLE_DEVICES="")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "no CUDA device" in result.stdout
    assert not out.exists()


def test_device_check_cpu_smoke_runs_every_section(tmp_path):
    """The GPU check's code end to end on the CPU with tiny sizes: bf16 matmul, attention agreement, the bf16
    training step at the paper's batch (ours and Marian, eager and compiled), our loss kernel against torch's,
    `make bench`'s run on the check's device, and a 20-step `scripts/train.py --bf16` run whose loss must
    fall."""
    import json

    out = tmp_path / "out"
    result = _device_check("--cpu_smoke", "--out", str(out))
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    report = json.loads((out / "device_check.json").read_text())
    markdown = (out / "device_check.md").read_text()
    assert report["ok"] and report["cpu_smoke"] and report["complete"]
    sections = report["sections"]
    assert list(sections) == ["environment", "matmul_peak", "attention_agreement", "paper_batch_training",
                              "kernels", "benchmark", "training_run"]  # the paper batch right after the checks
    agreement = sections["attention_agreement"]["result"]["padded"]
    assert agreement["eager/fp32"] == 0.0 and agreement["sdpa/fp32"] < 1e-4
    assert agreement["sdpa/bf16"] < 0.25 and agreement["eager/bf16"] < 0.25
    paper = sections["paper_batch_training"]["result"]
    assert paper["errors"] == {} and paper["failures"] == [] and paper["compile_backend"] == "aot_eager"
    assert paper["rows"] == 16 and paper["width"] == 8  # ~96 real tokens a side (lengths average 6 of 8)
    assert 16 * 4 <= paper["source_tokens"] <= 16 * 8 and 16 * 4 <= paper["target_tokens"] <= 16 * 8
    tiny = paper["presets"]["tiny"]
    systems = tiny["systems"]
    assert list(systems) == ["ours_eager", "ours_compiled", "marian_eager", "marian_compiled"]
    tokens = paper["source_tokens"] + paper["target_tokens"]
    for name, system in systems.items():  # every derived figure follows from the measured step time
        step_s = system["step_ms"] / 1e3
        assert system["loss_finite"] and system["tokens_per_s"] == pytest.approx(tokens / step_s), name
        assert system["model_tflops"] == pytest.approx(tiny["model_tflop_per_step"] / step_s), name
        assert system["mfu"] == pytest.approx(system["model_tflops"] / sections["matmul_peak"]["result"]["best_tflops"]), name
        assert system["peak_memory_gib"] is None, name  # no CUDA: no peak
    speed = {name: systems[name]["step_ms"] for name in systems}
    assert tiny["compiled_speed_vs_marian_compiled"] == pytest.approx(speed["marian_compiled"] / speed["ours_compiled"])
    assert tiny["eager_speed_vs_marian_eager"] == pytest.approx(speed["marian_eager"] / speed["ours_eager"])
    assert tiny["compiled_speed_vs_eager"] == pytest.approx({n: speed[f"{n}_eager"] / speed[f"{n}_compiled"]
                                                             for n in ("ours", "marian")})
    kernels = sections["kernels"]["result"]  # our loss against torch's, in both precisions
    assert [row["dtype"] for row in kernels] == ["float32", "bfloat16"]
    assert all(row["loss_gap"] < 1e-4 for row in kernels)  # our loss and F.cross_entropy's agree
    assert "| kernel (forward + backward) | dtype | ours | torch | torch / ours |" in markdown
    bench = sections["benchmark"]["result"]  # make bench's run, on the check's device
    assert bench["spec"]["device"] == "cpu" and bench["spec"]["preset"] == "tiny" and "memory_mib" not in bench
    assert bench["checks"]["uncached_greedy_equals_ours"] and bench["checks"]["uncached_beam_equals_ours"]
    for workload in ("train", "greedy", "beam"):
        systems = bench[workload]["systems"]
        assert bench["ratios"][f"{workload}_speed_vs_marian"] == pytest.approx(
            systems["marian"]["median_s"] / systems["ours"]["median_s"]), workload
    run = sections["training_run"]["result"]
    assert run["loss_falls"] and math.isfinite(run["last_logged_loss"])
    assert "## paper_batch_training" in markdown and "All checks passed: **yes**" in markdown
    assert "| name | step_ms | tokens_per_s | model_tflops | mfu | peak_memory_gib | compile_s | loss_finite |" in markdown
    assert all(f"| {name} | " in markdown for name in tiny["systems"])
    assert "compiled_speed_vs_marian_compiled" in markdown
    assert "## Benchmark: preset `tiny`" in markdown and "### Verdicts" in markdown  # one level down
    assert "## training_run" in markdown and "loss_falls: yes" in markdown and "Incomplete" not in markdown


def test_device_check_paper_batch_keeps_the_systems_that_compile_and_fails_without_ours_compiled():
    """A compile that fails (as inductor does without a C compiler) is recorded for its system; the eager systems
    are still measured, and the section fails because our compiled step did not run."""
    import time

    from scripts.benchmarks import device_check
    from torch._dynamo import register_backend

    @register_backend
    def vt_failing_backend(graph_module, example_inputs):
        raise RuntimeError("no C compiler")

    settings = {**device_check.CPU_SMOKE_SETTINGS}
    settings["paper"] = {**settings["paper"], "compile_backend": "vt_failing_backend", "timed_steps": 1}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = device_check.paper_batch_training(torch.device("cpu"), settings, None, time.perf_counter() + 600)
    finally:
        torch.set_num_threads(threads)
    assert set(result["errors"]) == {"tiny/ours_compiled", "tiny/marian_compiled"}
    assert "no C compiler" in result["errors"]["tiny/ours_compiled"]
    tiny = result["presets"]["tiny"]
    assert list(tiny["systems"]) == ["ours_eager", "marian_eager"]
    assert all(system["mfu"] is None for system in tiny["systems"].values())  # no matmul peak was passed
    systems = tiny["systems"]
    assert tiny["eager_speed_vs_marian_eager"] == pytest.approx(systems["marian_eager"]["step_ms"] /
                                                                systems["ours_eager"]["step_ms"])
    assert tiny["compiled_speed_vs_eager"] == {"ours": None, "marian": None}
    assert result["failures"] == ["tiny: ours_compiled did not run"]
    report = {"cpu_smoke": True, "wall_s": 1.0, "ok": False, "complete": False,
              "sections": {"paper_batch_training": {"ok": False, "result": result, "error": "; ".join(result["failures"])}}}
    markdown = device_check_report(report)
    assert "| ours_eager | " in markdown and "| ours_compiled | " not in markdown
    assert "errors: tiny/ours_compiled " in markdown and "no C compiler" in markdown
    assert "**Incomplete**" in markdown and "All checks passed: **no**" in markdown
