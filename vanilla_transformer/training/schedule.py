"""The paper's optimiser and learning-rate schedule (§5.3): `NoamLambda`, which `PaperTrainer` runs for
`--lr_scheduler_type noam` (the default of scripts/train.py), `paper_adam` and `noam_schedule` for a training loop of
one's own or `Seq2SeqTrainer(optimizers=...)`."""

import torch
from torch.optim.lr_scheduler import LambdaLR

PAPER_ADAM = {"betas": (0.9, 0.98), "eps": 1e-9}  # §5.3


def _check_positive(**values):
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")


def noam_peak_rate(d_model, warmup_steps=4000, factor=1.0) -> float:
    """The highest rate of equation (3), reached at update `warmup_steps`: factor * d_model^-0.5 * warmup^-0.5. Trainer
    calls a schedule's peak its learning rate, so a Noam run's `learning_rate` is this."""
    _check_positive(d_model=d_model, warmup_steps=warmup_steps, factor=factor)
    return factor * d_model**-0.5 * warmup_steps**-0.5


class NoamLambda:
    """lr(s) = factor * d_model^-0.5 * min(s^-0.5, s * warmup^-1.5), §5.3 equation (3), divided by `base_lr`: LambdaLR
    multiplies the lambda by the optimizer's rate, 1.0 for `noam_schedule` (the lambda is the rate), the peak rate
    for Trainer (whose `learning_rate` is a schedule's peak).

    A callable object rather than a closure: `LambdaLR.state_dict()` stores an object's `__dict__`
    (and None for functions), so Trainer checkpoints carry the schedule's settings. On resume
    `load_state_dict` overwrites these attributes with the checkpointed ones.

    `decay` (1.0) multiplies the rate: a time budget lowers it to anneal the run to zero at its end
    (`TrainingTimeBudget`, --lr_decay_minutes).
    """

    def __init__(self, d_model, warmup_steps=4000, factor=1.0, base_lr=1.0):
        _check_positive(d_model=d_model, warmup_steps=warmup_steps, factor=factor, base_lr=base_lr)
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.factor = factor
        self.base_lr = base_lr
        self.decay = 1.0

    def __call__(self, step):
        # LambdaLR asks for step 0 at construction and that value drives update #1, so shift by one:
        # update k (1-based) runs at the paper's lr(k), never at lr(0) = 0.
        s = step + 1
        rate = self.factor * self.d_model**-0.5 * min(s**-0.5, s * self.warmup_steps**-1.5)
        return self.decay * rate / self.base_lr


def noam_schedule(optimizer, d_model, warmup_steps=4000, factor=1.0):
    for group in optimizer.param_groups:
        # LambdaLR multiplies the lambda by this base lr; NoamLambda already returns the absolute rate.
        base_lr = group.get("initial_lr", group["lr"])
        if base_lr != 1.0:
            raise ValueError(f"noam_schedule needs optimizer lr 1.0 (NoamLambda gives the absolute lr), got {base_lr!r}")
    return LambdaLR(optimizer, NoamLambda(d_model, warmup_steps, factor))


def paper_adam(model_or_params, betas=PAPER_ADAM["betas"], eps=PAPER_ADAM["eps"], weight_decay=0.0, lr=1.0,
               **torch_options):
    """Adam with §5.3's β1=0.9, β2=0.98, ε=1e-9 (AdamW with weight_decay=0 is Adam); lr=1.0 for `noam_schedule`.
    `torch_options` go to torch.optim.AdamW (e.g. fused=True)."""
    params = model_or_params.parameters() if isinstance(model_or_params, torch.nn.Module) else model_or_params
    return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **torch_options)

