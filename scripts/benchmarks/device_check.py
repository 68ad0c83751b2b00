#!/usr/bin/env python
"""One-shot GPU check of vanilla_transformer (run it through scripts/device_check.sh).

On a CUDA machine it measures, in a few minutes and installing nothing:

1. attention agreement: logits of eager, SDPA and (when installed) flash-attention against fp32 eager on a
   padded batch, plus SDPA forced onto each of its kernels on an unpadded batch (bf16);
2. the bf16 training step at the paper's batch (§5.1: about 25,000 source and 25,000 target tokens; here
   ~1,040 rows of 32 positions per side, each row's length uniform in [16, 32] as in Multi30k, padded
   to 32 as --pad_to_multiple_of 8 pads) of the paper's base and big models, trained as Trainer --bf16 trains
   (autocast over fp32 weights, fused AdamW, dropout on, SDPA). Four systems per preset, timed interleaved:
   ours and MarianMTModel of the same shape, each eager and under torch.compile(model) (what Trainer
   --torch_compile does: inductor, default mode; the optimizer step stays eager). For each: step time,
   tokens/s, model TFLOP/s and model-FLOPs utilisation against the bf16 matmul peak measured on the same
   card, peak memory, compile seconds; ratios. scripts/benchmarks/cost_model.py projects the paper's runs
   from it;
3. beam search (beam 4, bf16 weights, fixed output length): tokens/s and peak memory;
4. `make bench`'s benchmark on this device (`peers.run_benchmark` with the spec's device; fp32, interleaved):
   ours vs MarianMTModel of the same shape and the textbook no-cache decoder, with the same floors,
   ceilings and report as on the CPU;
5. a short bf16 training run of scripts/train.py on the built-in task (small model) whose loss must fall.

It writes device_check.json and device_check.md to $OUT if set, else device_check_out/ (or --out).
It rewrites them after every section, so that a run stopped by the wrapper's time limit keeps what it measured.
Without CUDA it prints why and exits 0. `--cpu_smoke` runs the same code on the CPU with tiny sizes, for tests;
its numbers mean nothing (and it compiles with the aot_eager backend: inductor's C++ code generation takes
minutes on a small CPU).
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from . import toolkit
from .toolkit import markdown_table

REPO = Path(__file__).resolve().parents[2]

GIB = 2**30

GPU_SETTINGS = dict(
    attention=dict(preset="base", vocab_size=37000), matmul_size=8192, matmul_repeats=10,
    # 4 inductor compiles (~40-70 s each with 16 cores) dominate this section's few minutes; a preset not
    # started `start_by_s` seconds into the check is skipped, so that a slow compile cannot run the whole
    # check into the wrapper's 470 s kill.
    paper=dict(presets=("base", "big"), vocab_size=37000, tokens=25000, width=32, warmup_steps=3, timed_steps=8,
               compile_backend=None, start_by_s=250),
    beam=dict(preset="base", vocab_size=37000, batch=64, source_length=32, new_tokens=32, repeats=3),
    # BenchmarkSpec fields; the benchmark's compiled training step is left to the paper-batch section.
    benchmark=dict(preset="base", vocab_size=37000, batch_size=64, source_length=32, target_length=32,
                   generation_batch_size=64, new_tokens=30, curve_lengths=(10, 30, 100), repeats=3,
                   matmul_size=8192, compile_backend=None),
    run=dict(preset="small", vocab_size=4000, max_steps=150, batch=128, warmup=100, train_samples=20000,
             eval_samples=100, logging_steps=10, timeout_s=300, workers=2),
)
CPU_SMOKE_SETTINGS = dict(
    attention=dict(preset="tiny", vocab_size=1000), matmul_size=256, matmul_repeats=2,
    paper=dict(presets=("tiny",), vocab_size=1000, tokens=96, width=8, warmup_steps=0, timed_steps=1,
               compile_backend="aot_eager", start_by_s=300),
    beam=dict(preset="tiny", vocab_size=1000, batch=2, source_length=8, new_tokens=4, repeats=1),
    benchmark=dict(preset="tiny", vocab_size=1000, batch_size=4, source_length=8, target_length=8,
                   generation_batch_size=2, new_tokens=4, curve_lengths=(2,), repeats=1, warmup=0, matmul_size=128,
                   compile_backend=None),
    run=dict(preset="tiny", vocab_size=300, max_steps=20, batch=16, warmup=8, train_samples=320,
             eval_samples=4, logging_steps=2, timeout_s=150, workers=0),
)


def spec_on(device, **fields):
    """A benchmark spec on `device`, with this process's threads and no CPU memory measurement."""
    import torch

    from .workloads import BenchmarkSpec

    return BenchmarkSpec(**{"device": str(device), "memory": False, "threads": torch.get_num_threads(), **fields})


