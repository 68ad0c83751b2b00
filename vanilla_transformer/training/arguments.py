"""The recipe's command line: scripts/train.py's flags as four dataclasses, and every Seq2SeqTrainingArguments flag
with the paper's defaults (§5.3 Adam, §5.4 label smoothing, §6.1 beam-4 evaluation, the Noam schedule)."""

import sys
from dataclasses import dataclass, field
from enum import Enum

import torch
from transformers import HfArgumentParser, Seq2SeqTrainingArguments
from transformers.trainer_utils import SchedulerType

from ..support_vanilla_transformer import check_int
from .schedule import PAPER_ADAM


@dataclass
class ModelArguments:
    preset: str = field(default="small", metadata={"help": "base | big (Table 3) | small | tiny"})
    config_file: str | None = field(default=None, metadata={"help": "A config.json to build the model from."})
    model_name_or_path: str | None = field(default=None, metadata={"help": "A checkpoint to start from."})
    config_overrides: str | None = field(
        default=None, metadata={"help": "Comma-separated field=value pairs, e.g. 'dropout=0.3,encoder_layers=4'."})
    tokenizer_name_or_path: str | None = field(
        default=None, metadata={"help": "A saved tokenizer; default: the checkpoint's, else train a shared BPE."})
    vocab_size: int = field(default=8000, metadata={"help": "Size of the shared BPE vocabulary to train."})
    lowercase: bool = field(default=False, metadata={
        "help": "Train the shared BPE on lowercased text and lowercase all it encodes (a normalizer in "
                "tokenizer.json): the model reads and writes lowercase, as the Multi30k literature trains. Its cased "
                "sacreBLEU then counts every capital it does not write; the lowercased and Multi30k BLEU do not."})
    split_punctuation: bool = field(default=False, metadata={
        "help": "Train the shared BPE with punctuation split from words (no token such as 'street.'), as BPE learnt "
                "on Moses-tokenized text has it; decoding still restores the text exactly."})
    attn_implementation: str | None = field(default=None, metadata={"help": "sdpa (default) | eager | ..."})
    license: str = field(default="apache-2.0", metadata={"help": "License written into the model card."})


@dataclass
class DataArguments:
    dataset_name: str = field(
        default="builtin",
        metadata={"aliases": ["--dataset"],
                  "help": "'builtin' (the package's English-German task), a dataset on the Hub (e.g. wmt/wmt14) or a "
                          "local folder laid out like one, a save_to_disk folder, or a .tsv/.jsonl file. Not used when "
                          "split files (--train_source_file, ...) are given."})
    dataset_config_name: str | None = field(default=None, metadata={
        "help": "The dataset's configuration (e.g. de-en for wmt/wmt14)."})
    overwrite_cache: bool = field(default=False, metadata={
        "help": "Tokenize the data again instead of reading the ids an earlier run left in datasets' cache (as "
                "run_translation.py's flag: the data itself is read anew only when its files change)."})
    train_source_file: str | None = None
    train_target_file: str | None = None
    validation_source_file: str | None = None
    validation_target_file: str | None = None
    test_source_file: str | None = None
    test_target_file: str | None = None
    source_lang: str = "en"
    target_lang: str = "de"
    max_source_length: int = field(default=128, metadata={"help": "Longer training pairs are dropped (reported)."})
    max_target_length: int = 128
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    preprocessing_num_workers: int | None = field(default=None, metadata={
        "help": "Processes that tokenize (datasets' map num_proc); default: the cores available, at most one per "
                "50,000 pairs (starting a process costs more than a small split)."})
    num_examples: int = field(default=5, metadata={"help": "Test sentences to translate and show at the end."})


