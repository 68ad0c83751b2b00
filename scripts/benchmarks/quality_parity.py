"""Quality parity: our Transformer against `transformers.MarianMTModel` of the same shape, trained the same way.

Marian is the paper's architecture in transformers, so on one task, tokenizer, batch stream and objective the two
should translate equally well: Multi30k en->de with the shared BPE, identical §5.1 token batches, `PaperTrainer`
with the Noam schedule, §5.4's label-smoothed loss and one beam search for BLEU. Only the implementation and the
initial weights differ. By default the two train at once, one process and one thread each, under the same load.

    python -m scripts.benchmarks.quality_parity                       # writes scripts/benchmarks/results/parity_*
    python -m scripts.benchmarks.quality_parity --preset tiny --max_steps 50 --save_steps 10 --output_dir /tmp/p

Skips (exit status 0, with the reason) where ../shared/data/multi30k is absent.
"""

from __future__ import annotations

import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from multiprocessing import get_context
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is built locally

import torch  # noqa: E402
from datasets import DatasetDict, load_from_disk  # noqa: E402
from transformers import (AutoTokenizer, DataCollatorForSeq2Seq, GenerationConfig, HfArgumentParser,  # noqa: E402
                          MarianMTModel, set_seed)

from scripts.recipes.multi30k_en_de import RECIPE  # noqa: E402
from vanilla_transformer.configuration_vanilla_transformer import VanillaTransformerConfig  # noqa: E402
from vanilla_transformer.data.corpora import tokenize_parallel  # noqa: E402
from vanilla_transformer.data.tokenization import train_shared_tokenizer  # noqa: E402
from vanilla_transformer.modeling_vanilla_transformer import (  # noqa: E402
    VanillaTransformerForConditionalGeneration, label_smoothed_cross_entropy)
from vanilla_transformer.tools.marian import marian_config_like  # noqa: E402
from vanilla_transformer.tools.translation import translate  # noqa: E402
from vanilla_transformer.training import (PaperTrainer, TranslationTrainingArguments,  # noqa: E402
                                          average_checkpoints, last_checkpoints)
from vanilla_transformer.training.metrics import corpus_scores  # noqa: E402
from vanilla_transformer.training.precision import native_bf16  # noqa: E402
from vanilla_transformer.training.run import parse_config_overrides  # noqa: E402
from vanilla_transformer.training.schedule import noam_peak_rate  # noqa: E402

from scripts.utils.reports import parity_report, write_report  # noqa: E402

from .toolkit import command_line, environment, load_average, load_multi30k, multi30k_missing  # noqa: E402

MODELS = ("ours", "marian")
PRECISIONS = ("auto", "bf16", "fp32")


@dataclass
class ParitySettings:
    data_dir: str = field(default="../shared/data/multi30k", metadata={"help": "Multi30k train/val .en/.de files."})
    output_dir: str = field(default="scripts/benchmarks/results", metadata={"help": "Where the reports go."})
    work_dir: str | None = field(default=None, metadata={
        "help": "Tokenizer, tokenized data, translations; default: a new temporary folder (outside the repository)."})
    # The defaults are the Multi30k recipe's (scripts/recipes/multi30k_en_de.py RECIPE).
    preset: str = field(default=RECIPE["preset"], metadata={"help": "Model preset, used for both models."})
    config_overrides: str = field(default=RECIPE["config_overrides"], metadata={
        "help": "field=value pairs on the preset (the recipe's dropouts), for both models."})
    # The recipe's length is a wall-clock budget; both models here train the steps it reaches in its hour.
    max_steps: int = field(default=6900, metadata={"help": "Steps for both models (the recipe's hour, roughly)."})
    max_tokens_per_batch: int = field(default=RECIPE["max_tokens_per_batch"],
                                      metadata={"help": "§5.1 token budget per batch (both)."})
    noam_warmup_steps: int = RECIPE["noam_warmup_steps"]
    noam_factor: float = RECIPE["noam_factor"]
    label_smoothing: float = 0.1
    vocab_size: int = RECIPE["vocab_size"]
    seed: int = 0
    logging_steps: int = 25
    eval_steps: int = field(default=RECIPE["eval_steps"],
                            metadata={"help": "Validation loss every this many steps."})
    save_steps: int = RECIPE["save_steps"]
    average_last_checkpoints: int = field(default=RECIPE["average_last_checkpoints"], metadata={
        "help": "§6.1: score the average of the last N checkpoints, one every save_steps (0: the last weights)."})
    precision: str = field(default="auto", metadata={
        "help": "auto: bf16 autocast where the machine multiplies bf16 natively, else float32 | bf16 | fp32"})
    num_beams: int = 4
    length_penalty: float = 0.6
    max_new_tokens: int = 128
    report_name: str = field(default="parity_multi30k", metadata={"help": "Names the .json/.md/.png reports."})
    parallel: bool = field(default=True, metadata={"help": "Train both models at once, one process each."})
    threads_per_model: int = 1


