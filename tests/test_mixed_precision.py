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
    assert out.loss.dtype == torch.float32  # the loss casts the logits to float32 (block by block)
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
