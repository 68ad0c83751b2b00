"""The paper's recipe as stages on `PaperTrainer` (a `Seq2SeqTrainer`): data, vocabulary, model, batches, training,
then a Hub-ready folder (averaged, evaluated, with its card). `run()` calls them in order; scripts/train.py, the demo
and the recipes call `run()`. The same code runs under `torchrun` / `accelerate launch`, where the main process
reads the data and tokenizes while the others wait, then read what it wrote, and trains the vocabulary it sends them.
"""

import copy
import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from accelerate.utils import broadcast_object_list
from datasets import Dataset, DatasetDict
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig, enable_full_determinism, set_seed
from transformers.utils import GENERATION_CONFIG_NAME

from ..configuration_vanilla_transformer import VanillaTransformerConfig, paper_generation_config
from ..data.batching import TokenBatchPlan, TranslationDataCollator, example_lengths, plan_token_batches
from ..data.corpora import (
    LengthFilterReport,
    available_cores,
    load_parallel_data,
    load_parallel_text_files,
    sentence_batches,
    tokenize_parallel,
)
from ..data.tokenization import train_shared_tokenizer
from ..modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from ..tools.folders import check_output_dir
from ..tools.hub import add_translation_pipeline, check_hub_folder
from ..tools.model_card import write_run_card
from ..tools.translation import translate
from . import metrics
from .arguments import NOAM, DataArguments, ModelArguments, RecipeArguments, TranslationTrainingArguments
from .checkpoints import replace_weights_with_average, resolve_checkpoint
from .schedule import noam_peak_rate
from .trainer import EarlyStopping, PaperTrainer, TrainingTimeBudget

logger = logging.getLogger(__name__)
SPLITS = ("train", "validation", "test")


def run(model_args: ModelArguments, data: DataArguments, recipe: RecipeArguments,
        args: TranslationTrainingArguments, callbacks: list | None = None,
        on_stage_end: Callable[[str], None] | None = None) -> dict:
    """Train, evaluate BLEU on the test (else validation) split, save a Hub-ready folder; return the results.
    `callbacks`: TrainerCallbacks for the run's Trainer; `on_stage_end` is called with each stage's name as it
    ends ("read", "vocabulary", "tokenize", "plan"), for a caller that times them. The arguments' own fields are not
    changed (Trainer gets a copy; the nested configs it shares with it, such as DeepSpeed's, Trainer fills in as it
    would the caller's)."""
    stage_ended = on_stage_end or (lambda name: None)
    check_run_can_start(model_args, recipe, args)
    with args.main_process_first(desc="reading the data"):
        raw = load_raw_splits(data)
    stage_ended("read")
    tokenizer = build_tokenizer(model_args, raw["train"], data, args)
    vocabulary_trained = model_args.tokenizer_name_or_path is None and model_args.model_name_or_path is None
    if vocabulary_trained and raw["train"].cache_files:
        # Training the vocabulary read every page of the text, and a page read through a memory map stays in this
        # process' resident memory while mapped: map the files afresh (a cache hit) and let those pages go.
        raw = load_raw_splits(data)
    stage_ended("vocabulary")
    # Seed before the weights are drawn: Trainer seeds only later, and every rank must start from the same model.
    (enable_full_determinism if args.full_determinism else set_seed)(args.seed)
    checkpoint = resolve_checkpoint(args.resume_from_checkpoint, args.output_dir, args.world_size)
    model = build_model(model_args, recipe, tokenizer, resumed_from=checkpoint)
    train_set, eval_set, length_filter = tokenize_splits(raw, tokenizer, data, args)
    stage_ended("tokenize")
    plan = plan_batches(recipe, args, train_set)
    budget = [TrainingTimeBudget(recipe.max_train_minutes, recipe.lr_decay_minutes)] if recipe.max_train_minutes else []
    patience = [EarlyStopping(recipe.early_stopping_patience)] if recipe.early_stopping_patience else []
    trainer = build_trainer(model, tokenizer, train_set, eval_set, recipe, data, args, plan,
                            [*(callbacks or []), *budget, *patience])
    stage_ended("plan")
    trained = train(trainer, args, checkpoint)
    results = {"train": {"length_filter": length_filter.as_dict(), **({"batch_plan": asdict(plan)} if plan else {}),
                         **trained, **stopping_report(trainer, recipe, budget)}}
    if trainer.is_world_process_zero():
        results.update(finish_folder(trainer, tokenizer, raw, model_args, data, recipe, args, results))
    return results