def reset_peak(device):
    import torch

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device):
    import torch

    return torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None


def flash_implementations() -> list[str]:
    from transformers.utils import import_utils

    found = []
    for name, check in (("flash_attention_2", "is_flash_attn_2_available"),
                        ("flash_attention_3", "is_flash_attn_3_available")):
        probe = getattr(import_utils, check, None)
        try:
            if probe is not None and probe():
                found.append(name)
        except Exception:  # a broken install counts as absent
            pass
    return found


# Sections ------------------------------------------------------------------------------------------------

def environment(device) -> dict:
    import accelerate
    import transformers

    return {**toolkit.environment(device), "device": str(device), "accelerate": accelerate.__version__,
            "transformers_path": str(Path(transformers.__file__).parent),
            "flash_attention_packages": flash_implementations()}


def matmul_peak(device, size, repeats) -> dict:
    """bf16 (size x size) @ (size x size): the practical peak this card reaches, the denominator of MFU."""
    import torch

    peak = toolkit.matmul_peak(size, repeats, device, torch.bfloat16)
    return {"size": size, "best_tflops": peak["flops"] / 1e12, "median_tflops": peak["median_flops"] / 1e12}


def attention_agreement(device, s) -> dict:
    """Max |logits - fp32 eager logits| for each implementation and dtype; the scale is max |fp32 logits|."""
    import torch

    from . import workloads

    spec = spec_on(device, **s["attention"], batch_size=8, source_length=32, target_length=24,
                   config_overrides={"dropout": 0.0})
    config = workloads.model_config(spec)
    padded = workloads.training_batch(spec, config, seed=1)
    generator = torch.Generator().manual_seed(2)
    ids, labels = (torch.randint(4, config.vocab_size, (8, n), generator=generator).to(device) for n in (32, 24))
    full = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    reference = workloads.build_model(spec, attn_implementation="eager").eval()

    def logits(impl, dtype, inputs, backend=None):
        model = workloads.build_model(spec, attn_implementation="eager").eval().to(dtype)
        model.set_attn_implementation(impl)
        context = torch.nn.attention.sdpa_kernel(backend) if backend is not None else torch.no_grad()
        with torch.no_grad(), context:
            return model(**inputs).logits.float()

    with torch.no_grad():
        ref_padded = reference(**padded).logits.float()
        ref_full = reference(**full).logits.float()
    out = {"preset": spec.preset, "logit_scale": ref_padded.abs().max().item(), "padded": {}, "unpadded": {}}
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    for impl in ["eager", "sdpa", *flash_implementations()]:
        for dname, dtype in dtypes.items():
            if impl.startswith("flash") and dtype == torch.float32:
                continue  # flash kernels take fp16/bf16 only
            key = f"{impl}/{dname}"
            try:
                out["padded"][key] = (logits(impl, dtype, padded) - ref_padded).abs().max().item()
            except Exception as error:  # noqa: BLE001 - recorded, not fatal
                out["padded"][key] = f"error: {type(error).__name__}: {error}"[:300]
    if device.type == "cuda":
        from torch.nn.attention import SDPBackend

        for name, backend in (("sdpa[flash kernel]", SDPBackend.FLASH_ATTENTION),
                              ("sdpa[efficient kernel]", SDPBackend.EFFICIENT_ATTENTION),
                              ("sdpa[math]", SDPBackend.MATH)):
            try:
                out["unpadded"][f"{name}/bf16"] = (logits("sdpa", torch.bfloat16, full, backend) - ref_full).abs().max().item()
            except Exception as error:  # noqa: BLE001
                out["unpadded"][f"{name}/bf16"] = f"error: {type(error).__name__}: {error}"[:300]
    out["unpadded"]["eager/bf16"] = (logits("eager", torch.bfloat16, full) - ref_full).abs().max().item()
    return out


