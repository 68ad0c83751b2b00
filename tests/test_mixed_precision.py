"""bf16 on the CPU: autocast training steps and beam search stay finite and close to fp32; bf16 weights with
padded (and all-padding) rows give no NaN under eager and SDPA attention; masks, softmax and loss keep their
precision; Trainer's --bf16 runs the model under autocast.

Tolerances (measured on the tiny model, 2+2 layers, d_model 32): loss relative 1e-2 (measured 7e-7 sdpa,
2e-4 eager); gradient relative error 0.15 and cosine >= 0.99 (measured ~0.045 and 0.999); beam
`sequences_scores` absolute 0.15 (measured <= 0.03 on scores of about -10).
"""

import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask

from conftest import random_batch, tiny_model
from vanilla_transformer.modeling_vanilla_transformer import eager_attention_forward

REPO = Path(__file__).resolve().parents[1]
IMPLEMENTATIONS = ["eager", "sdpa"]
BF16 = torch.bfloat16


def _batch():
    input_ids, attention_mask, labels = random_batch(batch=4, source_length=9, target_length=7)
    labels[2, 4:] = -100  # a shorter target
    return input_ids, attention_mask, labels


def _padded_batch():
    """Right-padded sources of different lengths, one all-padding row (no source, no target)."""
    input_ids, attention_mask, labels = _batch()
    attention_mask[3] = 0
    input_ids[3] = 0
    labels[3] = -100
    return input_ids, attention_mask, labels


def _model(impl, **overrides):
    model = tiny_model(label_smoothing=0.1, **overrides)
    model.set_attn_implementation(impl)
    return model


def _loss_and_grads(model, batch, autocast: bool):
    input_ids, attention_mask, labels = batch
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=BF16, enabled=autocast):
        out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    out.loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return out, grads


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_bf16_autocast_training_step_is_finite_and_close_to_fp32(impl):
    model = _model(impl).train()
    batch = _batch()
    reference, reference_grads = _loss_and_grads(model, batch, autocast=False)
    out, grads = _loss_and_grads(model, batch, autocast=True)
    assert out.logits.dtype == BF16  # autocast really ran the projections in bf16
    assert out.loss.dtype == torch.float32  # the loss is computed from logits.float()
    assert torch.isfinite(out.loss) and torch.isfinite(grads).all()
    assert out.loss.item() == pytest.approx(reference.loss.item(), rel=1e-2)
    relative_error = ((grads - reference_grads).norm() / reference_grads.norm()).item()
    assert relative_error < 0.15
    assert F.cosine_similarity(grads, reference_grads, dim=0).item() > 0.99
    # The optimizer step that follows keeps every weight finite.
    torch.optim.AdamW(model.parameters(), lr=1e-3).step()
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_bf16_autocast_beam_search_is_finite_and_close_to_fp32(impl):
    model = _model(impl).eval()
    input_ids, attention_mask, _ = _batch()
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, num_beams=4, max_new_tokens=8,
                  output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        reference = model.generate(**kwargs)
        with torch.autocast("cpu", dtype=BF16):
            out = model.generate(**kwargs)
    assert torch.isfinite(out.sequences_scores).all()
    assert (out.sequences_scores - reference.sequences_scores).abs().max().item() < 0.15
    assert (out.sequences[:, :2] == reference.sequences[:, :2]).all()  # the first steps are not near ties here


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_bf16_weights_with_padding_and_an_all_padding_row_give_no_nan(impl):
    model = _model(impl).to(BF16).train()
    input_ids, attention_mask, labels = _padded_batch()
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    assert out.logits.dtype == BF16 and out.loss.dtype == torch.float32
    assert torch.isfinite(out.encoder_last_hidden_state).all()
    assert torch.isfinite(out.logits).all()
    assert torch.isfinite(out.loss)
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    # An explicit decoder mask with an all-padding row too.
    decoder_mask = (labels != -100).long()
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels,
                decoder_attention_mask=decoder_mask)
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.loss)

    model.eval()
    with torch.no_grad():
        generated = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=4,
                                   max_new_tokens=6, output_scores=True, return_dict_in_generate=True)
    assert torch.isfinite(generated.sequences_scores).all()