def label_smoothed_loss_func(epsilon: float):
    """Trainer `compute_loss_func` for Marian: our model's own loss, `label_smoothed_cross_entropy`."""

    def loss_func(outputs, labels, num_items_in_batch=None):
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        return label_smoothed_cross_entropy(logits, labels, epsilon, num_items_in_batch)

    return loss_func


def trainer_for(kind: str, settings: ParitySettings, work: Path) -> PaperTrainer:
    """`PaperTrainer` for one of the two models, on the prepared data in `work`, both seeded alike."""
    tokenizer = AutoTokenizer.from_pretrained(work / "tokenizer")
    data = load_from_disk(str(work / "tokenized"))
    config = VanillaTransformerConfig.from_json_file(work / "config.json")
    set_seed(settings.seed)
    model = (VanillaTransformerForConditionalGeneration(config) if kind == "ours"
             else MarianMTModel(marian_config_like(config)))
    averaged = settings.average_last_checkpoints > 0
    args = TranslationTrainingArguments(
        output_dir=str(work / kind), max_steps=settings.max_steps, seed=settings.seed,
        learning_rate=noam_peak_rate(config.d_model, settings.noam_warmup_steps, settings.noam_factor),
        warmup_steps=settings.noam_warmup_steps,
        eval_strategy="steps", eval_steps=settings.eval_steps, logging_steps=settings.logging_steps,
        per_device_eval_batch_size=64, predict_with_generate=False, report_to="none",
        save_strategy="steps" if averaged else "no", save_steps=settings.save_steps,
        save_total_limit=settings.average_last_checkpoints if averaged else None, use_cpu=True,
        bf16=native_bf16() if settings.precision == "auto" else settings.precision == "bf16", disable_tqdm=True,
        dataloader_num_workers=0)
    return PaperTrainer(
        model=model, args=args, train_dataset=data["train"], eval_dataset=data["validation"],
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        compute_loss_func=None if kind == "ours" else label_smoothed_loss_func(settings.label_smoothing),
        max_tokens_per_batch=settings.max_tokens_per_batch)


def train_and_score(kind: str, settings: ParitySettings) -> dict:
    """Train one of the two models on the prepared data in `settings.work_dir`; return its losses and BLEU."""
    torch.set_num_threads(settings.threads_per_model)
    work = Path(settings.work_dir)
    validation = load_from_disk(str(work / "raw_validation"))["translation"]
    sources, references = [pair["en"] for pair in validation], [pair["de"] for pair in validation]
    tokenizer = AutoTokenizer.from_pretrained(work / "tokenizer")
    config = VanillaTransformerConfig.from_json_file(work / "config.json")
    # One beam search for both; our model reads no `length_penalty_type` here, so it ranks by |Y|^alpha too.
    generation_config = GenerationConfig(
        decoder_start_token_id=config.decoder_start_token_id, bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, num_beams=settings.num_beams,
        length_penalty=settings.length_penalty, max_new_tokens=settings.max_new_tokens)
    trainer = trainer_for(kind, settings, work)
    model = trainer.model
    # Counted before training: a reloaded Marian marks its sinusoidal position tables trainable.
    parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    start = time.perf_counter()
    train_result = trainer.train()
    train_seconds = time.perf_counter() - start
    if settings.average_last_checkpoints > 0:
        folder = average_checkpoints(last_checkpoints(work / kind, settings.average_last_checkpoints),
                                     work / f"{kind}_averaged")
        model = type(model).from_pretrained(folder).eval()
    start = time.perf_counter()
    model.generation_config = generation_config
    hypotheses = translate(model, tokenizer, sources, batch_size=64)
    decode_seconds = time.perf_counter() - start
    scores = corpus_scores(hypotheses, references)
    (work / f"{kind}_validation_translations.txt").write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
    return {"model": type(model).__name__, "parameters": parameters, "bleu": scores["bleu"], "chrf": scores["chrf"],
            "bleu_signature": scores["bleu_signature"], "train_loss": train_result.training_loss,
            "steps": trainer.state.global_step, "epochs": trainer.state.epoch, "bf16": trainer.args.bf16,
            "train_seconds": train_seconds, "decode_seconds": decode_seconds,
            "log_history": trainer.state.log_history}