def check_run_can_start(model_args: ModelArguments, recipe: RecipeArguments, args: TranslationTrainingArguments):
    """Every refusal that needs no data: before a recipe writes anything (a vocabulary, data files) or trains."""
    parse_config_overrides(model_args.config_overrides)
    given = [f"--{name} {getattr(model_args, name)}" for name in ("tokenizer_name_or_path", "model_name_or_path")
             if getattr(model_args, name) is not None]
    for flag, what in (("lowercase", "on lowercased text"), ("split_punctuation", "with punctuation split off")):
        if getattr(model_args, flag) and given:
            raise ValueError(f"--{flag} trains the vocabulary {what}, but {given[0]} gives one already trained "
                             f"(as it was): drop --{flag}.")
    check_recipe_fits_the_run(recipe, args)
    check_output_dir_is_free(args)


def load_raw_splits(data: DataArguments) -> DatasetDict:
    """The splits as memory-mapped Arrow: split files, or --dataset_name (with --dataset_config_name), or the built-in
    task; validation may be called 'valid'; --max_train_samples and --max_eval_samples applied."""
    files_given = any(getattr(data, f"{s}_{side}_file") for s in SPLITS for side in ("source", "target"))
    if files_given:  # split files replace --dataset_name entirely, so splits never mix two corpora
        splits = DatasetDict()
    elif data.dataset_name == "builtin":
        if {data.source_lang, data.target_lang} != {"en", "de"}:
            raise ValueError(f"The built-in task is English-German; got --source_lang {data.source_lang} "
                             f"--target_lang {data.target_lang}.")
        from ..data.builtin_task import build_builtin_task  # grammar tables, loaded only here

        splits = build_builtin_task()
    else:
        loaded = load_parallel_data(data.dataset_name, data.source_lang, data.target_lang,
                                    config_name=data.dataset_config_name)
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
        raise ValueError(f"--dataset_name {data.dataset_name!r} has no 'train' split (splits: {sorted(splits)}); give "
                         "one that has, or --train_source_file and --train_target_file.")
    for split, limit in (("train", data.max_train_samples), ("validation", data.max_eval_samples),
                         ("test", data.max_eval_samples)):
        if limit is not None and split in splits:
            splits[split] = splits[split].select(range(min(limit, len(splits[split]))))
    return splits


def build_tokenizer(model_args: ModelArguments, train_split, data: DataArguments, args: TranslationTrainingArguments):
    """The given tokenizer (--tokenizer_name_or_path, else the checkpoint's), or §5.1's shared BPE trained on the
    training split by the main process, which sends it to the others."""
    source = model_args.tokenizer_name_or_path or model_args.model_name_or_path
    if source is not None:
        return AutoTokenizer.from_pretrained(source)
    tokenizer = [None]
    if args.process_index == 0:
        languages = (data.source_lang, data.target_lang)
        tokenizer = [train_shared_tokenizer(sentence_batches(train_split, languages), vocab_size=model_args.vocab_size,
                                            model_max_length=max(data.max_source_length, data.max_target_length),
                                            num_texts=2 * len(train_split), lowercase=model_args.lowercase,
                                            split_punctuation=model_args.split_punctuation)]
    return broadcast_object_list(tokenizer, from_process=0)[0] if args.world_size > 1 else tokenizer[0]


# Config fields that a flag or the tokenizer sets: given in --config_overrides they would be silently replaced.
SET_ELSEWHERE = {"label_smoothing": "--label_smoothing sets it: pass --label_smoothing {value} instead",
                 **{name: "the tokenizer sets it (--vocab_size sizes the one a run trains)"
                    for name in ("vocab_size", "pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")}}