@pytest.mark.parametrize("dtype", [BF16, torch.float16])
def test_eager_masks_use_the_dtypes_finite_minimum(dtype):
    """transformers.masking_utils builds additive eager masks from torch.finfo(dtype).min, not -inf, so that a
    fully masked row softmaxes to a uniform distribution instead of NaN."""
    model = _model("eager")
    _, attention_mask, _ = _padded_batch()
    embeds = torch.zeros(*attention_mask.shape, model.config.d_model, dtype=dtype)
    for mask in (create_bidirectional_mask(model.config, embeds, attention_mask),
                 create_causal_mask(model.config, embeds, attention_mask, None)):
        assert mask.dtype == dtype
        assert torch.isfinite(mask).all()
        assert mask.min().item() == torch.finfo(dtype).min
        assert set(mask.unique().tolist()) == {0.0, torch.finfo(dtype).min}


def test_eager_softmax_runs_in_fp32():
    module = torch.nn.Module()
    module.training = False
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(2, 4, 5, 8, generator=generator).mul(4).to(BF16) for _ in range(3))
    _, weights = eager_attention_forward(module, query, key, value, None, scaling=8**-0.5)
    scores = torch.matmul(query, key.transpose(2, 3)) * 8**-0.5
    assert weights.dtype == BF16
    assert torch.equal(weights, F.softmax(scores.float(), dim=-1).to(BF16))
    # A fully masked query row (additive finfo.min everywhere) gets uniform weights, not NaN.
    mask = torch.zeros(2, 1, 5, 5, dtype=BF16)
    mask[1, :, 2, :] = torch.finfo(BF16).min
    _, weights = eager_attention_forward(module, query, key, value, mask, scaling=8**-0.5)
    assert torch.isfinite(weights).all()
    assert torch.allclose(weights[1, :, 2].float(), torch.full((4, 5), 0.2), atol=1e-3)


