"""The GPU acceptance check (run it through scripts/device_check.sh): on a CUDA machine, in a few minutes and
installing nothing, each section calling the measurement toolkit:

1. attention agreement: logits of eager, SDPA and (when installed) flash-attention against fp32 eager on a padded
   batch, plus SDPA forced onto each of its kernels on an unpadded batch (bf16);
2. the bf16 training step at the paper's batch (§5.1: about 25,000 source and 25,000 target tokens; here ~1,040
   rows of 32 positions a side, lengths uniform in [16, 32] as in Multi30k, padded to 32) of the base and big
   models, trained as Trainer --bf16 trains (autocast over fp32 weights, fused Adam, dropout on, SDPA): ours and
   MarianMTModel, each eager and under torch.compile (`workloads.training_steps`), interleaved: step time, tokens/s,
   MFU against the bf16 matmul peak of the same card, peak memory, compile seconds, and the top kernels of ours
   compiled. `scripts/recipes/wmt14_en_de.py --cost_table` projects the paper's runs from it;
3. our loss and dropout kernels against torch's at the paper batch's shapes (`kernels.compare_kernels`), which
   says which the model should keep on a GPU;
4. `make bench`'s run on this device (`peers.run_benchmark`, fp32): ours against Marian and the textbook decoder,
   with its floors, ceilings and report;
5. a short bf16 run of scripts/train.py on the built-in task, whose loss must fall.

It writes device_check.json and device_check.md to $OUT if set, else device_check_out/ (or --out), after every
section, so that a run stopped by the wrapper's time limit keeps what it measured. Without CUDA it says so and exits
0. `--cpu_smoke` runs the same code on the CPU with tiny sizes (compiling with aot_eager), for the tests; its
numbers mean nothing.
"""

import argparse
import contextlib
import gc
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

from vanilla_transformer.training import paper_adam

from . import floors, kernels, peers, report, toolkit, workloads
from .toolkit import markdown_table

REPO = Path(__file__).resolve().parents[2]
GIB = 2**30
# Speed-ups of the paper-batch step: the second system's time over the first's.
RATIOS = {"compiled_speed_vs_marian_compiled": ("ours_compiled", "marian_compiled"),
          "compiled_speed_vs_eager": ("ours_compiled", "ours_eager"),
          "eager_speed_vs_marian_eager": ("ours_eager", "marian_eager")}

GPU_SETTINGS = dict(
    attention=dict(preset="base", vocab_size=37000), matmul_size=8192, matmul_repeats=10,
    # 4 inductor compiles (~40-70 s each with 16 cores) dominate this section's few minutes; a preset not
    # started `start_by_s` seconds into the check is skipped, so that a slow compile cannot run the whole
    # check into the wrapper's 470 s kill.
    paper=dict(presets=("base", "big"), vocab_size=37000, tokens=25000, width=32, warmup_steps=3, timed_steps=8,
               compile_backend=None, start_by_s=250),
    kernels=dict(tokens=25000, vocab_size=37000, d_model=512, dropout=0.1, label_smoothing=0.1, repeats=10),
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
    kernels=dict(tokens=64, vocab_size=1000, d_model=64, dropout=0.1, label_smoothing=0.1, repeats=1),
    benchmark=dict(preset="tiny", vocab_size=1000, batch_size=4, source_length=8, target_length=8,
                   generation_batch_size=2, new_tokens=4, curve_lengths=(2,), repeats=1, warmup=0, matmul_size=128,
                   compile_backend=None),
    run=dict(preset="tiny", vocab_size=300, max_steps=20, batch=16, warmup=8, train_samples=320,
             eval_samples=4, logging_steps=2, timeout_s=150, workers=0),
)


def spec_on(device, **fields) -> workloads.BenchmarkSpec:
    """A benchmark spec on `device`, with this process's threads and no CPU memory measurement."""
    return workloads.BenchmarkSpec(**{"device": str(device), "memory": False, "threads": torch.get_num_threads(),
                                      **fields})