@dataclass
class RecipeArguments:
    noam_factor: float = field(default=1.0, metadata={
        "help": "Multiplies the whole Noam curve: its peak, the run's --learning_rate, is noam_factor * d_model^-0.5 * "
                "warmup_steps^-0.5 (give one of the two)."})
    label_smoothing: float = field(default=0.1, metadata={"help": "§5.4 epsilon_ls; kept in the model config."})
    max_tokens_per_batch: int | None = field(default=None, metadata={
        "help": "§5.1 token-based batching: padded source (and target) tokens per device batch, replacing "
                "--per_device_train_batch_size for training (see vanilla_transformer/data/batching.py)."})
    pad_to_multiple_of: int = field(default=1, metadata={
        "help": "Pad every batch's source and target length up to a multiple of this (1: to the longest only). "
                "--max_tokens_per_batch counts this padding, so a multiple above 1 puts fewer real tokens in each "
                "batch; it gives a compiled model (--torch_compile) fewer distinct shapes."})

    tokens_per_step: int | None = field(default=None, metadata={
        "help": "§5.1 batch size in real tokens per optimizer step over all processes (the paper: 25000), the mean "
                "of the source and target sides: sets the per-device budget and --gradient_accumulation_steps from "
                "the data's lengths and the number of processes (logged, and kept in results.json)."})
    max_tokens_per_device: int = field(default=32768, metadata={
        "help": "With --tokens_per_step: the most padded tokens one device batch may hold; beyond it, accumulate."})
    average_last_checkpoints: int | None = field(default=None, metadata={
        "help": "§6.1: the final model is the average of the last N checkpoints (the paper: 5 for base, 20 for "
                "big); the last step's weights stay in its checkpoint folder."})
    paper_bleu: bool = field(default=False, metadata={
        "help": "Also score the paper's tokenized BLEU (Moses tokens, compound splitting; metrics.paper_bleu)."})
    multi30k_bleu: bool = field(default=False, metadata={
        "help": "Also score the Multi30k literature's BLEU: lowercased, punctuation-normalised, Moses-tokenized text as "
                "the dataset's task1-tokenize.sh makes its official files (metrics.multi30k_bleu)."})
    max_train_minutes: float | None = field(default=None, metadata={
        "help": "Stop training cleanly once this many minutes have passed since it began (the step in progress "
                "finishes and is saved as a checkpoint; averaging and evaluation follow), or at --max_steps, "
                "whichever comes first."})
    token_dropout: float = field(default=0.0, metadata={
        "help": "Training only: each source token and each target token the decoder reads (not the labels) is "
                "replaced by the unknown token with this probability (word dropout on subwords, Sennrich & Zhang "
                "2019)."})
    length_penalty: float | None = field(default=None, metadata={
        "help": "The alpha of the length penalty (GNMT's for this package's models) in the trained model's "
                "generation_config.json, which the final beam-search evaluation and every later generate() use "
                "(default: the paper's 0.6 for a new model; the checkpoint's own for --model_name_or_path and "
                "--resume_from_checkpoint)."})
    num_beams: int | None = field(default=None, metadata={
        "help": "The beam size in the trained model's generation_config.json (default: the paper's 4 for a new model; "
                "the checkpoint's own otherwise)."})
    length_penalty_type: str | None = field(default=None, metadata={
        "help": "gnmt (the paper's, ((5 + |Y|) / 6)^alpha) or hf (transformers' and fairseq's, |Y|^alpha) in the trained "
                "model's generation_config.json (default: gnmt for a new model; the checkpoint's own otherwise)."})
    early_stopping_patience: int | None = field(default=None, metadata={
        "help": "Stop training once --metric_for_best_model has not improved for this many evaluations in a row "
                "(transformers' EarlyStoppingCallback). fairseq's --patience is this with --eval_strategy epoch "
                "--prediction_loss_only --metric_for_best_model loss: the validation loss after every epoch. 0 turns "
                "it off, e.g. to train a recipe that sets one to its budget."})
    lr_decay_minutes: float | None = field(default=None, metadata={
        "help": "With --max_train_minutes and the Noam schedule: over the budget's last this many minutes the "
                "learning rate falls linearly to zero (the Noam rate times a ramp from 1 to 0, read from the "
                "clock), so training ends annealed wherever the machine's speed has taken it."})

    def __post_init__(self):
        counts = {name: 1 for name in ("pad_to_multiple_of", "tokens_per_step", "max_tokens_per_device",
                                       "average_last_checkpoints", "max_tokens_per_batch", "num_beams")}
        counts["early_stopping_patience"] = 0  # 0: off
        for name, at_least in counts.items():
            if getattr(self, name) is not None:
                check_int(f"--{name}", getattr(self, name), at_least)
        if not self.noam_factor > 0:
            raise ValueError(f"--noam_factor must be > 0, got {self.noam_factor!r}.")
        if not 0 <= self.token_dropout < 1:
            raise ValueError(f"--token_dropout must be a probability in [0, 1), got {self.token_dropout!r}.")
        if self.length_penalty is not None and not abs(self.length_penalty) < float("inf"):
            raise ValueError(f"--length_penalty must be a finite number (the length penalty's alpha), "
                             f"got {self.length_penalty!r}.")
        if self.length_penalty_type not in (None, "gnmt", "hf"):
            raise ValueError(f"--length_penalty_type must be gnmt or hf, got {self.length_penalty_type!r}.")
        if self.max_train_minutes is not None and not 0 < self.max_train_minutes < float("inf"):
            raise ValueError(f"--max_train_minutes must be a positive number of minutes, got {self.max_train_minutes!r}.")
        if self.lr_decay_minutes is not None:
            if self.max_train_minutes is None:
                raise ValueError(f"--lr_decay_minutes {self.lr_decay_minutes} ends the decay at the time budget: "
                                 "give --max_train_minutes too.")
            if not 0 < self.lr_decay_minutes <= self.max_train_minutes:
                raise ValueError(f"--lr_decay_minutes must be a number of minutes above 0 and at most "
                                 f"--max_train_minutes {self.max_train_minutes}, got {self.lr_decay_minutes!r}.")
        if self.tokens_per_step is not None and self.max_tokens_per_batch is not None:
            raise ValueError(f"Give --tokens_per_step (the batch per optimizer step, planned) or --max_tokens_per_batch "
                             f"(the budget per device batch), not both (got --tokens_per_step {self.tokens_per_step} "
                             f"and --max_tokens_per_batch {self.max_tokens_per_batch}).")


