"""The paper's training recipe on the stock `Seq2SeqTrainer`: §5.3 Adam + Noam schedule, §5.4 label smoothing.

`scripts/train.py` is argument parsing around `run()`; the demo calls `run()` too. Every
`Seq2SeqTrainingArguments` flag works, and the same code runs under `torchrun` / `accelerate launch`.
"""

import json
import logging
import math
import os
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from datasets import DatasetDict
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    GenerationConfig,
    HfArgumentParser,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    enable_full_determinism,
    set_seed,
)

from .batching import TranslationDataCollator, example_lengths, plan_token_batches, token_batch_train_dataloader
from .builtin_task import build_builtin_task
from .checkpoints import INDEX_FILE, average_checkpoints, check_output_dir, check_weights, last_checkpoints, weight_files
from .configuration_vanilla_transformer import VanillaTransformerConfig, paper_generation_config
from .data import load_parallel_data, load_parallel_text_files, tokenize_parallel
from .hub import add_translation_pipeline, check_hub_folder
from . import metrics
from .metrics import build_compute_metrics, corpus_scores
from .model_card import render_model_card
from .modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from .schedule import NoamLambda
from .tokenization import train_shared_tokenizer
from .translation import translate

logger = logging.getLogger(__name__)
SPLITS = ("train", "validation", "test")


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
    attn_implementation: str | None = field(default=None, metadata={"help": "sdpa (default) | eager | ..."})
    license: str = field(default="apache-2.0", metadata={"help": "License written into the model card."})


@dataclass
class DataArguments:
    dataset: str = field(
        default="builtin",
        metadata={"help": "'builtin' (the package's English-German task), a datasets name or folder, or a "
                          ".tsv/.jsonl file. Not used when split files (--train_source_file, ...) are given."})
    dataset_config_name: str | None = None
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
    preprocessing_num_workers: int | None = None
    num_examples: int = field(default=5, metadata={"help": "Test sentences to translate and show at the end."})


@dataclass
class RecipeArguments:
    lr_scheduler: str = field(
        default="noam", metadata={"help": "noam (§5.3) | trainer (use --lr_scheduler_type and --learning_rate)"})
    noam_warmup_steps: int = field(default=4000, metadata={"help": "§5.3 warmup_steps."})
    noam_factor: float = field(default=1.0, metadata={"help": "Multiplies the whole Noam curve."})
    label_smoothing: float = field(default=0.1, metadata={"help": "§5.4 epsilon_ls; kept in the model config."})
    max_tokens_per_batch: int | None = field(default=None, metadata={
        "help": "§5.1 token-based batching: padded source (and target) tokens per device batch, replacing "
                "--per_device_train_batch_size for training (see vanilla_transformer/batching.py)."})
    pad_to_multiple_of: int = field(default=8, metadata={
        "help": "Pad every batch's source and target length up to a multiple of this (1: to the longest only), so "
                "a compiled model (--torch_compile) sees a handful of shapes and tensor cores get aligned sizes. "
                "--max_tokens_per_batch counts this padding."})

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

    def __post_init__(self):
        if self.lr_scheduler not in ("noam", "trainer"):
            raise ValueError(f"--lr_scheduler must be 'noam' or 'trainer', got {self.lr_scheduler!r}.")
        for name in ("pad_to_multiple_of", "tokens_per_step", "max_tokens_per_device", "average_last_checkpoints",
                     "max_tokens_per_batch", "noam_warmup_steps"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"--{name} must be a positive int, got {value!r}.")
        if not self.noam_factor > 0:
            raise ValueError(f"--noam_factor must be > 0, got {self.noam_factor!r}.")
        if self.tokens_per_step is not None and self.max_tokens_per_batch is not None:
            raise ValueError(f"Give --tokens_per_step (the batch per optimizer step, planned) or --max_tokens_per_batch "
                             f"(the budget per device batch), not both (got --tokens_per_step {self.tokens_per_step} "
                             f"and --max_tokens_per_batch {self.max_tokens_per_batch}).")