def flash_implementations() -> list[str]:
    from transformers.utils import import_utils

    found = []
    for name in ("flash_attention_2", "flash_attention_3"):
        probe = getattr(import_utils, f"is_{name.replace('attention', 'attn')}_available", None)
        try:
            if probe is not None and probe():
                found.append(name)
        except Exception:  # noqa: BLE001 - a broken install counts as absent
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
    peak = toolkit.matmul_peak(size, repeats, device, torch.bfloat16)
    return {"size": size, "best_tflops": peak["flops"] / 1e12, "median_tflops": peak["median_flops"] / 1e12}


def attention_agreement(device, s) -> dict:
    """Max |logits - fp32 eager logits| for each implementation and dtype; the scale is max |fp32 logits|."""
    spec = spec_on(device, **s["attention"], batch_size=8, source_length=32, target_length=24,
                   config_overrides={"dropout": 0.0})
    config = workloads.model_config(spec)
    padded = workloads.training_batch(spec, config, seed=1)
    generator = torch.Generator().manual_seed(2)
    ids, labels = (torch.randint(4, config.vocab_size, (8, n), generator=generator).to(device) for n in (32, 24))
    full = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    reference = workloads.build_model(spec, attn_implementation="eager").eval()
    with torch.no_grad():
        references = {"padded": reference(**padded).logits.float(), "unpadded": reference(**full).logits.float()}

    def gap(kind, impl, dtype, backend=None):
        model = workloads.build_model(spec, attn_implementation="eager").eval().to(dtype)
        try:
            model.set_attn_implementation(impl)
            with torch.no_grad(), torch.nn.attention.sdpa_kernel(backend) if backend else contextlib.nullcontext():
                logits = model(**(padded if kind == "padded" else full)).logits.float()
            return (logits - references[kind]).abs().max().item()
        except Exception as error:  # noqa: BLE001 - recorded, not fatal
            return f"error: {type(error).__name__}: {error}"[:300]

    out = {"preset": spec.preset, "logit_scale": references["padded"].abs().max().item(), "padded": {},
           "unpadded": {}}
    for impl in ["eager", "sdpa", *flash_implementations()]:
        for name, dtype in {"fp32": torch.float32, "bf16": torch.bfloat16}.items():
            if not (impl.startswith("flash") and dtype == torch.float32):  # flash kernels take fp16/bf16 only
                out["padded"][f"{impl}/{name}"] = gap("padded", impl, dtype)
    if device.type == "cuda":
        from torch.nn.attention import SDPBackend

        for name, backend in (("flash kernel", SDPBackend.FLASH_ATTENTION),
                              ("efficient kernel", SDPBackend.EFFICIENT_ATTENTION), ("math", SDPBackend.MATH)):
            out["unpadded"][f"sdpa[{name}]/bf16"] = gap("unpadded", "sdpa", torch.bfloat16, backend)
    out["unpadded"]["eager/bf16"] = gap("unpadded", "eager", torch.bfloat16)
    return out


def step_peak_gib(step, device) -> float | None:
    """Peak memory of one training step (`make_train_step`'s) as if its system were alone on the device: the
    step's peak less what the other systems keep (weights, gradients and optimizer state of their own)."""
    if device.type != "cuda":
        return None
    params = list({id(p): p for p in step.model.parameters()}.values())
    own = [*params, *(p.grad for p in params if p.grad is not None),
           *(v for state in step.optimizer.state.values() for v in state.values() if torch.is_tensor(v))]
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    others = torch.cuda.memory_allocated(device) - sum(t.numel() * t.element_size() for t in own)
    step()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - others) / GIB