def resident_bytes(model, optimizer) -> int:
    """What a system keeps between steps: weights, gradients and optimizer state."""
    import torch

    params = list({id(p): p for p in model.parameters()}.values())
    tensors = [*params, *(p.grad for p in params if p.grad is not None),
               *(v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v))]
    return sum(t.numel() * t.element_size() for t in tensors)


def step_peak_gib(step, model, optimizer, device):
    """Peak memory of one step of this system as if it were alone on the device: the step's peak less what the
    other resident systems hold (measured apart from the timed steps, which interleave the systems)."""
    import torch

    if device.type != "cuda":
        return None
    reset_peak(device)
    others = torch.cuda.memory_allocated(device) - resident_bytes(model, optimizer)
    step()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - others) / GIB


def paper_batch_preset(device, preset, p, batch, peak_tflops, errors) -> dict:
    """One preset of `paper_batch_training`; a system whose first step (its compilation) fails is recorded in
    `errors` and left out."""
    import copy

    import torch

    from vanilla_transformer.training import paper_adam

    from . import floors, profiling, workloads

    spec = spec_on(device, preset=preset, vocab_size=p["vocab_size"], batch_size=batch["input_ids"].shape[0],
                   source_length=p["width"], target_length=p["width"])
    models = {}
    for name, model in workloads.build_models(spec).items():
        models[f"{name}_eager"] = model.train()
        # A copy, not the same module: each system trains its own weights with its own optimizer.
        models[f"{name}_compiled"] = torch.compile(copy.deepcopy(model), backend=p["compile_backend"] or "inductor")
    config = models["ours_eager"].config
    systems, losses, first_step_s = {}, {}, {}
    for name, model in models.items():
        # Trainer's default optimizer on a GPU (adamw_torch_fused) with the paper's betas and epsilon (§5.3).
        optimizer = paper_adam([p for p in model.parameters() if p.requires_grad], lr=1e-4,
                               fused=device.type == "cuda")
        train_step = workloads.make_train_step(model, batch, autocast=torch.bfloat16, optimizer=optimizer)
        losses[name] = []
        step = lambda train_step=train_step, name=name: losses[name].append(train_step())  # noqa: E731
        try:
            first_step_s[name] = toolkit.time_interleaved({name: step}, 1, 0, device)[name][0]
        except Exception as error:  # noqa: BLE001 - e.g. inductor without a C compiler; the others still run
            errors[f"{preset}/{name}"] = f"{type(error).__name__}: {error}"[:1000]
            continue
        systems[name] = (model, optimizer, step)
    ms = toolkit.median_ms({name: step for name, (_, _, step) in systems.items()}, p["timed_steps"],
                           p["warmup_steps"], device)
    counts = floors.token_counts(batch)
    tokens = sum(counts)
    # Model FLOPs of the batch's tokens, the same for every system (Marian computes the padding too).
    flops = floors.training_flops(config, spec.batch_size, p["width"], p["width"], True, *counts)
    result = {"parameters": workloads.parameter_counts(models["ours_eager"])["trainable"], "dropout": config.dropout,
              "model_tflop_per_step": flops / 1e12, "systems": {}}
    for name, (model, optimizer, step) in systems.items():
        step_s = ms[name] / 1e3
        result["systems"][name] = {
            "step_ms": ms[name], "tokens_per_s": tokens / step_s, "model_tflops": flops / step_s / 1e12,
            "mfu": flops / step_s / 1e12 / peak_tflops if peak_tflops else None,
            "peak_memory_gib": step_peak_gib(step, model, optimizer, device), "compile_s": first_step_s[name],
            "loss_finite": all(map(math.isfinite, losses[name])),
        }

    def ratio(other, system):  # other's time / system's time: > 1 when `system` is faster
        return ms[other] / ms[system] if other in ms and system in ms else None

    if "ours_compiled" in systems:
        result["profile_ours_compiled"] = profiling.top_kernels(systems["ours_compiled"][2], device)
    result["compiled_speed_vs_marian_compiled"] = ratio("marian_compiled", "ours_compiled")
    result["compiled_speed_vs_eager"] = ratio("ours_eager", "ours_compiled")
    result["eager_speed_vs_marian_eager"] = ratio("marian_eager", "ours_eager")
    return result


