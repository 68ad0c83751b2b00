"""Pictures as checks: the learning-rate and loss curves of a run, and attention maps (the paper's Figures 3-5)."""

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


def plot_cross_attention(attention: dict, path, layer: int | None = None):
    """The encoder-decoder attention of one translation (`translation.cross_attention`) as a heatmap: target
    tokens down, source tokens across, one panel per layer (or only `layer`). Returns the figure, closed."""
    weights = attention["weights"]
    layers = range(len(weights)) if layer is None else [layer]
    source, target = attention["source_tokens"], attention["target_tokens"]
    width = max(3.0, 0.35 * len(source) + 1.5)
    figure, axes = plt.subplots(1, len(layers), figsize=(width * len(layers), max(3.0, 0.35 * len(target) + 1.5)),
                                squeeze=False)
    for axis, index in zip(axes[0], layers):
        axis.imshow(weights[index].numpy(), cmap="viridis", vmin=0.0, aspect="auto")
        axis.set_xticks(range(len(source)), source, rotation=90, fontsize=8)
        axis.set_yticks(range(len(target)), target, fontsize=8)
        axis.set(title=f"layer {index + 1}", xlabel="source", ylabel="target (predicted token)")
    figure.suptitle(f"encoder-decoder attention, averaged over heads: {attention['translation']!r}", fontsize=9)
    figure.tight_layout()
    figure.savefig(Path(path), dpi=110)
    plt.close(figure)
    return figure


def plot_bleu_over_time(points: list[tuple[float, float]], path, title: str = "validation BLEU",
                        final: tuple[float, float] | None = None) -> Path:
    """Validation BLEU against wall-clock minutes: `points` (minutes, BLEU) of the evaluations during training,
    and `final`, the finished model's (minutes, BLEU), drawn apart (it may be decoded differently)."""
    figure, axis = plt.subplots(figsize=(6.5, 4))
    if points:
        axis.plot(*zip(*points), marker="o", label="during training (greedy)")
    if final is not None:
        axis.plot(*final, marker="*", markersize=14, linestyle="none", label="final model (averaged, beam)")
        axis.annotate(f"{final[1]:.2f}", final, textcoords="offset points", xytext=(6, -12))
    axis.set(title=title, xlabel="minutes since the start", ylabel="sacreBLEU")
    axis.grid(alpha=0.3)
    axis.legend(loc="lower right")
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
