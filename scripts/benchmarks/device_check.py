"""The GPU acceptance check, run through scripts/device_check.sh (whose header lists the sections). The paper-batch
section trains at §5.1's batch (~25,000 source and target tokens: ~1,040 rows of 32 positions a side, lengths uniform
in [16, 32] as in Multi30k) as Trainer --bf16 trains; `scripts/recipes/wmt14_en_de.py --cost_table` projects the
paper's runs from it. The report (device_check.json and .md in --out, else $OUT, else device_check_out/) is rewritten
after every section, so a run stopped by the wrapper's time limit keeps what it measured. `--cpu_smoke` runs the same
code on the CPU with tiny sizes, for the tests; its numbers mean nothing.
"""

import argparse
import contextlib
import dataclasses
import gc
import json
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

from scripts.utils.reports import device_check_report, write_report

from . import kernels, peers, toolkit, workloads

REPO = Path(__file__).resolve().parents[2]
# The paper-batch step's speed-ups (`peers.compiled_training`'s), > 1: ours (compiled, or eager) faster.
RATIOS = ("compiled_speed_vs_marian_compiled", "compiled_speed_vs_eager", "eager_speed_vs_marian_eager")

GPU_SETTINGS = dict(
    attention=dict(preset="base", vocab_size=37000), matmul_size=8192, matmul_repeats=10,
    # A preset not started `start_by_s` seconds into the check is skipped: its inductor compiles (~40-70 s each
    # with 16 cores) must not run the check into the wrapper's 470 s kill.
    paper=dict(presets=("base", "big"), vocab_size=37000, tokens=25000, width=32, warmup_steps=3, timed_steps=8,
               compile_backend=None, start_by_s=250),
    kernels=dict(tokens=25000, vocab_size=37000, label_smoothing=0.1, repeats=10),
    # BenchmarkSpec fields; the benchmark's compiled training step is left to the paper-batch section.
    benchmark=dict(preset="base", vocab_size=37000, batch_size=64, source_length=32, target_length=32,
                   generation_batch_size=64, new_tokens=30, repeats=3, matmul_size=8192, compile_backend=None),
    run=dict(preset="small", vocab_size=4000, max_steps=150, batch=128, warmup=100, train_samples=20000,
             eval_samples=100, logging_steps=10, timeout_s=300, workers=2),
)
CPU_SMOKE_SETTINGS = dict(
    attention=dict(preset="tiny", vocab_size=1000), matmul_size=256, matmul_repeats=2,
    paper=dict(presets=("tiny",), vocab_size=1000, tokens=96, width=8, warmup_steps=0, timed_steps=1,
               compile_backend="aot_eager", start_by_s=300),
    kernels=dict(tokens=64, vocab_size=1000, label_smoothing=0.1, repeats=1),
    benchmark=dict(preset="tiny", vocab_size=1000, batch_size=4, source_length=8, target_length=8,
                   generation_batch_size=2, new_tokens=4, repeats=1, warmup=0, matmul_size=128, compile_backend=None),
    run=dict(preset="tiny", vocab_size=300, max_steps=20, batch=16, warmup=8, train_samples=320,
             eval_samples=4, logging_steps=2, timeout_s=150, workers=0),
)


def spec_on(device, **fields) -> workloads.BenchmarkSpec:
    """A benchmark spec on `device`, with this process's threads and no CPU memory measurement."""
    return workloads.BenchmarkSpec(**{"device": str(device), "memory": False, "threads": torch.get_num_threads(),
                                      **fields})


def flash_implementations() -> list[str]:
    from transformers.utils import is_flash_attn_2_available, is_flash_attn_3_available

    return [name for name, available in (("flash_attention_2", is_flash_attn_2_available),
                                         ("flash_attention_3", is_flash_attn_3_available)) if available()]


def environment(device) -> dict:
    import accelerate

    return {**toolkit.environment(device), "accelerate": accelerate.__version__,
            "flash_attention_packages": flash_implementations()}


def matmul_peak(device, size, repeats) -> dict:
    """bf16 (size x size) @ (size x size): the practical peak this card reaches, the denominator of MFU."""
    peak = toolkit.matmul_peak(size, repeats, device, torch.bfloat16)
    return {"size": size, "best_tflops": peak["flops"] / 1e12, "median_tflops": peak["median_flops"] / 1e12}