@dataclass
class TranslationTrainingArguments(Seq2SeqTrainingArguments):
    """Seq2SeqTrainingArguments with the paper's defaults: Adam(0.9, 0.98, 1e-9), beam 4 evaluation."""

    learning_rate: float = field(default=1.0, metadata={"help": "1.0 with the Noam schedule (it sets the rate)."})
    adam_beta2: float = 0.98
    adam_epsilon: float = 1e-9
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
        super().__post_init__()
        accelerator = getattr(torch, "accelerator", None)
        has_accelerator = accelerator.is_available() if accelerator is not None else torch.cuda.is_available()
        if self.fp16 and (self.use_cpu or not has_accelerator):
            # accelerate accepts it on a CPU and then trains in float32: say so instead of pretending.
            raise ValueError("--fp16 has no effect on a CPU (accelerate trains in float32 there); use --bf16 for "
                             "mixed precision on a CPU, or drop the flag.")


TrainingArguments = tuple[ModelArguments, DataArguments, RecipeArguments, TranslationTrainingArguments]


def parse_training_args(argv: list[str] | None = None) -> TrainingArguments:
    """scripts/train.py's command line (every Seq2SeqTrainingArguments flag too) as its four dataclasses;
    `argv` None reads sys.argv, and a single `.json` argument reads the flags from that file."""
    parser = HfArgumentParser((ModelArguments, DataArguments, RecipeArguments, TranslationTrainingArguments))
    arguments = sys.argv[1:] if argv is None else list(argv)
    if len(arguments) == 1 and arguments[0].endswith(".json"):
        return parser.parse_json_file(arguments[0])
    return parser.parse_args_into_dataclasses(arguments)


def check_run_can_start(recipe: RecipeArguments, args: TranslationTrainingArguments):
    """Every refusal that needs no data: before a recipe writes anything (a vocabulary, data files) or trains."""
    check_recipe_fits_the_run(recipe, args)
    check_output_dir_is_free(args)


class PaperTrainer(Seq2SeqTrainer):
    """Seq2SeqTrainer whose scheduler is the paper's (§5.3) when `noam_schedule` is given.

    Overriding `create_scheduler` rather than passing `optimizers=(...)` lets Trainer build the optimizer
    itself after wrapping the model, which FSDP and DeepSpeed require.
    """

    def __init__(self, *args, noam_schedule: NoamLambda | None = None, max_tokens_per_batch: int | None = None,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.noam_schedule = noam_schedule
        self.max_tokens_per_batch = max_tokens_per_batch
        if noam_schedule is not None and self.args.learning_rate != 1.0:
            raise ValueError(
                f"With the Noam schedule the learning rate comes from the schedule, so --learning_rate must be "
                f"1.0 (got {self.args.learning_rate}); scale the curve with --noam_factor instead."
            )

    def get_train_dataloader(self):
        if self.max_tokens_per_batch is None:
            return super().get_train_dataloader()
        return token_batch_train_dataloader(self, self.max_tokens_per_batch)

    def create_scheduler(self, num_training_steps, optimizer=None):
        if self.noam_schedule is None or self.lr_scheduler is not None:
            return super().create_scheduler(num_training_steps, optimizer)
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer, self.noam_schedule)
        self._created_lr_scheduler = True
        return self.lr_scheduler


def load_raw_splits(data: DataArguments) -> DatasetDict:
    files_given = any(getattr(data, f"{s}_{side}_file") for s in SPLITS for side in ("source", "target"))
    if files_given:  # split files replace --dataset entirely, so splits never mix two corpora
        splits = DatasetDict()
    elif data.dataset == "builtin":
        if {data.source_lang, data.target_lang} != {"en", "de"}:
            raise ValueError(f"The built-in task is English-German; got --source_lang {data.source_lang} "
                             f"--target_lang {data.target_lang}.")
        splits = build_builtin_task()
    else:
        loaded = load_parallel_data(data.dataset, data.source_lang, data.target_lang, data.dataset_config_name)
        splits = DatasetDict(dict(loaded) if isinstance(loaded, DatasetDict) else {"train": loaded})
    for split in SPLITS:
        source, target = getattr(data, f"{split}_source_file"), getattr(data, f"{split}_target_file")
        if (source is None) != (target is None):
            given, missing = ("source", "target") if target is None else ("target", "source")
            raise ValueError(f"--{split}_{given}_file {source or target} was given without --{split}_{missing}_file: "
                             "give both.")
        if source is not None:
            splits[split] = load_parallel_text_files(source, target, data.source_lang, data.target_lang)
    if "validation" not in splits and "valid" in splits:
        splits["validation"] = splits.pop("valid")
    if "train" not in splits:
        raise ValueError(f"--dataset {data.dataset!r} has no 'train' split (splits: {sorted(splits)}); give one "
                         "that has, or --train_source_file and --train_target_file.")
    for split, limit in (("train", data.max_train_samples), ("validation", data.max_eval_samples),
                         ("test", data.max_eval_samples)):
        if limit is not None and split in splits:
            splits[split] = splits[split].select(range(min(limit, len(splits[split]))))
    return splits


