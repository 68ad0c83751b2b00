"""Pictures as checks: the learning-rate and loss curves of a run."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: training machines have no display
import matplotlib.pyplot as plt  # noqa: E402


def plot_training_curves(log_history: list[dict], path, title: str = "training") -> Path:
    """Learning rate (left) and training/evaluation loss (right) against the optimizer step."""
    train = [(e["step"], e["loss"], e.get("learning_rate")) for e in log_history if "loss" in e and "step" in e]
    evals = [(e["step"], e["eval_loss"]) for e in log_history if "eval_loss" in e]
    figure, (lr_axis, loss_axis) = plt.subplots(1, 2, figsize=(11, 4))
    lr_points = [(step, lr) for step, _, lr in train if lr is not None]
    if lr_points:
        lr_axis.plot(*zip(*lr_points), color="tab:orange")
    lr_axis.set(title="learning rate (§5.3)", xlabel="step", ylabel="lr")
    lr_axis.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    if train:
        loss_axis.plot([s for s, _, _ in train], [loss for _, loss, _ in train], label="train (label-smoothed)")
    if evals:
        loss_axis.plot(*zip(*evals), marker="o", label="validation")
    loss_axis.set(title="loss", xlabel="step", ylabel="cross-entropy")
    if train or evals:
        loss_axis.legend()
    figure.suptitle(title)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