def top_kernels(step, device, rows: int = 10) -> dict:
    """Where one step's device time goes: the kernels (CPU ops on the CPU) with the most self time, and their
    share."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if device.type == "cuda" else [])]
    with profile(activities=activities) as prof:
        step()
        toolkit.synchronize(device)
    attribute = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = sorted((e for e in prof.key_averages() if getattr(e, attribute, 0) > 0),
                    key=lambda e: getattr(e, attribute), reverse=True)
    total = sum(getattr(e, attribute) for e in events)
    return {"total_ms": total / 1e3, "kernels": [
        {"name": e.key[:120], "ms": getattr(e, attribute) / 1e3, "share": getattr(e, attribute) / total,
         "calls": e.count} for e in events[:rows]]}


def paper_batch_preset(device, preset, p, batch, peak_tflops, errors) -> dict:
    """One preset of `paper_batch_training`; a system whose first step (its compilation) fails is recorded in
    `errors` and left out."""
    spec = spec_on(device, preset=preset, vocab_size=p["vocab_size"], batch_size=batch["input_ids"].shape[0],
                   source_length=p["width"], target_length=p["width"])
    models = workloads.build_models(spec)
    # Trainer's default optimizer on a GPU (adamw_torch_fused) with the paper's betas and epsilon (§5.3).
    steps = workloads.training_steps(models, batch, p["compile_backend"] or "inductor", autocast=torch.bfloat16,
                                     optimizer=lambda params: paper_adam(params, lr=1e-4, fused=device.type == "cuda"))
    losses = {name: [] for name in steps}
    recorded = {name: (lambda n=name, step=step: losses[n].append(step())) for name, step in steps.items()}
    compile_s, failed = workloads.first_steps(recorded, device)
    errors.update({f"{preset}/{name}": error for name, error in failed.items()})
    ms = toolkit.median_ms({name: recorded[name] for name in compile_s}, p["timed_steps"], p["warmup_steps"], device)
    tokens = sum(floors.token_counts(batch))
    # Model FLOPs of the batch's tokens, the same for every system (Marian computes the padding too).
    flops = floors.training_flops(models["ours"].config, spec.batch_size, p["width"], p["width"], True,
                                  *floors.token_counts(batch))
    result = {"parameters": workloads.parameter_counts(models["ours"])["trainable"], "systems": {},
              "dropout": models["ours"].config.dropout, "model_tflop_per_step": flops / 1e12}
    for name, step_ms in ms.items():
        tflops = flops / step_ms * 1e3 / 1e12
        result["systems"][name] = {"step_ms": step_ms, "tokens_per_s": tokens / step_ms * 1e3, "model_tflops": tflops,
                                   "mfu": tflops / peak_tflops if peak_tflops else None,
                                   "peak_memory_gib": step_peak_gib(steps[name], device),
                                   "compile_s": compile_s[name], "loss_finite": all(map(math.isfinite, losses[name]))}
    if "ours_compiled" in ms:
        result["profile_ours_compiled"] = top_kernels(steps["ours_compiled"], device)
    for key, (system, other) in RATIOS.items():
        result[key] = ms[other] / ms[system] if other in ms and system in ms else None  # > 1: `system` faster
    return result


def paper_batch_training(device, s, peak_tflops, start_by) -> dict:
    """The bf16 training step at the paper's batch, ours and Marian, eager and compiled (see the module
    docstring). `failures` lists what makes the section fail: a non-finite loss, or a preset whose compiled
    ours did not run (not started past `start_by`, a perf_counter time, or failed to compile)."""
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
        # A fresh dynamo per preset: the two models' shared transformers wrappers then never near the recompile
        # limit, and no compiled graph outlives its model.
        torch._dynamo.reset()
        try:
            result["presets"][preset] = paper_batch_preset(device, preset, p, batch, peak_tflops, result["errors"])
        finally:
            torch._dynamo.reset()
            gc.collect()
    result["failures"] = [
        *(f"{preset}: ours_compiled did not run" for preset in p["presets"]
          if "ours_compiled" not in result["presets"].get(preset, {}).get("systems", {})),
        *(f"{preset}/{name}: non-finite loss" for preset, r in result["presets"].items()
          for name, system in r["systems"].items() if not system["loss_finite"])]
    return result


def benchmark(device, s) -> dict:
    """`make bench`'s run (peers.run_benchmark) on this device, with the spec in the settings."""
    return peers.run_benchmark(spec_on(device, **s["benchmark"]),
                               log=lambda message: print(f"    {message}", flush=True))