def build_tokenizer(model_args: ModelArguments, train_split, data: DataArguments):
    source = model_args.tokenizer_name_or_path or model_args.model_name_or_path
    if source is not None:
        return AutoTokenizer.from_pretrained(source)
    texts = [pair[lang] for pair in train_split["translation"] for lang in (data.source_lang, data.target_lang)]
    return train_shared_tokenizer(texts, vocab_size=model_args.vocab_size, model_max_length=max(
        data.max_source_length, data.max_target_length))


def _parse_overrides(text: str | None) -> dict:
    overrides = {}
    for item in filter(None, (text or "").split(",")):
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--config_overrides takes field=value pairs, got {item!r}.")
        # JSON values (0.3, true, null), plus Python's spelling of the constants, which users type as often.
        python_constants = {"True": True, "False": False, "None": None}
        try:
            overrides[name.strip()] = python_constants[value] if value in python_constants else json.loads(value)
        except json.JSONDecodeError:
            overrides[name.strip()] = value
    return overrides


def build_model(model_args: ModelArguments, recipe: RecipeArguments, tokenizer):
    overrides = {**_parse_overrides(model_args.config_overrides), "label_smoothing": recipe.label_smoothing}
    kwargs = {"attn_implementation": model_args.attn_implementation} if model_args.attn_implementation else {}
    if model_args.model_name_or_path is not None:
        # Passed to from_pretrained so they reach the modules (dropout rates), not only the config object.
        # The checkpoint's own generation config comes with it.
        return AutoModelForSeq2SeqLM.from_pretrained(model_args.model_name_or_path, **overrides, **kwargs)
    special = dict(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                   eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.bos_token_id)
    if model_args.config_file is not None:
        config = VanillaTransformerConfig.from_json_file(model_args.config_file)
        config = VanillaTransformerConfig(**{**config.to_dict(), **overrides, "vocab_size": len(tokenizer), **special})
    else:
        config = VanillaTransformerConfig.from_preset(model_args.preset, vocab_size=len(tokenizer), **special,
                                                      **overrides)
    model = VanillaTransformerForConditionalGeneration._from_config(config, **kwargs)
    model.generation_config = paper_generation_config(config)  # §6.1, saved with the trained model
    return model