def paper_batch_training(device, s, peak_tflops, start_by) -> dict:
    """The bf16 training step at the paper's batch, ours and Marian, eager and compiled (see the module
    docstring). `failures` lists what makes the section fail: a non-finite loss, or a preset whose compiled
    ours did not run (not started past `start_by`, a perf_counter time, or failed to compile)."""
    import gc

    import torch
    import torch.nn.functional as F

    from . import floors, workloads

    p = s["paper"]
    # Real lengths average 3/4 of the width, so this many rows hold about `tokens` real tokens a side.
    rows = round(p["tokens"] / (0.75 * p["width"]))
    spec = spec_on(device, preset=p["presets"][0], vocab_size=p["vocab_size"], batch_size=rows,
                   source_length=p["width"], target_length=p["width"])
    config = workloads.model_config(spec)
    # Padded to the full width, as a collator padding to a multiple of it pads.
    pads = {"input_ids": config.pad_token_id, "attention_mask": 0, "labels": -100}
    batch = {name: F.pad(t, (0, p["width"] - t.shape[1]), value=pads[name])
             for name, t in workloads.training_batch(spec, config, seed=4).items()}
    source_tokens, target_tokens = floors.token_counts(batch)
    result = {"rows": rows, "width": p["width"], "vocab_size": p["vocab_size"], "source_tokens": source_tokens,
              "target_tokens": target_tokens, "compile_backend": p["compile_backend"] or "inductor",
              "presets": {}, "errors": {}}
    for preset in p["presets"]:
        if time.perf_counter() > start_by:
            result["errors"][preset] = f"not started: past {p['start_by_s']} s into the check"
            continue
        # A fresh dynamo per preset: the two models' shared transformers wrappers then never near
        # the recompile limit, and no compiled graph outlives its model.
        torch._dynamo.reset()
        try:
            result["presets"][preset] = paper_batch_preset(device, preset, p, batch, peak_tflops, result["errors"])
        finally:
            torch._dynamo.reset()
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    result["failures"] = [
        *(f"{preset}: ours_compiled did not run" for preset in p["presets"]
          if "ours_compiled" not in result["presets"].get(preset, {}).get("systems", {})),
        *(f"{preset}/{name}: non-finite loss" for preset, r in result["presets"].items()
          for name, system in r["systems"].items() if not system["loss_finite"]),
    ]
    return result


def beam_throughput(device, s) -> dict:
    """Beam 4 in bf16 weights through generate(), a fixed number of new tokens: tokens/s and peak memory."""
    import torch

    from . import workloads

    b = s["beam"]
    spec = spec_on(device, preset=b["preset"], vocab_size=b["vocab_size"], source_length=b["source_length"],
                   generation_batch_size=b["batch"], new_tokens=b["new_tokens"], num_beams=4)
    reset_peak(device)
    model = workloads.build_model(spec).to(torch.bfloat16).eval()
    source = workloads.source_batch(spec, model.config, b["batch"], seed=3)
    output = {}

    def decode():
        with torch.inference_mode():
            output["ids"] = workloads.generate_fixed_length(model, **source, new_tokens=b["new_tokens"], num_beams=4)

    seconds = statistics.median(toolkit.time_interleaved({"beam": decode}, b["repeats"], 1, device)["beam"])
    new_tokens = b["batch"] * b["new_tokens"]
    return {"preset": b["preset"], "batch": b["batch"], "num_beams": 4, "new_tokens": b["new_tokens"],
            "seconds": seconds, "tokens_per_s": new_tokens / seconds, "sentences_per_s": b["batch"] / seconds,
            "output_shape": list(output["ids"].shape), "peak_memory_gib": peak_gib(device)}