def prepare(settings: ParitySettings) -> dict:
    """Tokenizer, tokenized splits and the model config, written to `work_dir` for the training processes."""
    raw = load_multi30k(settings.data_dir)
    # The shared BPE of scripts/train.py, trained on both sides of the training split.
    tokenizer = train_shared_tokenizer([pair[lang] for pair in raw["train"]["translation"] for lang in pair],
                                       vocab_size=settings.vocab_size, model_max_length=128, show_progress=False)
    tokenized = DatasetDict({split: tokenize_parallel(raw[split], tokenizer, "en", "de", 128, 128)[0]
                             for split in raw})
    config = VanillaTransformerConfig.from_preset(
        settings.preset, **parse_config_overrides(settings.config_overrides), vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.bos_token_id, label_smoothing=settings.label_smoothing)
    work = Path(settings.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(work / "tokenizer")
    tokenized.save_to_disk(str(work / "tokenized"))
    raw["validation"].save_to_disk(str(work / "raw_validation"))
    config.to_json_file(work / "config.json")
    return {"vocab_size": len(tokenizer), "train_examples": len(tokenized["train"]),
            "validation_examples": len(tokenized["validation"])}


def check_settings(settings: ParitySettings):
    """Refuse, before any data is prepared, what would fail or silently differ after the trainings."""
    parse_config_overrides(settings.config_overrides)
    if settings.precision not in PRECISIONS:
        raise ValueError(f"--precision must be one of {PRECISIONS}, got {settings.precision!r}.")
    if settings.average_last_checkpoints < 0:
        raise ValueError(f"--average_last_checkpoints must be 0 (no averaging) or more, got "
                         f"{settings.average_last_checkpoints}.")
    saved = settings.max_steps // settings.save_steps if settings.save_steps > 0 else 0
    if settings.average_last_checkpoints > saved:
        raise ValueError(f"--average_last_checkpoints {settings.average_last_checkpoints} needs that many "
                         f"checkpoints, but --max_steps {settings.max_steps} with --save_steps {settings.save_steps} "
                         f"writes {saved}.")


def run_parity(settings: ParitySettings) -> dict:
    check_settings(settings)
    start, machine = time.perf_counter(), environment(measures=("vanilla_transformer",))
    if settings.work_dir is None:
        settings = replace(settings, work_dir=tempfile.mkdtemp(prefix="vanilla_transformer_parity_"))
    prepared = prepare(settings)
    if settings.parallel:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        with ProcessPoolExecutor(max_workers=2, mp_context=get_context("spawn")) as pool:
            futures = {kind: pool.submit(train_and_score, kind, settings) for kind in MODELS}
            runs = {kind: future.result() for kind, future in futures.items()}
    else:
        runs = {kind: train_and_score(kind, settings) for kind in MODELS}
    return {"settings": asdict(settings), **prepared, "runs": runs,
            "bleu_gap": runs["ours"]["bleu"] - runs["marian"]["bleu"], "wall_seconds": time.perf_counter() - start,
            "environment": {**machine, "load_average_at_end": load_average()}}


def plot_parity(results: dict, path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for kind, color in zip(MODELS, ("tab:blue", "tab:red")):
        run = results["runs"][kind]
        label = f"{kind}: val BLEU {run['bleu']:.2f}"
        train = [(e["step"], e["loss"]) for e in run["log_history"] if "loss" in e]
        evals = [(e["step"], e["eval_loss"]) for e in run["log_history"] if "eval_loss" in e]
        axes[0].plot(*zip(*train), color=color, label=label)
        axes[1].plot(*zip(*evals), marker="o", color=color, label=label)
    axes[0].set(title="training loss (label-smoothed)", xlabel="step", ylabel="loss")
    axes[1].set(title="validation loss (label-smoothed)", xlabel="step", ylabel="loss")
    for axis in axes:
        axis.legend(fontsize="small")
    figure.suptitle("Multi30k en-de: ours vs MarianMTModel, same shape, data, batches and recipe")
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def main(argv=None):
    (settings,) = HfArgumentParser(ParitySettings).parse_args_into_dataclasses(argv)
    reason = multi30k_missing(settings.data_dir)
    if reason:
        print(f"skipped: {reason}")
        return None
    results = run_parity(settings)
    command = command_line("quality_parity", argv)
    stem = Path(settings.output_dir) / settings.report_name
    stem.parent.mkdir(parents=True, exist_ok=True)
    png = plot_parity(results, stem.with_suffix(".png"))
    paths = write_report(stem, {"command": command, **results}, parity_report(results, command, png.name))
    runs = results["runs"]
    print(f"BLEU ours {runs['ours']['bleu']:.2f}, Marian {runs['marian']['bleu']:.2f}, gap "
          f"{results['bleu_gap']:+.2f}; wall {results['wall_seconds'] / 60:.1f} min; report: {paths['md']}")
    return results


if __name__ == "__main__":
    main()