def training_run(device, s, cpu_smoke: bool) -> dict:
    """scripts/train.py --bf16 on the built-in task in a subprocess; the logged loss must fall."""
    r = s["run"]
    with tempfile.TemporaryDirectory(prefix="vt_device_check_") as tmp:
        output_dir = Path(tmp, "run")
        flags = dict(output_dir=output_dir, preset=r["preset"], vocab_size=r["vocab_size"], max_steps=r["max_steps"],
                     per_device_train_batch_size=r["batch"], noam_warmup_steps=r["warmup"],
                     max_train_samples=r["train_samples"], max_eval_samples=r["eval_samples"],
                     logging_steps=r["logging_steps"], save_strategy="steps", save_steps=r["max_steps"],
                     save_total_limit=1, eval_strategy="no", report_to="none", seed=0, num_examples=2,
                     dataloader_num_workers=r["workers"])
        args = [sys.executable, str(REPO / "scripts" / "train.py"), "--bf16", *(["--use_cpu"] if cpu_smoke else []),
                *(item for name, value in flags.items() for item in (f"--{name}", str(value)))]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               **({"OMP_NUM_THREADS": "1"} if cpu_smoke else {})}
        start = time.perf_counter()
        process = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=r["timeout_s"])
        wall = time.perf_counter() - start
        if process.returncode != 0:
            raise RuntimeError(f"scripts/train.py failed ({process.returncode}):\n{process.stdout[-2000:]}\n"
                               f"{process.stderr[-4000:]}")
        state = json.loads((output_dir / f"checkpoint-{r['max_steps']}" / "trainer_state.json").read_text())
        results = json.loads((output_dir / "results.json").read_text())
    losses = [(e["step"], e["loss"]) for e in state["log_history"] if "loss" in e]
    train, test = results["train"], results.get("test", {})
    return {"preset": r["preset"], "steps": r["max_steps"], "batch": r["batch"], "wall_s": wall,
            "train_runtime_s": train.get("train_runtime"), "train_steps_per_s": train.get("train_steps_per_second"),
            "first_logged_loss": losses[0][1], "last_logged_loss": losses[-1][1],
            "loss_falls": losses[-1][1] < 0.9 * losses[0][1], "loss_curve": losses, "test_bleu": test.get("bleu"),
            "test_sentences": test.get("num_sentences")}


# Report --------------------------------------------------------------------------------------------------

def _fmt(value):
    if value is None or isinstance(value, str):
        return value or "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:,}" if isinstance(value, int) else f"{value:,.4g}"


def _table(records: list[dict]) -> list[str]:
    """Records with the same keys as a markdown table, the keys its header."""
    return markdown_table(list(records[0]), [[_fmt(value) for value in r.values()] for r in records]) if records else []


def _render_paper(paper) -> list[str]:
    lines = [f"{paper['rows']} rows × {paper['width']} positions a side, lengths uniform in [{paper['width'] // 2}, "
             f"{paper['width']}]: {paper['source_tokens']:,} source + {paper['target_tokens']:,} target tokens; "
             f"vocabulary {paper['vocab_size']:,}; compiled with {paper['compile_backend']}. Interleaved medians; "
             "peak GiB: one step as if alone; compile_s: the first step, compilation included.", ""]
    for preset, r in paper["presets"].items():
        lines += [f"**{preset}** ({r['parameters'] / 1e6:.1f}M parameters, dropout {r['dropout']}, "
                  f"{r['model_tflop_per_step']:.3g} model TFLOP a step)", "",
                  *_table([{"system": name, **m} for name, m in r["systems"].items()]), "",
                  "Speed-ups (> 1: the first system faster): "
                  + ", ".join(f"{key} {_fmt(r[key])}" for key in RATIOS) + ".", ""]
        if r.get("profile_ours_compiled"):
            lines += [f"Top kernels of one compiled step of ours ({r['profile_ours_compiled']['total_ms']:.1f} ms):",
                      "", *_table(r["profile_ours_compiled"]["kernels"]), ""]
    return lines + [f"- error, {key}: {' '.join(error.split())[:300]}" for key, error in paper["errors"].items()]