def parse_config_overrides(text: str | None) -> dict:
    """`--config_overrides`' "field=value,field=value" as a dict of JSON (or Python-constant) values; the fields
    that something else sets are refused."""
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
    clashing = sorted(overrides.keys() & SET_ELSEWHERE.keys())
    if clashing:
        name, value = clashing[0], overrides[clashing[0]]
        raise ValueError(f"--config_overrides sets {name}={value!r}, but {SET_ELSEWHERE[name].format(value=value)}.")
    return overrides


def build_model(model_args: ModelArguments, recipe: RecipeArguments, tokenizer, resumed_from: str | None = None):
    """The model to train; a resumed run decodes as the run it continues (its checkpoint's generation config), and
    --num_beams, --length_penalty and --length_penalty_type, where given, replace what they name."""
    overrides = {**parse_config_overrides(model_args.config_overrides), "label_smoothing": recipe.label_smoothing}
    kwargs = {"attn_implementation": model_args.attn_implementation} if model_args.attn_implementation else {}
    if model_args.model_name_or_path is not None:
        # Passed to from_pretrained so they reach the modules (dropout rates), not only the config object.
        # The checkpoint's own generation config comes with it.
        model = AutoModelForSeq2SeqLM.from_pretrained(model_args.model_name_or_path, **overrides, **kwargs)
    else:
        model = paper_model(model_args, overrides, tokenizer, kwargs)
    if resumed_from is not None and (Path(resumed_from) / GENERATION_CONFIG_NAME).is_file():
        model.generation_config = GenerationConfig.from_pretrained(resumed_from)
    decoding = decoding_flags(recipe)
    if decoding:
        for name, value in decoding.items():  # setattr: update() skips fields a config does not have yet
            setattr(model.generation_config, name, value)
        try:  # transformers refuses to save it later, after training, otherwise
            model.generation_config.validate(strict=True)
        except ValueError as error:
            given = " ".join(f"--{name} {value}" for name, value in decoding.items())
            raise ValueError(f"{given} cannot apply to this model's decoding (num_beams "
                             f"{model.generation_config.num_beams}): {error}") from None
    check_vocabulary(model, tokenizer, model_args)
    return model


def decoding_flags(recipe: RecipeArguments) -> dict:
    """The generation-config fields the command line sets for the trained model."""
    return {name: getattr(recipe, name) for name in ("num_beams", "length_penalty", "length_penalty_type")
            if getattr(recipe, name) is not None}


def paper_model(model_args: ModelArguments, overrides: dict, tokenizer, kwargs: dict):
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


def check_vocabulary(model, tokenizer, model_args: ModelArguments):
    """A tokenizer larger than the model's vocabulary is the one way the data path can make ids the model lacks."""
    if len(tokenizer) > model.config.vocab_size:
        where = model_args.tokenizer_name_or_path or model_args.model_name_or_path
        raise ValueError(f"The tokenizer (from {where}) has {len(tokenizer)} tokens but the model (from "
                         f"{model_args.model_name_or_path or model_args.config_file or '--preset ' + model_args.preset}) "
                         f"has vocab_size {model.config.vocab_size}: ids from {model.config.vocab_size} on would have "
                         "no embedding.")