class PaperSchedulerType(str, Enum):
    """Schedules transformers does not name, each run by PaperTrainer: the saved arguments keep the name that ran."""

    NOAM = "noam"


NOAM = PaperSchedulerType.NOAM


@dataclass
class TranslationTrainingArguments(Seq2SeqTrainingArguments):
    """Seq2SeqTrainingArguments with the paper's defaults: Adam(0.9, 0.98, 1e-9), beam 4 evaluation."""

    lr_scheduler_type: str = field(default="noam", metadata={
        "help": "noam (§5.3 equation (3), run by PaperTrainer: a linear warmup over --warmup_steps to --learning_rate, "
                "then 1 / sqrt(step), counted from update 1 as the paper does) or any transformers scheduler (linear, "
                "cosine, inverse_sqrt, ...)."})
    learning_rate: float | None = field(default=None, metadata={
        "help": "The schedule's peak rate. With noam, default: equation (3)'s peak for the model, --noam_factor * "
                "d_model^-0.5 * warmup_steps^-0.5, filled in once the model is known; other schedules need it."})
    warmup_steps: float | None = field(default=None, metadata={
        "aliases": ["--noam_warmup_steps"],
        "help": "Updates of linear warmup (a float below 1: a share of all updates). Default: the paper's 4000 with "
                "noam, 0 otherwise."})
    adam_beta1: float = PAPER_ADAM["betas"][0]
    adam_beta2: float = PAPER_ADAM["betas"][1]
    adam_epsilon: float = PAPER_ADAM["eps"]
    predict_with_generate: bool = True
    generation_num_beams: int | None = 4
    report_to: None | str | list[str] = "tensorboard"
    logging_steps: float = 50
    save_total_limit: int | None = 5  # §6.1 averages the last 5 checkpoints (base)
    # Trainer's filter tests every micro-batch's loss for NaN in Python, which waits for the device each step.
    logging_nan_inf_filter: bool = False
    overwrite_output_dir: bool = field(default=False, metadata={
        "help": "Train from scratch into a non-empty --output_dir, replacing the run saved there."})

    def __post_init__(self):
        noam = self.lr_scheduler_type == "noam"
        if self.warmup_steps is None:
            self.warmup_steps = 4000 if noam else 0
        if noam:
            if not (self.warmup_steps >= 1 and float(self.warmup_steps).is_integer()):
                raise ValueError(f"--warmup_steps must be a whole number of updates, at least 1, with "
                                 f"--lr_scheduler_type noam (equation (3) divides by it), got {self.warmup_steps!r}.")
            self.warmup_steps = int(self.warmup_steps)
            # transformers checks the name against its own schedulers; PaperTrainer runs this one (create_scheduler).
            self.lr_scheduler_type = SchedulerType.INVERSE_SQRT
        elif self.learning_rate is None:
            raise ValueError(f"--lr_scheduler_type {self.lr_scheduler_type} takes its peak rate from --learning_rate: "
                             "give one (e.g. 5e-4), or use --lr_scheduler_type noam.")
        super().__post_init__()
        if noam:
            self.lr_scheduler_type = NOAM
        accelerator = getattr(torch, "accelerator", None)
        has_accelerator = accelerator.is_available() if accelerator is not None else torch.cuda.is_available()
        if self.fp16 and (self.use_cpu or not has_accelerator):
            # accelerate accepts it on a CPU and then trains in float32: say so instead of pretending.
            raise ValueError("--fp16 has no effect on a CPU (accelerate trains in float32 there); use --bf16 for "
                             "mixed precision on a CPU, or drop the flag.")


# What parse_training_args returns: the arguments of one run, in the order `run()` takes them.
RunArguments = tuple[ModelArguments, DataArguments, RecipeArguments, TranslationTrainingArguments]


def parse_training_args(argv: list[str] | None = None) -> RunArguments:
    """scripts/train.py's command line (every Seq2SeqTrainingArguments flag too) as its four dataclasses;
    `argv` None reads sys.argv, and a single `.json` argument reads the flags from that file."""
    parser = HfArgumentParser((ModelArguments, DataArguments, RecipeArguments, TranslationTrainingArguments))
    arguments = sys.argv[1:] if argv is None else list(argv)
    if len(arguments) == 1 and arguments[0].endswith(".json"):
        return parser.parse_json_file(arguments[0])
    return parser.parse_args_into_dataclasses(arguments)


__all__ = ["PaperSchedulerType", "NOAM", "ModelArguments", "DataArguments", "RecipeArguments", "TranslationTrainingArguments", "RunArguments",
           "parse_training_args"]