RENDERERS = {  # each section's heading and its body
    "attention_agreement": ("Attention agreement", lambda a: _table([
        {"batch": kind, "implementation / dtype": name,
         f"max |logit - fp32 eager logit| (logits up to {a['logit_scale']:.3g})": value}
        for kind in ("padded", "unpadded") for name, value in a[kind].items()])),
    "paper_batch_training": ("bf16 training step at the paper's batch (autocast, fused Adam, dropout on)",
                             _render_paper),
    "kernels": ("Loss and dropout kernels, forward + backward: ours against torch's", kernels.kernel_table),
    # make bench's report under its own heading, one level down.
    "benchmark": (None, lambda r: ["#" + line if line.startswith("#") else line
                                   for line in report.render_markdown(r).splitlines()]),
    "training_run": ("Training run (scripts/train.py --bf16, built-in task)",
                     lambda r: _table([{k: v for k, v in r.items() if k != "loss_curve"}])),
}


def render_markdown(check: dict) -> str:
    env = check.get("environment", {})
    results = {name: section["result"] for name, section in check["sections"].items() if section.get("result")}
    lines = [f"# vanilla_transformer device check "
             f"({'CPU smoke, numbers mean nothing' if check['cpu_smoke'] else env.get('gpu', '?')})", "",
             f"torch {env.get('torch')} (CUDA {env.get('cuda_build')}), transformers {env.get('transformers')}, "
             f"accelerate {env.get('accelerate')}; flash-attention packages: "
             f"{env.get('flash_attention_packages') or 'none'}; total {check['wall_s']:.0f} s", ""]
    if "matmul_peak" in results:
        peak = results["matmul_peak"]
        lines += [f"bf16 matmul peak ({peak['size']}³): **{peak['best_tflops']:.0f} TFLOP/s** (best), "
                  f"{peak['median_tflops']:.0f} (median)", ""]
    for name, (heading, render) in RENDERERS.items():
        lines += [*([f"## {heading}", ""] if heading else []), *render(results[name]), ""] if name in results else []
    problems = {k: v for k, v in check["sections"].items() if not v.get("ok")}
    if problems:
        lines += ["## Problems", "", *(f"- **{k}**: {v.get('error', 'failed')[:1000]}" for k, v in problems.items()),
                  ""]
    if not check.get("complete", True):
        lines += [f"**Incomplete**: written after {len(check['sections'])} sections; the check had not finished.", ""]
    return "\n".join([*lines, f"All checks passed: **{_fmt(check['ok'])}**"]) + "\n"


# The check ------------------------------------------------------------------------------------------------