def check_recipe_fits_the_run(recipe: RecipeArguments, args: TranslationTrainingArguments):
    """Settings that would only fail after hours of training fail before it."""
    if recipe.tokens_per_step is not None and args.gradient_accumulation_steps != 1:
        raise ValueError(f"--tokens_per_step plans the accumulation itself; drop --gradient_accumulation_steps "
                         f"{args.gradient_accumulation_steps}.")
    decoding = decoding_flags(recipe)
    if decoding and args.generation_config is not None:
        # Seq2SeqTrainer puts that file's config on the model after the flags have been applied.
        name, value = next(iter(decoding.items()))
        raise ValueError(f"--{name} {value} and --generation_config {args.generation_config} both set the trained "
                         f"model's decoding: give {name} in that file, or drop --generation_config.")
    check_early_stopping(recipe, args)
    noam = args.lr_scheduler_type == NOAM
    if recipe.noam_factor != 1.0 and (not noam or args.learning_rate is not None):
        raise ValueError(f"--noam_factor {recipe.noam_factor} scales the Noam schedule's peak, but --learning_rate "
                         f"{args.learning_rate} already sets it (--lr_scheduler_type {args.lr_scheduler_type.value}): "
                         "give one of the two.")
    if recipe.lr_decay_minutes is not None and not noam:
        raise ValueError(f"--lr_decay_minutes {recipe.lr_decay_minutes} anneals the Noam schedule, not --lr_scheduler_type "
                         f"{args.lr_scheduler_type.value}: drop one of them (linear and cosine decay by steps).")
    wanted = recipe.average_last_checkpoints
    if not wanted:
        return
    if args.save_strategy not in ("steps", "epoch"):  # epochs: the last N whole epochs, as fairseq averages them
        raise ValueError(f"--average_last_checkpoints {wanted} needs checkpoints every few steps or every epoch: set "
                         f"--save_strategy steps or epoch (got {args.save_strategy}).")
    # With a metric for the best checkpoint (set by --metric_for_best_model, or by --load_best_model_at_end), Trainer
    # keeps that checkpoint beside the newest, so one of the last N could go to keep an older best one.
    needed = wanted + (args.metric_for_best_model is not None)
    if args.save_total_limit is not None and args.save_total_limit < needed:
        best = "" if needed == wanted else (f" (with metric_for_best_model {args.metric_for_best_model}, Trainer also "
                                            "keeps the best checkpoint)")
        raise ValueError(f"--average_last_checkpoints {wanted} needs --save_total_limit of at least {needed}{best}, "
                         f"got {args.save_total_limit}: older checkpoints could be deleted before averaging.")
    if args.max_steps > 0 and args.save_strategy == "steps":
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


def check_early_stopping(recipe: RecipeArguments, args: TranslationTrainingArguments):
    """What --early_stopping_patience and --metric_for_best_model need, checked before training rather than at the
    first evaluation (Trainer asserts or raises only then)."""
    metric = args.metric_for_best_model
    if metric is not None and args.prediction_loss_only and metric.removeprefix("eval_") != "loss":
        raise ValueError(f"--metric_for_best_model {metric} is not computed with --prediction_loss_only (evaluation "
                         "computes the loss alone): use --metric_for_best_model loss, or drop --prediction_loss_only.")
    patience = recipe.early_stopping_patience
    if not patience:
        return
    if args.eval_strategy == "no":
        raise ValueError(f"--early_stopping_patience {patience} counts evaluations, but --eval_strategy is no: set "
                         "--eval_strategy epoch (as fairseq's --patience) or steps.")
    if metric is None:
        raise ValueError(f"--early_stopping_patience {patience} watches --metric_for_best_model, which is not set: "
                         "give it (loss, with --prediction_loss_only to evaluate the loss alone, or bleu).")


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