def benchmark(device, s) -> dict:
    """`make bench`'s run (peers.run_benchmark) on this device, with the spec in the settings."""
    from .peers import run_benchmark

    return run_benchmark(spec_on(device, **s["benchmark"]), log=lambda message: print(f"    {message}", flush=True))


def training_run(device, s, cpu_smoke: bool) -> dict:
    """scripts/train.py --bf16 on the built-in task in a subprocess; the logged loss must fall."""
    r = s["run"]
    with tempfile.TemporaryDirectory(prefix="vt_device_check_") as tmp:
        output_dir = Path(tmp, "run")
        args = [sys.executable, str(REPO / "scripts" / "train.py"), "--output_dir", str(output_dir),
                "--preset", r["preset"], "--vocab_size", str(r["vocab_size"]), "--max_steps", str(r["max_steps"]),
                "--per_device_train_batch_size", str(r["batch"]), "--noam_warmup_steps", str(r["warmup"]),
                "--max_train_samples", str(r["train_samples"]), "--max_eval_samples", str(r["eval_samples"]),
                "--logging_steps", str(r["logging_steps"]), "--save_strategy", "steps",
                "--save_steps", str(r["max_steps"]), "--save_total_limit", "1", "--eval_strategy", "no",
                "--report_to", "none", "--seed", "0", "--bf16", "--num_examples", "2",
                "--dataloader_num_workers", str(r["workers"])]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        if cpu_smoke:
            args.append("--use_cpu")
            env["OMP_NUM_THREADS"] = "1"
        start = time.perf_counter()
        process = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=r["timeout_s"])
        wall = time.perf_counter() - start
        if process.returncode != 0:
            raise RuntimeError(f"scripts/train.py failed ({process.returncode}):\n{process.stdout[-2000:]}\n{process.stderr[-4000:]}")
        state = json.loads((output_dir / f"checkpoint-{r['max_steps']}" / "trainer_state.json").read_text())
        losses = [(e["step"], e["loss"]) for e in state["log_history"] if "loss" in e]
        results = json.loads((output_dir / "results.json").read_text())
    first, last = losses[0][1], losses[-1][1]
    train = results["train"]
    test = results.get("test", {})
    return {"preset": r["preset"], "steps": r["max_steps"], "batch": r["batch"], "wall_s": wall,
            "train_runtime_s": train.get("train_runtime"), "train_steps_per_s": train.get("train_steps_per_second"),
            "first_logged_loss": first, "last_logged_loss": last, "loss_falls": last < 0.9 * first,
            "loss_curve": losses, "test_bleu": test.get("bleu"), "test_sentences": test.get("num_sentences")}


# Report --------------------------------------------------------------------------------------------------

def _fmt(value, digits=3):
    if value is None:
        return "–"
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.{digits}g}"


def _times(ratio):
    return "–" if ratio is None else f"{ratio:.2f}x"