class Check:
    """The sections run one after another, each timed, its result or error recorded and the report rewritten; one
    failing section does not stop the others, and none starts past the time budget."""

    def __init__(self, cpu_smoke: bool, out_dir: Path, budget_s: float, skip: list[str]):
        self.out_dir, self.budget_s, self.skip, self.start = out_dir, budget_s, skip, time.perf_counter()
        self.report = {"cpu_smoke": cpu_smoke, "settings": CPU_SMOKE_SETTINGS if cpu_smoke else GPU_SETTINGS,
                       "sections": {}}

    def save(self, complete=False):
        self.report.update(wall_s=time.perf_counter() - self.start, complete=complete)
        self.report["ok"] = complete and all(v.get("ok") for v in self.report["sections"].values())
        markdown = render_markdown(self.report)
        return markdown, toolkit.write_report(self.out_dir / "device_check", self.report, markdown)

    def section(self, name, fn, *args):
        sections, elapsed = self.report["sections"], time.perf_counter() - self.start
        if name in self.skip or elapsed > self.budget_s:
            sections[name] = ({"ok": True, "skipped": "--skip"} if name in self.skip else
                              {"ok": False, "error": f"not started: {elapsed:.0f} s > budget {self.budget_s:.0f} s"})
            return None
        print(f"[device_check {elapsed:6.1f}s] {name} ...", flush=True)
        mark = time.perf_counter()
        try:
            result = fn(*args)
            sections[name] = {"ok": True, "seconds": time.perf_counter() - mark, "result": result}
            print(f"    {json.dumps(result, default=str)[:600]}", flush=True)
            return result
        except Exception as error:  # noqa: BLE001 - one failing section must not hide the others
            sections[name] = {"ok": False, "seconds": time.perf_counter() - mark,
                              "error": f"{type(error).__name__}: {error}\n{traceback.format_exc()[-3000:]}"}
            print(f"    FAILED: {type(error).__name__}: {str(error)[:500]}", flush=True)
            return None
        finally:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            self.save()

    def fail(self, name, error):
        self.report["sections"][name].update(ok=False, error=error)
        self.save()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu_smoke", action="store_true", help="tiny sizes on the CPU, to test this script")
    parser.add_argument("--out", type=Path, default=None, help="default: $OUT, else device_check_out/")
    parser.add_argument("--budget_s", type=float, default=420.0,
                        help="skip the sections not started after this many seconds (default 420)")
    parser.add_argument("--skip", nargs="*", default=[], help="section names to skip")
    args = parser.parse_args(argv)
    if not args.cpu_smoke and not torch.cuda.is_available():
        print(f"device_check: no CUDA device (torch {torch.__version__}, CUDA build {torch.version.cuda}); "
              "nothing to measure. Run it on a GPU machine, or pass --cpu_smoke to exercise the code on the CPU.")
        return 0
    out_dir = args.out or Path(os.environ.get("OUT") or "device_check_out")
    out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device("cpu") if args.cpu_smoke else torch.device("cuda", 0)
    if args.cpu_smoke:
        # One thread: tiny sizes gain nothing from more, and on a small machine busy with other work a second
        # thread is often descheduled, so that every parallel region waits for it (seconds a tiny step).
        torch.set_num_threads(1)
    # TF32 stays off (PyTorch's default): the fp32 eager logits are the reference of the attention check.
    check = Check(args.cpu_smoke, out_dir, args.budget_s, args.skip)
    s = check.report["settings"]
    check.report["environment"] = check.section("environment", environment, device) or {}
    peak = check.section("matmul_peak", matmul_peak, device, s["matmul_size"], s["matmul_repeats"])
    check.section("attention_agreement", attention_agreement, device, s)
    paper = check.section("paper_batch_training", paper_batch_training, device, s,
                          peak["best_tflops"] if peak else None, check.start + s["paper"]["start_by_s"])
    if paper is not None and paper["failures"]:
        check.fail("paper_batch_training", "; ".join(paper["failures"]))
    check.section("kernels", lambda: kernels.compare_kernels(**s["kernels"], device=device))
    check.section("benchmark", benchmark, device, s)
    run = check.section("training_run", training_run, device, s, args.cpu_smoke)
    if run is not None and not run["loss_falls"]:
        check.fail("training_run",
                   f"loss did not fall: {run['first_logged_loss']:.3f} -> {run['last_logged_loss']:.3f}")
    markdown, paths = check.save(complete=True)
    print(markdown)
    print(f"device_check: wrote {paths['json']} and {paths['md']}")
    return 0 if check.report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