def tokenize_splits(raw: DatasetDict, tokenizer, data: DataArguments,
                    args: TranslationTrainingArguments) -> tuple[Dataset, Dataset | None, LengthFilterReport]:
    """The training split (and the validation split when Trainer evaluates) as ids; long pairs dropped and
    reported. Returns both and the training split's length filter report."""
    # --overwrite_cache: each machine's main process tokenizes again; the others then read what it wrote.
    overwrite = data.overwrite_cache and args.local_process_index == 0

    def tokenized(split):
        workers = data.preprocessing_num_workers or min(available_cores(), max(1, len(raw[split]) // 50_000))
        with args.main_process_first(desc=f"tokenizing {split}"):
            return tokenize_parallel(raw[split], tokenizer, data.source_lang, data.target_lang, data.max_source_length,
                                     data.max_target_length, num_proc=workers, overwrite_cache=overwrite)

    train_set, report = tokenized("train")
    if report.kept == 0:
        raise ValueError(f"No training pair is left: all {report.dropped} are longer than --max_source_length "
                         f"{data.max_source_length} or --max_target_length {data.max_target_length} tokens.")
    eval_set = tokenized("validation")[0] if "validation" in raw and args.eval_strategy != "no" else None
    return train_set, eval_set, report


def plan_batches(recipe: RecipeArguments, args: TranslationTrainingArguments, train_set) -> TokenBatchPlan | None:
    """With --tokens_per_step, §5.1's batches per optimizer step planned on the data's lengths (logged); else None."""
    if recipe.tokens_per_step is None:
        return None
    plan = plan_token_batches(recipe.tokens_per_step, max(1, args.world_size), recipe.max_tokens_per_device,
                              *example_lengths(train_set), pad_to_multiple_of=recipe.pad_to_multiple_of)
    logger.warning("Batches (§5.1): %s.", plan)
    if args.deepspeed and plan.gradient_accumulation_steps != args.gradient_accumulation_steps:
        # The DeepSpeed JSON's "auto" values were filled from the arguments as parsed, before this plan.
        raise ValueError(f"--tokens_per_step with --deepspeed {args.deepspeed}: the plan ({plan}) needs "
                         f"--gradient_accumulation_steps {plan.gradient_accumulation_steps}; pass it and "
                         f"--max_tokens_per_batch {plan.max_tokens_per_batch} instead of --tokens_per_step.")
    return plan


def build_trainer(model, tokenizer, train_set, eval_set, recipe: RecipeArguments, data: DataArguments,
                  args: TranslationTrainingArguments, plan: TokenBatchPlan | None = None,
                  callbacks: list | None = None) -> PaperTrainer:
    """PaperTrainer with §5.1's token batches (the `plan`'s, or --max_tokens_per_batch per device batch) and §5.3's
    schedule. Its arguments are a copy of `args` with what the data decided: the plan's accumulation, and
    evaluation's length budget (--max_target_length where --generation_max_length is not given: Trainer's
    evaluation decodes with the paper's beam but pads to one width)."""
    args = copy.copy(args)  # not dataclasses.replace: TrainingArguments' __post_init__ would set up devices again
    if args.generation_max_length is None:
        args.generation_max_length = data.max_target_length
    if args.lr_scheduler_type == NOAM and args.learning_rate is None:
        args.learning_rate = noam_peak_rate(model.config.d_model, args.warmup_steps, recipe.noam_factor)
    max_tokens_per_batch = recipe.max_tokens_per_batch
    if plan is not None:
        max_tokens_per_batch, args.gradient_accumulation_steps = plan.max_tokens_per_batch, plan.gradient_accumulation_steps
    return PaperTrainer(
        model=model, args=args, train_dataset=train_set, eval_dataset=eval_set, processing_class=tokenizer,
        data_collator=TranslationDataCollator(tokenizer, model=model, label_pad_token_id=-100,
                                              pad_to_multiple_of=recipe.pad_to_multiple_of),
        compute_metrics=metrics.build_compute_metrics(tokenizer),
        max_tokens_per_batch=max_tokens_per_batch, token_dropout=recipe.token_dropout, callbacks=callbacks,
    )


def train(trainer: PaperTrainer, args: TranslationTrainingArguments, checkpoint: str | None = None) -> dict:
    """Train (from `checkpoint`, resolved from --resume_from_checkpoint, if given) and save the last step's weights
    into --output_dir; returns Trainer's metrics."""
    result = trainer.train(resume_from_checkpoint=checkpoint)
    trainer.model.config.use_cache = True  # Trainer switches the cache off for training
    if trainer.is_fsdp_enabled:  # one loadable safetensors file, not shards, in the final folder
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    trainer.save_model(args.output_dir)  # on every rank: FSDP and DeepSpeed gather the weights collectively
    trainer.accelerator.wait_for_everyone()
    return {**result.metrics, "steps": trainer.state.global_step}


def stopping_report(trainer: PaperTrainer, recipe: RecipeArguments, budget: list[TrainingTimeBudget]) -> dict:
    """What stopped training early, if anything could: the time budget's step, early stopping's best evaluation."""
    report = {}
    if budget:
        report.update(max_train_minutes=recipe.max_train_minutes, lr_decay_minutes=recipe.lr_decay_minutes,
                      stopped_by_time_budget_at_step=budget[0].stopped_at_step)
    if recipe.early_stopping_patience:  # the callback Trainer holds now: a resumed run's restored one replaces ours
        stopping = next(c for c in trainer.callback_handler.callbacks if isinstance(c, EarlyStopping))
        report["early_stopping"] = {"metric": trainer.args.metric_for_best_model, **stopping.report(trainer.state)}
    return report


def finish_folder(trainer: PaperTrainer, tokenizer, raw: DatasetDict, model_args: ModelArguments, data: DataArguments,
                  recipe: RecipeArguments, args: TranslationTrainingArguments, results: dict) -> dict:
    """On the main process: the tokenizer and pipeline beside the weights, the average of the last checkpoints
    (§6.1), BLEU on the test (else validation) split, results.json, the model card and the training curves."""
    folder = Path(args.output_dir)
    tokenizer.save_pretrained(folder)
    add_translation_pipeline(folder)
    finished = {}
    if recipe.average_last_checkpoints:
        finished["averaged_checkpoints"] = replace_weights_with_average(folder, recipe.average_last_checkpoints)
    split = "test" if "test" in raw else "validation" if "validation" in raw else None
    scores = None
    if split is not None:
        # Sharded weights (FSDP, ZeRO-3) cannot generate on one rank alone: evaluate the saved model.
        sharded = trainer.is_fsdp_enabled or (trainer.is_deepspeed_enabled and
                                              trainer.accelerator.state.deepspeed_plugin.zero_stage == 3)
        from_disk = sharded or recipe.average_last_checkpoints
        model = AutoModelForSeq2SeqLM.from_pretrained(folder).to(args.device) if from_disk else trainer.model
        scores, hypotheses = evaluate_bleu(model, tokenizer, raw[split], data, args.per_device_eval_batch_size,
                                           paper_bleu=recipe.paper_bleu, multi30k_bleu=recipe.multi30k_bleu)
        finished[split] = scores
        (folder / f"{split}_translations.txt").write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
    (folder / "results.json").write_text(json.dumps({**results, **finished}, indent=2, default=str))
    write_run_card(folder, {**results, **finished}, languages=[data.source_lang, data.target_lang],
                   license=model_args.license, dataset_name=dataset_description(data))
    check_hub_folder(folder)
    from ..tools.plots import plot_training_curves  # matplotlib only where a plot is drawn
    plot_training_curves(trainer.state.log_history, folder / "training_curves.png")
    return finished


def dataset_description(data: DataArguments) -> str:
    """The training data as the model card names it."""
    if data.train_source_file:
        return f"{Path(data.train_source_file).parent.name} ({data.source_lang}-{data.target_lang})"
    if data.dataset_name == "builtin":
        return "vanilla_transformer built-in English-German task"
    return data.dataset_name + (f" ({data.dataset_config_name})" if data.dataset_config_name else "")


def evaluate_bleu(model, tokenizer, split, data: DataArguments, batch_size: int = 64, paper_bleu: bool = False,
                  multi30k_bleu: bool = False, **generate_kwargs) -> tuple[dict, list[str]]:
    """sacreBLEU and chrF of beam-search translations of a whole split against its raw references, and with
    `paper_bleu` the paper's tokenized BLEU too, with `multi30k_bleu` the Multi30k literature's; returns the scores (with a few examples) and the translations."""
    sources = [pair[data.source_lang] for pair in split["translation"]]
    references = [pair[data.target_lang] for pair in split["translation"]]
    hypotheses = translate(model, tokenizer, sources, batch_size=batch_size, progress=True, **generate_kwargs)
    scores = metrics.corpus_scores(hypotheses, references)
    if paper_bleu:
        scores["paper_bleu"] = metrics.paper_bleu(hypotheses, references, lang=data.target_lang)
    if multi30k_bleu:
        scores["multi30k_bleu"] = metrics.multi30k_bleu(hypotheses, references, lang=data.target_lang)
    examples = [{"source": s, "reference": r, "translation": h}
                for s, r, h in list(zip(sources, references, hypotheses))[: data.num_examples]]
    return {**scores, "num_sentences": len(sources), "examples": examples}, hypotheses


__all__ = ["run", "check_run_can_start", "check_recipe_fits_the_run", "check_early_stopping",
           "check_output_dir_is_free", "load_raw_splits", "build_tokenizer", "parse_config_overrides", "build_model",
           "tokenize_splits", "plan_batches", "build_trainer", "train", "stopping_report", "finish_folder",
           "dataset_description", "evaluate_bleu"]