def render_markdown(report: dict) -> str:
    from .report import render_markdown as render_benchmark

    env = report.get("environment", {})
    sections = {name: section["result"] for name, section in report["sections"].items() if section.get("result")}
    lines = [f"# vanilla_transformer device check ({'CPU smoke, numbers mean nothing' if report['cpu_smoke'] else env.get('gpu', '?')})",
             "", f"torch {env.get('torch')} (CUDA {env.get('cuda_build')}), transformers {env.get('transformers')}, "
             f"accelerate {env.get('accelerate')}; flash-attention packages: {env.get('flash_attention_packages') or 'none'}; "
             f"total {report['wall_s']:.0f} s", ""]
    peak = sections.get("matmul_peak")
    if peak:
        lines += [f"bf16 matmul peak ({peak['size']}³): **{peak['best_tflops']:.0f} TFLOP/s** (best), "
                  f"{peak['median_tflops']:.0f} (median)", ""]
    attention = sections.get("attention_agreement")
    if attention:
        lines += [f"## Attention agreement ({attention['preset']}; max |logit − fp32 eager logit|, logits up to "
                  f"{attention['logit_scale']:.3g})", ""]
        lines += markdown_table(["batch", "implementation / dtype", "max abs diff"],
                                [[kind, name, _fmt(value)] for kind in ("padded", "unpadded")
                                 for name, value in attention.get(kind, {}).items()])
        lines.append("")
    paper = sections.get("paper_batch_training")
    if paper:
        lines += [f"## bf16 training step at the paper's batch (autocast, fused AdamW, dropout on; compiled: "
                  f"torch.compile, {paper['compile_backend']})", "",
                  f"{paper['rows']} rows × {paper['width']} positions a side, lengths uniform in "
                  f"[{paper['width'] // 2}, {paper['width']}]: {paper['source_tokens']:,} source + "
                  f"{paper['target_tokens']:,} target tokens; vocabulary {paper['vocab_size']:,}. Interleaved medians; "
                  f"peak GiB: one step as if alone; compile s: the first step, compilation included.", ""]
        for preset, r in paper["presets"].items():
            lines += [f"**{preset}** ({r['parameters'] / 1e6:.1f}M parameters, dropout {r['dropout']}, "
                      f"{r['model_tflop_per_step']:.3g} model TFLOP a step)", ""]
            lines += markdown_table(
                ["system", "step ms", "tokens/s", "TFLOP/s", "MFU", "peak GiB", "compile s"],
                [[name, f"{m['step_ms']:.1f}", f"{m['tokens_per_s']:,.0f}", f"{m['model_tflops']:.1f}",
                  "–" if m["mfu"] is None else f"{100 * m['mfu']:.1f}%", _fmt(m["peak_memory_gib"]),
                  f"{m['compile_s']:.1f}"] for name, m in r["systems"].items()])
            ratios = ", ".join(f"{label} {_times(r[key])}" for label, key in (
                ("ours compiled vs Marian compiled", "compiled_speed_vs_marian_compiled"),
                ("ours compiled vs ours eager", "compiled_speed_vs_eager"),
                ("ours eager vs Marian eager", "eager_speed_vs_marian_eager")))
            lines += ["", f"Speed-ups (the second system's time over the first's): {ratios}.", ""]
            profile = r.get("profile_ours_compiled")
            if profile:
                lines += [f"Top kernels of one compiled step of ours ({profile['total_ms']:.1f} ms of device time):", ""]
                lines += markdown_table(["kernel", "ms", "share", "calls"],
                                        [[f"`{k['name'][:80]}`", f"{k['ms']:.2f}", f"{100 * k['share']:.1f}%",
                                          k["calls"]] for k in profile["kernels"]])
                lines.append("")
        lines += [f"- error, {key}: {' '.join(error.split())[:300]}" for key, error in paper["errors"].items()]
        lines += [""] if paper["errors"] else []
    beam = sections.get("beam_search")
    if beam:
        lines += ["## Beam search (bf16 weights, fixed length)", ""]
        lines += markdown_table(
            ["preset", "batch", "beams", "new tokens", "s", "tokens/s", "sentences/s", "peak GiB"],
            [[beam["preset"], beam["batch"], beam["num_beams"], beam["new_tokens"], f"{beam['seconds']:.3f}",
              f"{beam['tokens_per_s']:,.0f}", f"{beam['sentences_per_s']:,.1f}", _fmt(beam["peak_memory_gib"])]])
        lines.append("")
    if "benchmark" in sections:  # the CPU benchmark's report, one heading level down
        lines += ["#" + line if line.startswith("#") else line
                  for line in render_benchmark(sections["benchmark"]).splitlines()] + [""]
    run = sections.get("training_run")
    if run:
        lines += ["## Training run (scripts/train.py --bf16, built-in task)", ""]
        lines += markdown_table(
            ["preset", "steps", "batch", "first loss", "last loss", "falls", "test BLEU", "train s", "wall s"],
            [[run["preset"], run["steps"], run["batch"], f"{run['first_logged_loss']:.3f}",
              f"{run['last_logged_loss']:.3f}", _fmt(run["loss_falls"]), _fmt(run["test_bleu"]),
              _fmt(run["train_runtime_s"]), f"{run['wall_s']:.0f}"]])
        lines.append("")
    problems = {k: v for k, v in report["sections"].items() if not v.get("ok")}
    if problems:
        lines += ["## Problems", ""] + [f"- **{k}**: {v.get('error', 'failed')[:1000]}" for k, v in problems.items()] + [""]
    if not report.get("complete", True):
        lines += [f"**Incomplete**: written after {len(report['sections'])} sections; the check had not finished.", ""]
    lines.append(f"All checks passed: **{_fmt(report['ok'])}**")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu_smoke", action="store_true", help="tiny sizes on the CPU, to test this script")
    parser.add_argument("--out", type=Path, default=None, help="default: $OUT, else device_check_out/")
    parser.add_argument("--budget_s", type=float, default=420.0,
                        help="skip the sections not started after this many seconds (default 420)")
    parser.add_argument("--skip", nargs="*", default=[], help="section names to skip")
    args = parser.parse_args(argv)

    import torch

    if not args.cpu_smoke and not torch.cuda.is_available():
        print(f"device_check: no CUDA device (torch {torch.__version__}, CUDA build {torch.version.cuda}); "
              "nothing to measure. Run it on a GPU machine, or pass --cpu_smoke to exercise the code on the CPU.")
        return 0
    out_dir = args.out or Path(os.environ.get("OUT") or "device_check_out")
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = CPU_SMOKE_SETTINGS if args.cpu_smoke else GPU_SETTINGS
    device = torch.device("cpu") if args.cpu_smoke else torch.device("cuda", 0)
    if args.cpu_smoke:
        # One thread: tiny sizes gain nothing from more, and on a small machine busy with other work a second
        # thread is often descheduled, so that every parallel region waits for it (seconds a tiny step).
        torch.set_num_threads(1)
    # TF32 stays off (PyTorch's default): the fp32 eager logits are the reference of the attention check.

    start = time.perf_counter()
    report = {"cpu_smoke": args.cpu_smoke, "settings": settings, "sections": {}}

    def save(complete=False):
        report["wall_s"] = time.perf_counter() - start
        report["complete"] = complete
        report["ok"] = complete and all(v.get("ok") for v in report["sections"].values())
        markdown = render_markdown(report)
        return markdown, toolkit.write_report(out_dir / "device_check", report, markdown)

    def section(name, fn, *fn_args):
        if name in args.skip:
            report["sections"][name] = {"ok": True, "skipped": "--skip"}
            return None
        elapsed = time.perf_counter() - start
        if elapsed > args.budget_s:
            report["sections"][name] = {"ok": False, "error": f"not started: {elapsed:.0f} s > budget {args.budget_s:.0f} s"}
            return None
        print(f"[device_check {elapsed:6.1f}s] {name} ...", flush=True)
        t0 = time.perf_counter()
        try:
            result = fn(*fn_args)
            report["sections"][name] = {"ok": True, "seconds": time.perf_counter() - t0, "result": result}
            print(f"    {json.dumps(result, default=str)[:600]}", flush=True)
            return result
        except Exception as error:  # noqa: BLE001 - one failing section must not hide the others
            report["sections"][name] = {"ok": False, "seconds": time.perf_counter() - t0,
                                        "error": f"{type(error).__name__}: {error}\n{traceback.format_exc()[-3000:]}"}
            print(f"    FAILED: {type(error).__name__}: {str(error)[:500]}", flush=True)
            return None
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
            save()

    def fail(name, error):
        report["sections"][name].update(ok=False, error=error)
        save()

    report["environment"] = section("environment", environment, device) or {}
    peak = section("matmul_peak", matmul_peak, device, settings["matmul_size"], settings["matmul_repeats"])
    section("attention_agreement", attention_agreement, device, settings)
    paper = section("paper_batch_training", paper_batch_training, device, settings,
                    peak["best_tflops"] if peak else None, start + settings["paper"]["start_by_s"])
    if paper is not None and paper["failures"]:
        fail("paper_batch_training", "; ".join(paper["failures"]))
    section("beam_search", beam_throughput, device, settings)
    section("benchmark", benchmark, device, settings)
    run = section("training_run", training_run, device, settings, args.cpu_smoke)
    if run is not None and not run["loss_falls"]:
        fail("training_run", f"loss did not fall: {run['first_logged_loss']:.3f} -> {run['last_logged_loss']:.3f}")

    markdown, paths = save(complete=True)
    print(markdown)
    print(f"device_check: wrote {paths['json']} and {paths['md']}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