def attention_agreement(device, s) -> dict:
    """Max |logits - fp32 eager logits| of eager, SDPA and flash-attention (when installed) in fp32 and bf16 on a
    padded batch, and of SDPA on each of its kernels on an unpadded one (bf16); the scale: max |fp32 logits|."""
    spec = spec_on(device, **s["attention"], batch_size=8, source_length=32, target_length=24,
                   config_overrides={"dropout": 0.0})
    config = workloads.model_config(spec)
    generator = torch.Generator().manual_seed(2)
    ids, labels = (torch.randint(4, config.vocab_size, (8, n), generator=generator).to(device) for n in (32, 24))
    batches = {"padded": workloads.training_batch(spec, config, seed=1),
               "unpadded": {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}}

    def logits(kind, impl="eager", dtype=torch.float32, backend=None):
        model = workloads.build_model(spec, attn_implementation="eager").eval().to(dtype)
        model.set_attn_implementation(impl)
        with torch.no_grad(), torch.nn.attention.sdpa_kernel(backend) if backend else contextlib.nullcontext():
            return model(**batches[kind]).logits.float()

    references = {kind: logits(kind) for kind in batches}

    def gap(kind, *how):
        try:
            return (logits(kind, *how) - references[kind]).abs().max().item()
        except Exception as error:  # noqa: BLE001 - recorded, not fatal
            return f"error: {type(error).__name__}: {error}"[:300]

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    out = {"preset": spec.preset, "logit_scale": references["padded"].abs().max().item(), "padded": {
        f"{impl}/{name}": gap("padded", impl, dtype) for impl in ["eager", "sdpa", *flash_implementations()]
        for name, dtype in dtypes.items() if not (impl.startswith("flash") and name == "fp32")}}  # no fp32 flash
    backends = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH") if device.type == "cuda" else ()
    out["unpadded"] = {f"sdpa[{name.lower()}]/bf16": gap("unpadded", "sdpa", torch.bfloat16,
                                                         getattr(torch.nn.attention.SDPBackend, name))
                       for name in backends}
    out["unpadded"]["eager/bf16"] = gap("unpadded", "eager", torch.bfloat16)
    return out


def step_peak_gib(step, device) -> float | None:
    """Peak memory of one training step (`make_train_step`'s) as if its system were alone on the device: less what
    the other systems keep (their weights, gradients and optimizer state)."""
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
    return (torch.cuda.max_memory_allocated(device) - others) / 2**30


def paper_batch_preset(spec, batch, peak_tflops, errors) -> dict:
    """One preset of `paper_batch_training`: `peers.compiled_training` under bf16 autocast, and per system its MFU
    and peak memory; a system whose first step (its compilation) fails is left out, its error in `errors`."""
    device, models = torch.device(spec.device), workloads.build_models(spec)
    # Trainer's default optimizer on a GPU (adamw_torch_fused) with the paper's betas and epsilon (§5.3).
    steps = workloads.training_steps(models, batch, spec.compile_backend, autocast=torch.bfloat16,
                                     optimizer=lambda params: paper_adam(params, lr=1e-4, fused=device.type == "cuda"))
    timed = peers.compiled_training(steps, batch, spec)
    errors.update({f"{spec.preset}/{name}": error for name, error in timed["errors"].items()})
    tokens = workloads.token_counts(batch)
    flops = workloads.training_flops(models["ours"].config, *batch["input_ids"].shape, batch["labels"].shape[1],
                                     True, *tokens)
    result = {"parameters": workloads.parameter_counts(models["ours"])["trainable"], "systems": {},
              "dropout": models["ours"].config.dropout, "model_tflop_per_step": flops / 1e12,
              **{key: timed[key] for key in RATIOS}}
    for name, system in timed["systems"].items():
        tflops = flops / system["median_s"] / 1e12
        result["systems"][name] = {
            "step_ms": system["median_s"] * 1e3, "tokens_per_s": sum(tokens) / system["median_s"],
            "model_tflops": tflops, "mfu": tflops / peak_tflops if peak_tflops else None,
            "peak_memory_gib": step_peak_gib(steps[name], device), "compile_s": system["compile_s"],
            "loss_finite": system["loss_finite"]}
    return result


def paper_batch_training(device, s, peak_tflops, start_by) -> dict:
    """The bf16 training step at the paper's batch, ours and Marian, eager and compiled. `failures`: a non-finite
    loss, or a preset whose compiled ours did not run (not started by `start_by`, a perf_counter time, or failed)."""
    p = s["paper"]
    # Real lengths average 3/4 of the width, so this many rows hold about `tokens` real tokens a side.
    rows = round(p["tokens"] / (0.75 * p["width"]))
    spec = spec_on(device, preset=p["presets"][0], vocab_size=p["vocab_size"], batch_size=rows,
                   source_length=p["width"], target_length=p["width"], repeats=p["timed_steps"],
                   warmup=p["warmup_steps"], compile_backend=p["compile_backend"] or "inductor")
    config = workloads.model_config(spec)
    # Padded to the full width, as a collator padding to a multiple of it pads.
    pads = {"input_ids": config.pad_token_id, "attention_mask": 0, "labels": -100}
    batch = {name: F.pad(t, (0, p["width"] - t.shape[1]), value=pads[name])
             for name, t in workloads.training_batch(spec, config, seed=4).items()}
    source_tokens, target_tokens = workloads.token_counts(batch)
    result = {"rows": rows, "width": p["width"], "vocab_size": p["vocab_size"], "source_tokens": source_tokens,
              "target_tokens": target_tokens, "compile_backend": spec.compile_backend, "presets": {}, "errors": {}}
    for preset in p["presets"]:
        if time.perf_counter() > start_by:
            result["errors"][preset] = f"not started: past {p['start_by_s']} s into the check"
            continue
        # A fresh dynamo per preset: the models' shared transformers wrappers stay far from the recompile limit.
        torch._dynamo.reset()
        try:
            result["presets"][preset] = paper_batch_preset(dataclasses.replace(spec, preset=preset), batch,
                                                           peak_tflops, result["errors"])
        finally:
            torch._dynamo.reset()
            gc.collect()
    result["failures"] = [
        *(f"{preset}: ours_compiled did not run" for preset in p["presets"]
          if "ours_compiled" not in result["presets"].get(preset, {}).get("systems", {})),
        *(f"{preset}/{name}: non-finite loss" for preset, r in result["presets"].items()
          for name, system in r["systems"].items() if not system["loss_finite"])]
    return result