def check_recipe_fits_the_run(recipe: RecipeArguments, args: TranslationTrainingArguments):
    """Settings that would only fail after hours of training fail before it."""
    if recipe.tokens_per_step is not None and args.gradient_accumulation_steps != 1:
        raise ValueError(f"--tokens_per_step plans the accumulation itself; drop --gradient_accumulation_steps "
                         f"{args.gradient_accumulation_steps}.")
    wanted = recipe.average_last_checkpoints
    if not wanted:
        return
    if args.save_strategy != "steps":  # only step-based saving also saves the final step
        raise ValueError(f"--average_last_checkpoints {wanted} needs checkpoints every few steps: set --save_strategy "
                         f"steps (got {args.save_strategy}).")
    if args.save_total_limit is not None and args.save_total_limit < wanted:
        raise ValueError(f"--average_last_checkpoints {wanted} needs --save_total_limit of at least {wanted}, "
                         f"got {args.save_total_limit}: older checkpoints would be deleted before averaging.")
    if args.max_steps > 0:
        interval = args.save_steps if args.save_steps >= 1 else math.ceil(args.max_steps * args.save_steps)
        written = math.ceil(args.max_steps / interval)  # every `interval` steps, and the final one
        if written < wanted:
            raise ValueError(f"--average_last_checkpoints {wanted}: --max_steps {args.max_steps} with --save_steps "
                             f"{args.save_steps} writes only {written} checkpoints.")
    if args.fsdp or os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true"):
        raise ValueError(f"--average_last_checkpoints {wanted} with FSDP (--fsdp {args.fsdp!r}, ACCELERATE_USE_FSDP="
                         f"{os.environ.get('ACCELERATE_USE_FSDP')!r}) reads each checkpoint's safetensors weights, which FSDP "
                         "checkpoints do not hold (they are sharded): train with DDP or DeepSpeed ZeRO-2 to average.")
    if args.push_to_hub:
        raise ValueError(f"--push_to_hub with --average_last_checkpoints {wanted} would upload the last step's weights "
                         "before they are averaged: train "
                         "without it and push the finished folder with scripts/push_to_hub.py.")


def replace_weights_with_average(folder: Path, n: int) -> list[str]:
    """Replace the weights saved in `folder` by the average of its last `n` checkpoint-N folders (§6.1); returns
    their names. The last step's own weights remain in the newest checkpoint."""
    checkpoints = last_checkpoints(folder, n)
    staging = folder / ".averaging"
    shutil.rmtree(staging, ignore_errors=True)
    average_checkpoints(checkpoints, staging)
    for name in [*weight_files(folder), INDEX_FILE]:
        (folder / name).unlink(missing_ok=True)
    for name in [*weight_files(staging), INDEX_FILE]:
        if (staging / name).is_file():
            shutil.move(staging / name, folder / name)
    shutil.rmtree(staging)
    return [path.name for path in checkpoints]


def check_output_dir_is_free(args: TranslationTrainingArguments):
    """A finished or interrupted run is never replaced silently: continue it or name another folder."""
    if args.resume_from_checkpoint is not None or args.overwrite_output_dir:
        return
    try:
        check_output_dir(args.output_dir)
    except ValueError as error:
        raise ValueError(f"{error} Training from scratch would overwrite the run saved there: continue it with "
                         "--resume_from_checkpoint true (or a checkpoint folder), or pass --overwrite_output_dir "
                         "to replace it.") from None