def test_loss_is_fp32_with_bf16_weights():
    model = _model("sdpa").to(BF16).eval()
    input_ids, attention_mask, labels = _batch()
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    expected = F.cross_entropy(out.logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100,
                               label_smoothing=0.1)
    assert out.loss.dtype == torch.float32
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_trainer_bf16_flag_trains_under_autocast_on_cpu(tmp_path, monkeypatch):
    """`--bf16 --use_cpu`: accelerate wraps the forward in CPU autocast (bf16); the loss stays fp32 and falls."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import train
    finally:
        sys.path.remove(str(REPO / "scripts"))
    from vanilla_transformer import training

    seen = []
    compute_loss = training.PaperTrainer.compute_loss

    def recording_compute_loss(self, model, inputs, *args, **kwargs):
        base = self.accelerator.unwrap_model(model)
        if not getattr(base, "_autocast_probe", False):
            base.lm_head.register_forward_pre_hook(
                lambda module, args: seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))))
            base._autocast_probe = True
        loss = compute_loss(self, model, inputs, *args, **kwargs)
        seen.append(("loss", (loss[0] if isinstance(loss, tuple) else loss).dtype))
        return loss

    monkeypatch.setattr(training.PaperTrainer, "compute_loss", recording_compute_loss)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    train.main(["--output_dir", str(tmp_path), "--preset", "tiny", "--vocab_size", "300", "--max_train_samples", "128",
                "--max_eval_samples", "2", "--per_device_train_batch_size", "16", "--max_steps", "4",
                "--eval_strategy", "no", "--report_to", "none", "--noam_warmup_steps", "4", "--save_strategy", "no",
                "--use_cpu", "--bf16", "--logging_steps", "1", "--num_examples", "0"])
    forward_calls = [s for s in seen if s[0] != "loss"]
    losses = [s for s in seen if s[0] == "loss"]
    assert len(losses) == 4
    assert all(dtype == torch.float32 for _, dtype in losses)
    assert forward_calls[:4] == [(True, BF16)] * 4  # the 4 training forwards ran under bf16 autocast
    import json
    results = json.loads((tmp_path / "results.json").read_text())
    assert math.isfinite(results["train"]["train_loss"])


# scripts/device_check.sh (the GPU check) on the CPU ----------------------------------------------------------

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
    training step at the paper's batch (ours and Marian, eager and compiled), beam search, the benchmark's
    comparisons, and a 30-step `scripts/train.py --bf16` run whose loss must fall."""
    import json

    out = tmp_path / "out"
    result = _device_check("--cpu_smoke", "--out", str(out))
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    report = json.loads((out / "device_check.json").read_text())
    assert report["ok"] and report["cpu_smoke"] and report["complete"]
    sections = report["sections"]
    assert list(sections) == ["environment", "matmul_peak", "attention_agreement", "paper_batch_training",
                              "beam_search", "speed_vs_peers", "training_run"]  # the paper batch right after the checks
    agreement = sections["attention_agreement"]["result"]["padded"]
    assert agreement["eager/fp32"] == 0.0 and agreement["sdpa/fp32"] < 1e-4
    assert agreement["sdpa/bf16"] < 0.25 and agreement["eager/bf16"] < 0.25
    paper = sections["paper_batch_training"]["result"]
    assert paper["errors"] == {} and paper["failures"] == [] and paper["compile_backend"] == "aot_eager"
    assert paper["rows"] == 43 and paper["width"] == 8  # ~256 real tokens a side (lengths average 6 of 8)
    assert 0.85 * 256 < paper["source_tokens"] < 1.15 * 256
    assert 43 * 4 <= paper["source_tokens"] <= 43 * 8 and 43 * 4 <= paper["target_tokens"] <= 43 * 8
    tiny = paper["presets"]["tiny"]
    assert list(tiny["systems"]) == ["ours_eager", "ours_compiled", "marian_eager", "marian_compiled"]
    for name, system in tiny["systems"].items():
        assert math.isfinite(system["step_ms"]) and system["step_ms"] > 0, name
        assert system["loss_finite"] and system["tokens_per_s"] > 0 and 0 < system["mfu"], name
        assert system["compile_s"] > 0 and system["peak_memory_gib"] is None, name  # no CUDA: no peak
    for key in ("compiled_speed_vs_marian_compiled", "compiled_speed_vs_eager", "eager_speed_vs_marian_eager"):
        assert tiny[key] > 0, key
    [projection] = tiny["projected_hours"]
    assert projection["steps"] == 100_000
    assert projection["hours"] == pytest.approx(1e5 * tiny["systems"]["ours_compiled"]["step_ms"] / 3.6e6)
    assert sections["beam_search"]["result"]["output_shape"] == [2, 5]  # 4 new tokens after the start token
    peers = sections["speed_vs_peers"]["result"]  # the benchmark's comparisons, on the device
    assert peers["greedy_textbook_equals_ours"] and peers["beam_textbook_equals_ours"]
    assert all(peers[f"{w}_speed_vs_marian"] > 0 for w in ("train", "greedy", "beam"))
    assert [c["new_tokens"] for c in peers["beam_vs_textbook"]] == [2, 4]
    assert peers["greedy_static_cache_equals_dynamic"] and peers["greedy_static_cache_speed_vs_marian"] > 0
    run = sections["training_run"]["result"]
    assert run["loss_falls"] and math.isfinite(run["last_logged_loss"])
    markdown = (out / "device_check.md").read_text()
    assert "## bf16 training step at the paper's batch" in markdown and "All checks passed: **yes**" in markdown
    assert "| system | step ms | tokens/s | TFLOP/s | MFU | peak GiB | compile s |" in markdown
    assert all(f"| {name} | " in markdown for name in tiny["systems"])
    assert "ours compiled vs Marian compiled" in markdown and "100,000 steps" in markdown
    profile = tiny["profile_ours_compiled"]  # one compiled step's top kernels, their shares adding up to at most 1
    assert profile["kernels"] and 0 < sum(k["share"] for k in profile["kernels"]) <= 1 + 1e-9
    assert "Top kernels of one compiled step of ours" in markdown
    assert "## Speed vs MarianMTModel and the textbook decoder" in markdown
    assert "train_step" not in markdown and "Incomplete" not in markdown


def test_device_check_paper_batch_keeps_the_systems_that_compile_and_fails_without_ours_compiled():
    """A compile that fails (as inductor does without a C compiler) is recorded for its system; the eager systems
    are still measured, and the section fails because our compiled step did not run."""
    import time

    import device_check
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
    assert all(system["step_ms"] > 0 and system["mfu"] is None for system in tiny["systems"].values())
    assert tiny["eager_speed_vs_marian_eager"] > 0 and tiny["compiled_speed_vs_eager"] is None
    assert tiny["projected_hours"] == [{"steps": 100_000, "hours": None}]
    assert result["failures"] == ["tiny: ours_compiled did not run"]
    report = {"cpu_smoke": True, "wall_s": 1.0, "ok": False, "complete": False,
              "sections": {"paper_batch_training": {"ok": False, "result": result, "error": "; ".join(result["failures"])}}}
    markdown = device_check.render_markdown(report)
    assert "| ours_eager | " in markdown and "| ours_compiled | " not in markdown
    assert "- error, tiny/ours_compiled: " in markdown and "100,000 steps – h" in markdown
    assert "**Incomplete**" in markdown and "All checks passed: **no**" in markdown