def training_run(device, s, cpu_smoke: bool) -> dict:
    """scripts/train.py --bf16 on the built-in task in a subprocess; the logged loss must fall."""
    r = s["run"]
    env = toolkit.offline_env(PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                              **({"OMP_NUM_THREADS": "1"} if cpu_smoke else {}))
    with tempfile.TemporaryDirectory(prefix="vt_device_check_") as tmp:
        output_dir = Path(tmp, "run")
        flags = dict(output_dir=output_dir, preset=r["preset"], vocab_size=r["vocab_size"], max_steps=r["max_steps"],
                     per_device_train_batch_size=r["batch"], warmup_steps=r["warmup"],
                     max_train_samples=r["train_samples"], max_eval_samples=r["eval_samples"],
                     logging_steps=r["logging_steps"], save_strategy="steps", save_steps=r["max_steps"],
                     save_total_limit=1, eval_strategy="no", report_to="none", seed=0, num_examples=2,
                     dataloader_num_workers=r["workers"])
        args = [sys.executable, str(REPO / "scripts" / "train.py"), "--bf16", *(["--use_cpu"] if cpu_smoke else []),
                *(item for name, value in flags.items() for item in (f"--{name}", str(value)))]
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
            "loss_falls": losses[-1][1] < 0.9 * losses[0][1], "loss_curve": losses, "test_bleu": test.get("bleu")}


class Check:
    """The sections one after another, each timed, its result or error recorded and the report rewritten; a failing
    section does not stop the others, and none starts past the time budget."""

    def __init__(self, cpu_smoke: bool, out_dir: Path, budget_s: float):
        self.out_dir, self.budget_s, self.start = out_dir, budget_s, time.perf_counter()
        self.report = {"cpu_smoke": cpu_smoke, "settings": CPU_SMOKE_SETTINGS if cpu_smoke else GPU_SETTINGS,
                       "sections": {}}

    def save(self, complete=False):
        self.report.update(wall_s=time.perf_counter() - self.start, complete=complete)
        self.report["ok"] = complete and all(v["ok"] for v in self.report["sections"].values())
        markdown = device_check_report(self.report)
        return markdown, write_report(self.out_dir / "device_check", self.report, markdown)

    def section(self, name, fn, *args, check=None):
        """Run `fn(*args)` as section `name`; `check(result)` may name a failure (or return None)."""
        sections, elapsed = self.report["sections"], time.perf_counter() - self.start
        if elapsed > self.budget_s:
            sections[name] = {"ok": False, "error": f"not started: {elapsed:.0f} s > budget {self.budget_s:.0f} s"}
            return None
        print(f"[device_check {elapsed:6.1f}s] {name} ...", flush=True)
        mark = time.perf_counter()
        try:
            result = fn(*args)
            failure = check(result) if check else None
            sections[name] = {"ok": not failure, "seconds": time.perf_counter() - mark, "result": result,
                              **({"error": failure} if failure else {})}
            print(f"    {failure or json.dumps(result, default=str)[:600]}", flush=True)
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu_smoke", action="store_true", help="tiny sizes on the CPU, to test this script")
    parser.add_argument("--out", type=Path, default=None, help="default: $OUT, else device_check_out/")
    parser.add_argument("--budget_s", type=float, default=420.0,
                        help="skip the sections not started after this many seconds (default 420)")
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
    check = Check(args.cpu_smoke, out_dir, args.budget_s)
    s = check.report["settings"]
    check.report["environment"] = check.section("environment", environment, device) or {}
    peak = check.section("matmul_peak", matmul_peak, device, s["matmul_size"], s["matmul_repeats"])
    check.section("attention_agreement", attention_agreement, device, s)
    check.section("paper_batch_training", paper_batch_training, device, s, peak and peak["best_tflops"],
                  check.start + s["paper"]["start_by_s"], check=lambda paper: "; ".join(paper["failures"]))
    check.section("kernels", lambda: kernels.compare_kernels(**s["kernels"], device=device))
    check.section("benchmark", lambda: peers.run_benchmark(spec_on(device, **s["benchmark"]),
                                                           log=lambda message: print(f"    {message}", flush=True)))
    check.section("training_run", training_run, device, s, args.cpu_smoke, check=lambda run: None if run["loss_falls"]
                  else f"loss did not fall: {run['first_logged_loss']:.3f} -> {run['last_logged_loss']:.3f}")
    markdown, paths = check.save(complete=True)
    print(markdown)
    print(f"device_check: wrote {paths['json']} and {paths['md']}")
    return 0 if check.report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