def run(model_args: ModelArguments, data: DataArguments, recipe: RecipeArguments,
        args: TranslationTrainingArguments) -> dict:
    """Train, evaluate BLEU on the test (else validation) split, save a Hub-ready folder; return the results."""
    check_run_can_start(recipe, args)
    raw = load_raw_splits(data)
    tokenizer = build_tokenizer(model_args, raw["train"], data)
    # Seed before the weights are drawn: Trainer seeds only later, and every rank must start from the same model.
    (enable_full_determinism if args.full_determinism else set_seed)(args.seed)
    model = build_model(model_args, recipe, tokenizer)
    if len(tokenizer) > model.config.vocab_size:  # the only way the data path can produce ids the model lacks
        where = model_args.tokenizer_name_or_path or model_args.model_name_or_path
        raise ValueError(f"The tokenizer (from {where}) has {len(tokenizer)} tokens but the model (from "
                         f"{model_args.model_name_or_path or model_args.config_file or '--preset ' + model_args.preset}) "
                         f"has vocab_size {model.config.vocab_size}: ids from {model.config.vocab_size} on would have "
                         "no embedding.")
    generation_config = GenerationConfig.from_dict(model.generation_config.to_dict())

    def prepare(split):
        with args.main_process_first(desc=f"tokenizing {split}"):
            tokenized, report = tokenize_parallel(raw[split], tokenizer, data.source_lang, data.target_lang,
                                                  data.max_source_length, data.max_target_length,
                                                  num_proc=data.preprocessing_num_workers)
        return tokenized, report

    train_set, train_report = prepare("train")
    if train_report.kept == 0:
        raise ValueError(f"No training pair is left: all {train_report.dropped} are longer than --max_source_length "
                         f"{data.max_source_length} or --max_target_length {data.max_target_length} tokens.")
    max_tokens_per_batch, plan = recipe.max_tokens_per_batch, None
    if recipe.tokens_per_step is not None:
        plan = plan_token_batches(recipe.tokens_per_step, max(1, args.world_size), recipe.max_tokens_per_device,
                                  *example_lengths(train_set), pad_to_multiple_of=recipe.pad_to_multiple_of)
        logger.warning("Batches (§5.1): %s.", plan)
        if args.deepspeed and plan.gradient_accumulation_steps != args.gradient_accumulation_steps:
            # The DeepSpeed JSON's "auto" values were filled from the arguments as parsed, before this plan.
            raise ValueError(f"--tokens_per_step with --deepspeed {args.deepspeed}: the plan ({plan}) needs "
                             f"--gradient_accumulation_steps {plan.gradient_accumulation_steps}; pass it and "
                             f"--max_tokens_per_batch {plan.max_tokens_per_batch} instead of --tokens_per_step.")
        max_tokens_per_batch, args.gradient_accumulation_steps = plan.max_tokens_per_batch, plan.gradient_accumulation_steps
    eval_set = prepare("validation")[0] if "validation" in raw and args.eval_strategy != "no" else None
    # Trainer evaluation decodes with the paper's beam but a fixed length budget (it pads to one width).
    if args.generation_max_length is None:
        args.generation_max_length = data.max_target_length
    trainer = PaperTrainer(
        model=model,
        args=args,
        train_dataset=train_set,
        eval_dataset=eval_set,
        processing_class=tokenizer,
        data_collator=TranslationDataCollator(tokenizer, model=model, label_pad_token_id=-100,
                                              pad_to_multiple_of=recipe.pad_to_multiple_of),
        compute_metrics=build_compute_metrics(tokenizer),
        noam_schedule=NoamLambda(model.config.d_model, recipe.noam_warmup_steps, recipe.noam_factor)
        if recipe.lr_scheduler == "noam" else None,
        max_tokens_per_batch=max_tokens_per_batch,
    )
    train_result = trainer.train(resume_from_checkpoint=resolve_checkpoint(args.resume_from_checkpoint,
                                                                            args.output_dir, args.world_size))

    # Trainer switches the cache off for training and evaluation fills the generation config with
    # global defaults; restore both so the saved model decodes as the paper does.
    model.config.use_cache = True
    model.generation_config = generation_config
    results = {"train": {**train_result.metrics, "length_filter": train_report.as_dict(),
                         **({"batch_plan": asdict(plan)} if plan else {})}}
    if trainer.is_fsdp_enabled:  # one loadable safetensors file, not shards, in the final folder
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    trainer.save_model(args.output_dir)  # on every rank: FSDP and DeepSpeed gather the weights collectively
    trainer.accelerator.wait_for_everyone()
    if trainer.is_world_process_zero():
        folder = Path(args.output_dir)
        tokenizer.save_pretrained(folder)
        add_translation_pipeline(folder)
        if recipe.average_last_checkpoints:
            results["averaged_checkpoints"] = replace_weights_with_average(folder, recipe.average_last_checkpoints)
        evaluation_split = "test" if "test" in raw else "validation" if "validation" in raw else None
        scores = None
        if evaluation_split is not None:
            # Sharded weights (FSDP, ZeRO-3) cannot generate on one rank alone: evaluate the saved model.
            sharded = trainer.is_fsdp_enabled or (trainer.is_deepspeed_enabled and
                                                  trainer.accelerator.state.deepspeed_plugin.zero_stage == 3)
            from_disk = sharded or recipe.average_last_checkpoints
            eval_model = AutoModelForSeq2SeqLM.from_pretrained(folder).to(args.device) if from_disk else model
            scores, hypotheses = evaluate_bleu(eval_model, tokenizer, raw[evaluation_split], data,
                                               args.per_device_eval_batch_size, paper_bleu=recipe.paper_bleu)
            results[evaluation_split] = scores
            (folder / f"{evaluation_split}_translations.txt").write_text("".join(h + "\n" for h in hypotheses),
                                                                         encoding="utf-8")
        (folder / "results.json").write_text(json.dumps(results, indent=2, default=str))
        card = render_model_card(
            folder, languages=[data.source_lang, data.target_lang], license=model_args.license, datasets=None,
            eval_results=None if scores is None else {**scores, "dataset_split": evaluation_split},
            dataset_name=_dataset_name(data),
            training_summary=f"{trainer.state.global_step} optimizer steps of the paper's recipe "
                             f"(scripts/train.py; see results.json and training_curves.png).",
        )
        card.save(folder / "README.md")
        check_hub_folder(folder)
        plot_path = Path(args.output_dir, "training_curves.png")
        from .plots import plot_training_curves  # matplotlib only where a plot is drawn
        plot_training_curves(trainer.state.log_history, plot_path)
    return results


