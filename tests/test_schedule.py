import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from vanilla_transformer.training.schedule import NoamLambda, noam_schedule, paper_adam

D_MODEL, WARMUP, MAX_STEPS = 16, 4, 10


def paper_lr(step, d_model=D_MODEL, warmup=WARMUP):
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


class Regression(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x, y):
        return {"loss": torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), y)}


def tiny_dataset():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 4, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
    return [{"x": x[i], "y": y[i]} for i in range(8)]


class RecordLR(TrainerCallback):
    # Before optimizer.step() the param group holds the lr that update `global_step + 1` will use;
    # after it, Trainer has already stepped the scheduler.
    def __init__(self):
        self.lrs = {}

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        self.lrs[state.global_step + 1] = optimizer.param_groups[0]["lr"]


class StopAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def train(out_dir, schedule="noam", resume=None, callbacks=()):
    torch.manual_seed(0)
    model = Regression()
    args = TrainingArguments(
        output_dir=str(out_dir),
        max_steps=MAX_STEPS,
        per_device_train_batch_size=2,
        save_strategy="steps",
        save_steps=5,
        logging_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        remove_unused_columns=False,
        seed=0,
    )
    optimizers = (None, None)
    if schedule == "noam":
        optimizer = paper_adam(model)
        optimizers = (optimizer, noam_schedule(optimizer, D_MODEL, WARMUP))
    recorder = RecordLR()
    trainer = Trainer(
        model=model, args=args, train_dataset=tiny_dataset(), optimizers=optimizers, callbacks=[recorder, *callbacks]
    )
    trainer.train(resume_from_checkpoint=resume)
    return recorder.lrs, model


def test_noam_lambda_matches_paper_formula_by_hand():
    noam = NoamLambda(512, 4000)
    # LambdaLR's step 0 drives update 1. Update 1: 512^-0.5 * 1 * 4000^-1.5
    # = 0.0441941738 * 3.9528471e-6 = 1.746928107e-7.
    assert noam(0) == pytest.approx(1.746928107421711e-07, rel=1e-12)
    assert noam(1) == pytest.approx(2 * 1.746928107421711e-07, rel=1e-12)
    # Update 4000, the peak where both branches meet: (512 * 4000)^-0.5 = 2048000^-0.5 = 6.987712430e-4.
    assert noam(3999) == pytest.approx(6.987712429686843e-04, rel=1e-12)
    # Update 40000: (512 * 40000)^-0.5 = 20480000^-0.5 = 2.209708691e-4 (= peak / sqrt(10)).
    assert noam(39999) == pytest.approx(2.2097086912079613e-04, rel=1e-12)
    assert NoamLambda(512, 4000, factor=2.0)(3999) == pytest.approx(2 * 6.987712429686843e-04, rel=1e-12)


@pytest.mark.parametrize("kwargs", [{"d_model": 0}, {"warmup_steps": -1}, {"factor": 0.0}])
def test_noam_rejects_non_positive_arguments(kwargs):
    name, value = next(iter(kwargs.items()))
    with pytest.raises(ValueError, match=f"{name}.*{value}"):
        NoamLambda(**{"d_model": 512, "warmup_steps": 4000, **kwargs})


def test_noam_schedule_needs_unit_base_lr():
    optimizer = torch.optim.AdamW(Regression().parameters(), lr=1e-3)
    with pytest.raises(ValueError, match="0.001"):
        noam_schedule(optimizer, 512)


def test_paper_adam_hyperparameters():
    group = paper_adam(Regression()).param_groups[0]
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (1.0, (0.9, 0.98), 1e-9, 0.0)


def test_scheduler_state_saves_the_noam_settings():
    scheduler = noam_schedule(paper_adam(Regression()), 512, 4000, factor=2.0)
    assert scheduler.state_dict()["lr_lambdas"] == [
        {"d_model": 512, "warmup_steps": 4000, "factor": 2.0, "base_lr": 1.0, "decay": 1.0}]


@pytest.mark.parametrize("d_model, warmup, factor", [(512, 4000, 1.0), (64, 400, 0.5), (1024, 4000, 2.0)])
def test_paper_trainer_runs_equation_3_at_every_update_of_100000(tmp_path, d_model, warmup, factor):
    """PaperTrainer's Noam scheduler, built from the arguments a run saves (peak rate and warmup), gives the same rate
    as equation (3) written out (update k at lr(k)) at each of 100,000 updates."""
    from conftest import tiny_model

    from vanilla_transformer.training import PaperTrainer, TranslationTrainingArguments, noam_peak_rate

    model = tiny_model()
    model.config.d_model = d_model  # the schedule reads only this
    args = TranslationTrainingArguments(output_dir=str(tmp_path), warmup_steps=warmup, use_cpu=True, report_to="none",
                                        learning_rate=noam_peak_rate(d_model, warmup, factor))
    trainer = PaperTrainer(model=model, args=args)
    trainer.create_optimizer_and_scheduler(num_training_steps=100_000)
    scheduler = trainer.lr_scheduler
    assert set(scheduler.base_lrs) == {args.learning_rate}  # every parameter group (Trainer makes two)
    base_lr, schedule = scheduler.base_lrs[0], scheduler.lr_lambdas[0]
    steps = range(1, 100_001)
    paper = [factor * d_model**-0.5 * min(k**-0.5, k * warmup**-1.5) for k in steps]
    ran = [base_lr * schedule(k - 1) for k in steps]
    assert max(abs(r / p - 1) for r, p in zip(ran, paper)) < 1e-12
    assert scheduler.get_last_lr()[0] == ran[0]
    assert (args.lr_scheduler_type, args.warmup_steps) == ("noam", warmup)


def test_trainer_uses_paper_lr_for_every_update(tmp_path):
    lrs, _ = train(tmp_path)
    # d=16, W=4: 16^-0.5 = 0.25; warmup k * 4^-1.5 = k/8, then k^-0.5.
    assert [lrs[k] for k in (1, 2, 3, 4)] == pytest.approx([0.03125, 0.0625, 0.09375, 0.125], rel=1e-12)
    assert lrs == pytest.approx({k: paper_lr(k) for k in range(1, MAX_STEPS + 1)}, rel=1e-12)


def test_resumed_run_matches_uninterrupted_run(tmp_path):
    full_lrs, full_model = train(tmp_path / "full")
    first_lrs, _ = train(tmp_path / "stopped", callbacks=[StopAt(5)])
    assert sorted(first_lrs) == [1, 2, 3, 4, 5]
    resumed_lrs, resumed_model = train(tmp_path / "stopped", resume=str(tmp_path / "stopped" / "checkpoint-5"))
    assert sorted(resumed_lrs) == list(range(6, MAX_STEPS + 1))
    assert {**first_lrs, **resumed_lrs} == full_lrs
    for (name, full), resumed in zip(full_model.state_dict().items(), resumed_model.state_dict().values()):
        torch.testing.assert_close(resumed, full, rtol=0, atol=1e-7, msg=name)
