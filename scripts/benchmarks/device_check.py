#!/usr/bin/env python
"""One-shot GPU check of vanilla_transformer (run it through scripts/device_check.sh).

On a CUDA machine it measures, in a few minutes and installing nothing:

1. attention agreement: logits of eager, SDPA and (when installed) flash-attention against fp32 eager on a
   padded batch, plus SDPA forced onto its flash kernel on an unpadded batch (bf16);
2. the bf16 training step (autocast, fp32 master weights, fused AdamW: what Trainer --bf16 does) of the
   paper's base and big models: tokens/s, model TFLOP/s and model-FLOPs utilisation against a bf16 matmul
   peak measured on the same card, peak memory;
3. beam search (beam 4, bf16 weights, fixed output length): tokens/s and peak memory;
4. the same bf16 training step, ours vs MarianMTModel of the same shape, interleaved;
5. the performance comparisons of scripts/benchmarks/benchmark.py on this device (fp32, interleaved): ours vs
   MarianMTModel of the same shape (training step, greedy and beam-4 decoding, greedy with a static cache,
   which generate() compiles) and beam-4 vs the textbook no-cache decoder at growing output lengths;
6. a short bf16 training run of scripts/train.py on the built-in task (small model) whose loss must fall.

It writes device_check.json and device_check.md to $OUT if set, else device_check_out/ (or --out).
Without CUDA it prints why and exits 0. `--cpu_smoke` runs the same code on the CPU with tiny sizes (< 60 s),
for tests; its numbers mean nothing.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import toolkit

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the package from this checkout, installed or not

GIB = 2**30

GPU_SETTINGS = dict(
    attention_preset="base", vocab_size=37000, presets=("base", "big"), train_batch=384, source_length=64,
    target_length=64, warmup_steps=3, timed_steps=10, matmul_size=8192, matmul_repeats=10,
    beam_preset="base", beam_batch=64, beam_source_length=32, beam_new_tokens=32, beam_repeats=3,
    peers=dict(preset="base", vocab_size=37000, train_batch=64, length=32, decode_batch=64, new_tokens=30,
               curve=(10, 30, 100), repeats=5),
    run=dict(preset="small", vocab_size=4000, max_steps=200, batch=128, warmup=100, train_samples=20000,
             eval_samples=100, logging_steps=10, timeout_s=300, workers=2),
)
CPU_SMOKE_SETTINGS = dict(
    attention_preset="tiny", vocab_size=1000, presets=("tiny",), train_batch=4, source_length=8,
    target_length=8, warmup_steps=1, timed_steps=2, matmul_size=256, matmul_repeats=2,
    beam_preset="tiny", beam_batch=2, beam_source_length=8, beam_new_tokens=4, beam_repeats=1,
    peers=dict(preset="tiny", vocab_size=1000, train_batch=4, length=8, decode_batch=2, new_tokens=4, curve=(2, 4),
               repeats=1),
    run=dict(preset="tiny", vocab_size=300, max_steps=30, batch=16, warmup=10, train_samples=512,
             eval_samples=4, logging_steps=2, timeout_s=150, workers=0),
)


# Helpers -------------------------------------------------------------------------------------------------

def reset_peak(device):
    import torch

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device):
    import torch

    return torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None


def interleaved_ms(tasks: dict, device, repeats: int, warmup: int = 2) -> dict[str, float]:
    """Median milliseconds per call of each task, the systems taking turns, each call waited for on the device."""
    return toolkit.median_ms(tasks, repeats, warmup, device)


def timed(fn, device, repeats: int, warmup: int) -> list[float]:
    return toolkit.time_interleaved({"task": fn}, repeats, warmup, device)["task"]


def padded_batch(batch, source_length, target_length, vocab_size, device, seed=0, pad=True):
    """Right-padded sources and -100-padded labels with lengths in [L/2, L] (or full length)."""
    import torch

    from peers import padded_ids

    generator = torch.Generator().manual_seed(seed)
    if pad:
        input_ids, attention_mask = padded_ids(batch, source_length, vocab_size, generator)
        labels, label_mask = padded_ids(batch, target_length, vocab_size, generator)
        labels = labels.masked_fill(label_mask == 0, -100)
    else:
        input_ids = torch.randint(4, vocab_size, (batch, source_length), generator=generator)
        attention_mask = torch.ones_like(input_ids)
        labels = torch.randint(4, vocab_size, (batch, target_length), generator=generator)
    return {k: v.to(device) for k, v in
            {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}.items()}


def build_model(preset, vocab_size, device, attn="sdpa", dtype=None, dropout=None, seed=0):
    import torch

    from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

    overrides = {} if dropout is None else {"dropout": dropout}
    config = VanillaTransformerConfig.from_preset(preset, vocab_size=vocab_size, **overrides)
    torch.manual_seed(seed)
    model = VanillaTransformerForConditionalGeneration._from_config(config, attn_implementation=attn)
    model = model.to(device)
    return model.to(dtype) if dtype is not None else model


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

    batch = padded_batch(8, 32, 24, s["vocab_size"], device, seed=1)
    full = padded_batch(8, 32, 24, s["vocab_size"], device, seed=2, pad=False)
    reference = build_model(s["attention_preset"], s["vocab_size"], device, attn="eager", dropout=0.0).eval()
    state = reference.state_dict()

    def logits(impl, dtype, inputs, backend=None):
        model = build_model(s["attention_preset"], s["vocab_size"], device, attn="eager", dropout=0.0).eval()
        model.load_state_dict(state)
        model = model.to(dtype)
        model.set_attn_implementation(impl)
        context = torch.nn.attention.sdpa_kernel(backend) if backend is not None else torch.no_grad()
        with torch.no_grad(), context:
            return model(**inputs).logits.float()

    with torch.no_grad():
        ref_padded = reference(**batch).logits.float()
        ref_full = reference(**full).logits.float()
    out = {"preset": s["attention_preset"], "logit_scale": ref_padded.abs().max().item(), "padded": {}, "unpadded": {}}
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    for impl in ["eager", "sdpa", *flash_implementations()]:
        for dname, dtype in dtypes.items():
            if impl.startswith("flash") and dtype == torch.float32:
                continue  # flash kernels take fp16/bf16 only
            key = f"{impl}/{dname}"
            try:
                out["padded"][key] = (logits(impl, dtype, batch) - ref_padded).abs().max().item()
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


def autocast_train_step(model, batch, optimizer, device, losses: list | None = None):
    """One optimizer step as Trainer --bf16 takes it: bf16 autocast over fp32 weights; appends the loss to
    `losses` (still on the device: reading it would synchronise every step)."""
    import torch

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        if losses is not None:
            losses.append(loss.detach())
    return step


def train_step_throughput(device, preset, s, peak_tflops) -> dict:
    """bf16 autocast training step (fp32 weights, fused AdamW, paper dropout): tokens/s, MFU, peak memory."""
    import torch

    from peers import token_counts, training_flops

    reset_peak(device)
    model = build_model(preset, s["vocab_size"], device).train()
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9,
                                  fused=device.type == "cuda")
    batch = padded_batch(s["train_batch"], s["source_length"], s["target_length"], s["vocab_size"], device)
    losses = []
    step = autocast_train_step(model, batch, optimizer, device, losses)
    times = timed(step, device, s["timed_steps"], s["warmup_steps"])
    step_s = statistics.median(times)
    source_tokens = int(batch["attention_mask"].sum())
    target_tokens = int((batch["labels"] != -100).sum())
    source_width, target_width = batch["input_ids"].shape[1], batch["labels"].shape[1]
    # Model FLOPs of the batch's tokens (the model computes the padding too; see `token_counts`).
    flops = training_flops(model.config, s["train_batch"], source_width, target_width, True, *token_counts(batch))
    result = {
        "preset": preset, "parameters": params, "batch": s["train_batch"], "source_width": source_width,
        "target_width": target_width, "source_tokens": source_tokens, "target_tokens": target_tokens,
        "step_ms": step_s * 1e3, "step_ms_min": min(times) * 1e3,
        "tokens_per_s": (source_tokens + target_tokens) / step_s, "target_tokens_per_s": target_tokens / step_s,
        "model_tflops": flops / step_s / 1e12, "mfu": flops / step_s / 1e12 / peak_tflops if peak_tflops else None,
        "peak_memory_gib": peak_gib(device),
        "loss_finite": bool(losses) and all(bool(torch.isfinite(x)) for x in losses),
    }
    del model, optimizer
    return result


def beam_throughput(device, s) -> dict:
    import torch

    from peers import generate_fixed_length

    reset_peak(device)
    model = build_model(s["beam_preset"], s["vocab_size"], device, dtype=torch.bfloat16).eval()
    batch = padded_batch(s["beam_batch"], s["beam_source_length"], 2, s["vocab_size"], device, seed=3)
    output = {}

    def decode():
        with torch.inference_mode():
            output["ids"] = generate_fixed_length(model, batch["input_ids"], batch["attention_mask"],
                                                  s["beam_new_tokens"], num_beams=4)

    times = timed(decode, device, s["beam_repeats"], warmup=1)
    seconds = statistics.median(times)
    new_tokens = s["beam_batch"] * s["beam_new_tokens"]
    return {"preset": s["beam_preset"], "batch": s["beam_batch"], "num_beams": 4, "new_tokens": s["beam_new_tokens"],
            "seconds": seconds, "tokens_per_s": new_tokens / seconds, "sentences_per_s": s["beam_batch"] / seconds,
            "output_shape": list(output["ids"].shape), "peak_memory_gib": peak_gib(device)}


def train_vs_marian_bf16(device, s) -> dict:
    """Ours vs MarianMTModel of the same shape at a training batch of real size (the bf16 section's), trained the
    way Trainer --bf16 does: autocast, fp32 weights, fused AdamW. Interleaved."""
    import torch

    import peers

    spec = peers.BenchmarkSpec(
        preset=s["attention_preset"], vocab_size=s["vocab_size"], batch_size=s["train_batch"],
        source_length=s["source_length"], target_length=s["target_length"], threads=torch.get_num_threads())
    models = {name: model.to(device).train() for name, model in peers.build_models(spec).items()}
    config = models["ours"].config
    batch = {k: v.to(device) for k, v in peers.training_batch(spec, config).items()}

    def train_step(model):
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4,
                                      fused=device.type == "cuda")
        return autocast_train_step(model, batch, optimizer, device)

    steps = {name: train_step(model) for name, model in models.items()}

    ms = interleaved_ms(steps, device, s["timed_steps"], s["warmup_steps"])
    del models, steps
    return {"preset": spec.preset, "batch": spec.batch_size, "source_width": batch["input_ids"].shape[1],
            "target_width": batch["labels"].shape[1], "tokens": peers.token_counts(batch), "step_ms": ms,
            "speed_vs_marian": ms["marian"] / ms["ours"]}


def speed_vs_peers(device, s) -> dict:
    """scripts/benchmarks/benchmark.py's comparisons on this device, fp32 and interleaved as there: ours vs MarianMTModel of
    the same shape (training step, greedy and beam-4 decoding of a fixed length), and beam 4 against the
    textbook decoder (no cache) as the output grows. Ratios are peer time / our time."""
    import torch

    import peers

    p = s["peers"]
    spec = peers.BenchmarkSpec(
        preset=p["preset"], vocab_size=p["vocab_size"], batch_size=p["train_batch"], source_length=p["length"],
        target_length=p["length"], generation_batch_size=p["decode_batch"], new_tokens=p["new_tokens"],
        curve_lengths=p["curve"], repeats=p["repeats"], threads=torch.get_num_threads())
    models = {name: model.to(device) for name, model in peers.build_models(spec).items()}
    config = models["ours"].config
    textbook = peers.TextbookDecoder(models["ours"])

    def medians_ms(tasks, repeats, warmup=2):
        return interleaved_ms(tasks, device, repeats, warmup)

    batch = {k: v.to(device) for k, v in peers.training_batch(spec, config).items()}
    steps = {name: peers.make_train_step(model, batch) for name, model in models.items()}

    train = medians_ms(steps, p["repeats"])
    result = {"preset": p["preset"], "vocab_size": p["vocab_size"], "targets": peers.TARGETS,
              "train_ms": train, "train_speed_vs_marian": train["marian"] / train["ours"]}
    source = {k: v.to(device) for k, v in peers.source_batch(spec, config, p["decode_batch"]).items()}
    outputs = {}
    for workload, beams in (("greedy", 1), ("beam", 4)):
        def ours_or_marian(name, b=beams):
            outputs[name, b] = peers.generate_fixed_length(models[name], **source, new_tokens=p["new_tokens"],
                                                                  num_beams=b)

        def textbook_run(b=beams):
            outputs["textbook", b] = textbook.decode(**source, new_tokens=p["new_tokens"], num_beams=b)

        ms = medians_ms({"ours": lambda: ours_or_marian("ours"), "marian": lambda: ours_or_marian("marian"),
                         "textbook": textbook_run}, p["repeats"])
        result[f"{workload}_ms"] = ms
        result[f"{workload}_speed_vs_marian"] = ms["marian"] / ms["ours"]
        result[f"{workload}_speed_vs_textbook"] = ms["textbook"] / ms["ours"]
        # Same weights: the textbook decoder's tokens should be ours (GPU reductions may flip a near-tie).
        result[f"{workload}_textbook_equals_ours"] = torch.equal(outputs["textbook", beams], outputs["ours", beams])
    # A static cache: generate() then compiles each model's decoding step (CUDA graphs on a GPU).
    static = {}
    for name in ("ours", "marian"):
        def decode_static(name=name):
            static[name] = peers.generate_fixed_length(models[name], **source, new_tokens=p["new_tokens"],
                                                              cache_implementation="static")
        static[name + " task"] = decode_static
    ms = medians_ms({name: static.pop(name + " task") for name in ("ours", "marian")}, p["repeats"], warmup=2)
    result["greedy_static_cache_ms"] = ms
    result["greedy_static_cache_speed_vs_marian"] = ms["marian"] / ms["ours"]
    result["greedy_static_cache_speed_vs_textbook"] = result["greedy_ms"]["textbook"] / ms["ours"]
    result["greedy_static_cache_equals_dynamic"] = torch.equal(static["ours"], outputs["ours", 1])
    curve = []
    for length in p["curve"]:
        ms = medians_ms({
            "ours": lambda n=length: peers.generate_fixed_length(models["ours"], **source, new_tokens=n,
                                                                        num_beams=4),
            "textbook": lambda n=length: textbook.beam(**source, new_tokens=n, num_beams=4),
        }, max(1, p["repeats"] - 1), warmup=0)
        curve.append({"new_tokens": length, "ours_ms": ms["ours"], "textbook_ms": ms["textbook"],
                      "speedup": ms["textbook"] / ms["ours"]})
    result["beam_vs_textbook"] = curve
    del models, textbook
    return result


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


def render_markdown(report: dict) -> str:
    env = report.get("environment", {})
    lines = [f"# vanilla_transformer device check ({'CPU smoke, numbers mean nothing' if report['cpu_smoke'] else env.get('gpu', '?')})",
             "", f"torch {env.get('torch')} (CUDA {env.get('cuda_build')}), transformers {env.get('transformers')}, "
             f"accelerate {env.get('accelerate')}; flash-attention packages: {env.get('flash_attention_packages') or 'none'}; "
             f"total {report['wall_s']:.0f} s", ""]
    peak = report["sections"].get("matmul_peak", {}).get("result")
    if peak:
        lines += [f"bf16 matmul peak ({peak['size']}³): **{peak['best_tflops']:.0f} TFLOP/s** (best), "
                  f"{peak['median_tflops']:.0f} (median)", ""]
    attention = report["sections"].get("attention_agreement", {}).get("result")
    if attention:
        lines += [f"## Attention agreement ({attention['preset']}; max |logit − fp32 eager logit|, logits up to "
                  f"{attention['logit_scale']:.3g})", "", "| batch | implementation / dtype | max abs diff |", "| --- | --- | --- |"]
        for kind in ("padded", "unpadded"):
            for name, value in attention.get(kind, {}).items():
                lines.append(f"| {kind} | {name} | {_fmt(value)} |")
        lines.append("")
    rows = [v["result"] for k, v in report["sections"].items() if k.startswith("train_step_") and v.get("result")]
    if rows:
        lines += ["## bf16 training step (autocast, fused AdamW)", "",
                  "| preset | params | batch (src×tgt width) | step ms | tokens/s "
                  "| target tokens/s | model TFLOP/s | MFU | peak GiB |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            mfu = "–" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
            lines.append(f"| {r['preset']} | {r['parameters'] / 1e6:.1f}M | {r['batch']} ({r['source_width']}×{r['target_width']}) "
                         f"| {r['step_ms']:.1f} | {r['tokens_per_s']:,.0f} | {r['target_tokens_per_s']:,.0f} "
                         f"| {r['model_tflops']:.1f} | {mfu} | {_fmt(r['peak_memory_gib'])} |")
        lines.append("")
    beam = report["sections"].get("beam_search", {}).get("result")
    if beam:
        lines += ["## Beam search (bf16 weights, fixed length)", "",
                  "| preset | batch | beams | new tokens | s | tokens/s | sentences/s | peak GiB |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |",
                  f"| {beam['preset']} | {beam['batch']} | {beam['num_beams']} | {beam['new_tokens']} | {beam['seconds']:.3f} "
                  f"| {beam['tokens_per_s']:,.0f} | {beam['sentences_per_s']:,.1f} | {_fmt(beam['peak_memory_gib'])} |", ""]
    versus = report["sections"].get("train_vs_marian_bf16", {}).get("result")
    if versus:
        ms = versus["step_ms"]
        lines += [f"## Training step vs MarianMTModel, bf16 autocast, fused AdamW ({versus['preset']}, batch "
                  f"{versus['batch']}, {versus['source_width']}×{versus['target_width']})", "",
                  "| ours ms | Marian ms | ours/Marian |", "| --- | --- | --- |",
                  f"| {ms['ours']:.1f} | {ms['marian']:.1f} | {versus['speed_vs_marian']:.2f}x |", ""]
    peers = report["sections"].get("speed_vs_peers", {}).get("result")
    if peers:
        t = peers["targets"]
        lines += [f"## Speed vs MarianMTModel and the textbook decoder ({peers['preset']}, vocabulary "
                  f"{peers['vocab_size']:,}, fp32; ratios: peer time / our time)", "",
                  "| workload | ours ms | Marian ms | textbook ms | ours/Marian | target | ours/textbook |",
                  "| --- | --- | --- | --- | --- | --- | --- |",
                  f"| training step | {peers['train_ms']['ours']:.1f} | {peers['train_ms']['marian']:.1f} | – "
                  f"| {peers['train_speed_vs_marian']:.2f}x | ≥ {t['train_speed_vs_marian']}x | – |"]
        for workload in ("greedy", "beam"):
            ms = peers[f"{workload}_ms"]
            lines.append(f"| {workload} | {ms['ours']:.1f} | {ms['marian']:.1f} | {ms['textbook']:.1f} "
                         f"| {peers[f'{workload}_speed_vs_marian']:.2f}x | ≥ {t[f'{workload}_speed_vs_marian']}x "
                         f"| {peers[f'{workload}_speed_vs_textbook']:.2f}x |")
        if "greedy_static_cache_ms" in peers:
            ms = peers["greedy_static_cache_ms"]
            lines.append(f"| greedy, static cache (compiled) | {ms['ours']:.1f} | {ms['marian']:.1f} | – "
                         f"| {peers['greedy_static_cache_speed_vs_marian']:.2f}x | – "
                         f"| {peers['greedy_static_cache_speed_vs_textbook']:.2f}x |")
        if "greedy_static_cache_equals_dynamic" in peers:
            lines.append(f"Static-cache tokens equal the dynamic cache's: "
                         f"{_fmt(peers['greedy_static_cache_equals_dynamic'])}.")
        lines += ["", "Beam 4 vs the textbook decoder: " + ", ".join(
            f"{c['new_tokens']} tokens {c['speedup']:.1f}x" for c in peers["beam_vs_textbook"])
            + f" (target ≥ {t['beam_speed_vs_textbook_at_30']}x at 30). Textbook tokens equal ours: greedy "
            f"{_fmt(peers['greedy_textbook_equals_ours'])}, beam {_fmt(peers['beam_textbook_equals_ours'])}.", ""]
    run = report["sections"].get("training_run", {}).get("result")
    if run:
        lines += ["## Training run (scripts/train.py --bf16, built-in task)", "",
                  "| preset | steps | batch | first loss | last loss | falls | test BLEU | train s | wall s |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
                  f"| {run['preset']} | {run['steps']} | {run['batch']} | {run['first_logged_loss']:.3f} | "
                  f"{run['last_logged_loss']:.3f} | {_fmt(run['loss_falls'])} | {_fmt(run['test_bleu'])} | "
                  f"{_fmt(run['train_runtime_s'])} | {run['wall_s']:.0f} |", ""]
    problems = {k: v for k, v in report["sections"].items() if not v.get("ok")}
    if problems:
        lines += ["## Problems", ""] + [f"- **{k}**: {v.get('error', 'failed')[:1000]}" for k, v in problems.items()] + [""]
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
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    # TF32 stays off (PyTorch's default): the fp32 eager logits are the reference of the attention check.

    start = time.perf_counter()
    report = {"cpu_smoke": args.cpu_smoke, "settings": settings, "sections": {}}

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

    report["environment"] = section("environment", environment, device) or {}
    peak = section("matmul_peak", matmul_peak, device, settings["matmul_size"], settings["matmul_repeats"])
    section("attention_agreement", attention_agreement, device, settings)
    for preset in settings["presets"]:
        result = section(f"train_step_{preset}", train_step_throughput, device, preset, settings,
                         peak["best_tflops"] if peak else None)
        if result is not None and not result["loss_finite"]:
            report["sections"][f"train_step_{preset}"]["ok"] = False
            report["sections"][f"train_step_{preset}"]["error"] = "non-finite loss"
    section("beam_search", beam_throughput, device, settings)
    section("train_vs_marian_bf16", train_vs_marian_bf16, device, settings)
    section("speed_vs_peers", speed_vs_peers, device, settings)
    run = section("training_run", training_run, device, settings, args.cpu_smoke)
    if run is not None and not run["loss_falls"]:
        report["sections"]["training_run"]["ok"] = False
        report["sections"]["training_run"]["error"] = (
            f"loss did not fall: {run['first_logged_loss']:.3f} -> {run['last_logged_loss']:.3f}")

    report["wall_s"] = time.perf_counter() - start
    report["ok"] = all(v.get("ok") for v in report["sections"].values())
    markdown = render_markdown(report)
    paths = toolkit.write_report(out_dir / "device_check", report, markdown)
    print(markdown)
    print(f"device_check: wrote {paths['json']} and {paths['md']}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