def resolve_checkpoint(resume: str | bool | None, output_dir: str, world_size: int = 1) -> str | None:
    """--resume_from_checkpoint PATH, checked; "true"/"last" means the newest *complete* checkpoint-N of
    output_dir. Trainer writes checkpoints in place, so a run killed mid-save can leave a newer, partial one:
    without its trainer state, without every rank's RNG state, or with weights that do not load."""
    if resume is None or resume is False or str(resume).lower() in ("false", "none", ""):
        return None
    if str(resume).lower() not in ("true", "last"):
        try:
            check_weights(resume)
        except ValueError as error:
            raise ValueError(f"--resume_from_checkpoint {resume} cannot be resumed from: {error}") from error
        return str(resume)
    candidates = sorted((path for path in Path(output_dir).glob("checkpoint-*") if path.name.split("-")[-1].isdigit()),
                        key=lambda path: int(path.name.split("-")[-1]), reverse=True)
    for path in candidates:
        if not (path / "trainer_state.json").is_file():
            logger.warning("Skipping %s: no trainer_state.json (written last, so the save was interrupted).", path)
        elif world_size > 1 and len(list(path.glob("rng_state_*.pth"))) < world_size:
            logger.warning("Skipping %s: it holds the RNG states of fewer than %d ranks.", path, world_size)
        else:
            try:
                check_weights(path)
            except ValueError as error:
                logger.warning("Skipping %s: %s", path, error)
                continue
            return str(path)
    raise ValueError(f"--resume_from_checkpoint {resume}: no complete checkpoint-N folder in {output_dir}.")


def _dataset_name(data: DataArguments) -> str:
    if data.train_source_file:
        return f"{Path(data.train_source_file).parent.name} ({data.source_lang}-{data.target_lang})"
    return "vanilla_transformer built-in English-German task" if data.dataset == "builtin" else data.dataset


def evaluate_bleu(model, tokenizer, split, data: DataArguments, batch_size: int = 64, paper_bleu: bool = False,
                  **generate_kwargs) -> tuple[dict, list[str]]:
    """sacreBLEU and chrF of beam-search translations of a whole split against its raw references, and with
    `paper_bleu` the paper's tokenized BLEU too; returns the scores (with a few examples) and the translations."""
    sources = [pair[data.source_lang] for pair in split["translation"]]
    references = [pair[data.target_lang] for pair in split["translation"]]
    hypotheses = translate(model, tokenizer, sources, batch_size=batch_size, progress=True, **generate_kwargs)
    scores = corpus_scores(hypotheses, references)
    if paper_bleu:
        scores["paper_bleu"] = metrics.paper_bleu(hypotheses, references, lang=data.target_lang)
    examples = [{"source": s, "reference": r, "translation": h}
                for s, r, h in list(zip(sources, references, hypotheses))[: data.num_examples]]
    return {**scores, "num_sentences": len(sources), "examples": examples}, hypotheses


__all__ = ["ModelArguments", "DataArguments", "RecipeArguments", "TranslationTrainingArguments", "PaperTrainer",
           "parse_training_args", "check_run_can_start",
           "run", "resolve_checkpoint", "check_output_dir_is_free", "check_recipe_fits_the_run",
           "replace_weights_with_average", "evaluate_bleu", "load_raw_splits", "build_tokenizer", "build_model"]
