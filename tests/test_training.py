"""scripts/train.py and the demo, shortened: a few steps end in a folder that loads and translates the same."""

import json
import logging
import math
import re
import runpy
import shutil
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from vanilla_transformer.training import load_raw_splits, parse_training_args, run
from vanilla_transformer.tools.translation import translate
from vanilla_transformer.training.metrics import corpus_scores

ROOT = Path(__file__).resolve().parents[1]
TINY_RUN = ["--preset", "tiny", "--vocab_size", "300", "--max_train_samples", "400", "--max_eval_samples", "12",
            "--per_device_train_batch_size", "16", "--max_steps", "8", "--eval_strategy", "no",
            "--report_to", "none", "--noam_warmup_steps", "4", "--save_strategy", "no", "--logging_steps", "2"]


def parse(arguments):
    return parse_training_args(arguments)


def test_a_short_training_run_saves_a_folder_that_translates_like_the_trained_model(tmp_path):
    output = tmp_path / "run"
    parsed = parse(TINY_RUN + ["--output_dir", str(output)])
    results = run(*parsed)
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                 "modeling_vanilla_transformer.py", "configuration_vanilla_transformer.py", "results.json",
                 "training_curves.png", "test_translations.txt"):
        assert (output / name).exists(), name
    assert results["test"]["num_sentences"] == 12
    # The saved generation config is the paper's, not the one evaluation filled with global defaults.
    generation = json.loads((output / "generation_config.json").read_text())
    assert generation["num_beams"] == 4 and generation["length_penalty"] == 0.6
    assert "max_length" not in generation and json.loads((output / "config.json").read_text())["use_cache"]

    model = AutoModelForSeq2SeqLM.from_pretrained(output)
    tokenizer = AutoTokenizer.from_pretrained(output)
    sources = [pair["en"] for pair in load_raw_splits(parsed[1])["test"]["translation"]]
    in_memory = (output / "test_translations.txt").read_text(encoding="utf-8").splitlines()
    # The same batches as the run's evaluation: a padded batch shares one length budget (source + 50), which
    # matters for this barely trained model that never emits eos.
    assert translate(model, tokenizer, sources, batch_size=parsed[3].per_device_eval_batch_size) == in_memory
    # The reported BLEU is that of the saved translations against the test split's references.
    references = [pair["de"] for pair in load_raw_splits(parsed[1])["test"]["translation"]]
    assert results["test"]["bleu"] == corpus_scores(in_memory, references)["bleu"]
    assert json.loads((output / "results.json").read_text())["test"]["bleu"] == results["test"]["bleu"]


def test_run_reports_its_stages_and_leaves_its_arguments_as_given(tmp_path):
    from transformers import TrainerCallback

    class TrainerArguments(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.seen = (args.gradient_accumulation_steps, args.generation_max_length)

    parsed = parse(TINY_RUN + ["--output_dir", str(tmp_path / "run"), "--per_device_train_batch_size", "8",
                               "--tokens_per_step", "600", "--max_tokens_per_device", "150", "--max_steps", "2"])
    stages, seen = [], TrainerArguments()
    results = run(*parsed, callbacks=[seen], on_stage_end=stages.append)
    assert stages == ["read", "vocabulary", "tokenize", "plan"]
    plan = results["train"]["batch_plan"]
    assert plan["gradient_accumulation_steps"] > 1 and results["train"]["length_filter"]["dropped"] == 0
    # Trainer ran with what the data decided; the arguments the caller passed are as they were.
    assert seen.seen == (plan["gradient_accumulation_steps"], parsed[1].max_target_length)
    assert (parsed[3].gradient_accumulation_steps, parsed[3].generation_max_length) == (1, None)


def test_the_noam_schedule_drives_the_trainer_and_its_saved_arguments_say_so(tmp_path):
    arguments = TINY_RUN + ["--output_dir", str(tmp_path / "run"), "--max_eval_samples", "2", "--noam_factor", "2"]
    arguments[arguments.index("--save_strategy") + 1] = "steps"
    run(*parse(arguments + ["--save_steps", "8"]))
    state = json.loads((tmp_path / "run" / "checkpoint-8" / "trainer_state.json").read_text())
    logged = [(entry["step"], entry["learning_rate"]) for entry in state["log_history"] if "learning_rate" in entry]
    assert [step for step, _ in logged] == [2, 4, 6, 8]
    d_model, warmup, factor = 64, 4, 2.0  # the tiny preset, --noam_warmup_steps 4, --noam_factor 2
    for step, lr in logged:
        # Trainer logs the rate of the update it just made: update k runs at the paper's lr(k).
        assert lr == pytest.approx(factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5), rel=1e-6)
    saved = torch.load(tmp_path / "run" / "checkpoint-8" / "training_args.bin", weights_only=False)
    # What ran, in Trainer's names: the schedule, its peak rate (reached at update `warmup`) and its warmup.
    assert (saved.lr_scheduler_type, saved.warmup_steps) == ("noam", warmup)
    assert saved.learning_rate == pytest.approx(factor * d_model**-0.5 * warmup**-0.5, rel=1e-12)
    assert json.loads(saved.to_json_string())["lr_scheduler_type"] == "noam"


def test_checkpoints_saved_after_a_generating_evaluation_keep_the_models_generation_config(tmp_path):
    arguments = TINY_RUN + ["--output_dir", str(tmp_path / "run"), "--max_eval_samples", "2", "--save_steps", "4",
                            "--eval_steps", "4", "--generation_num_beams", "1"]
    for flag, value in (("--save_strategy", "steps"), ("--eval_strategy", "steps")):
        arguments[arguments.index(flag) + 1] = value
    run(*parse(arguments))
    final = json.loads((tmp_path / "run" / "generation_config.json").read_text())
    for step in (4, 8):
        saved = json.loads((tmp_path / "run" / f"checkpoint-{step}" / "generation_config.json").read_text())
        assert "max_length" not in saved and saved == final and saved["num_beams"] == 4


def test_length_penalty_is_saved_for_a_new_model_and_replaces_a_checkpoints_own_only_when_given(tmp_path):
    def trained(name, *flags, steps=2):
        arguments = TINY_RUN + ["--output_dir", str(tmp_path / name), "--max_eval_samples", "2", *flags]
        for flag, value in (("--max_steps", str(steps)), ("--save_strategy", "steps")):
            arguments[arguments.index(flag) + 1] = value
        run(*parse(arguments + ["--save_steps", "2"]))
        return json.loads((tmp_path / name / "generation_config.json").read_text())

    new = trained("new", "--length_penalty", "1.0")
    assert (new["length_penalty"], new["length_penalty_type"], new["num_beams"]) == (1.0, "gnmt", 4)
    assert json.loads((tmp_path / "new" / "checkpoint-2" / "generation_config.json").read_text()) == new
    assert trained("kept", "--model_name_or_path", str(tmp_path / "new"))["length_penalty"] == 1.0
    assert trained("replaced", "--model_name_or_path", str(tmp_path / "new"), "--length_penalty", "0.2")[
        "length_penalty"] == 0.2
    # A resumed run decodes as the run it continues, not with a new model's 0.6.
    assert trained("new", "--resume_from_checkpoint", "true", steps=4)["length_penalty"] == 1.0

    greedy = tmp_path / "greedy"
    shutil.copytree(tmp_path / "new", greedy, ignore=shutil.ignore_patterns("checkpoint-*"))
    (greedy / "generation_config.json").write_text(json.dumps({**new, "num_beams": 1, "length_penalty": 1.0}))
    with pytest.raises(ValueError, match=r"--length_penalty 0.6 cannot apply to this model's decoding \(num_beams 1\)"):
        trained("refused", "--model_name_or_path", str(greedy), "--length_penalty", "0.6")
    assert not (tmp_path / "refused").exists()


def test_the_last_length_penalty_given_wins_and_one_beside_a_generation_config_file_is_refused(tmp_path):
    # The recipes put a user's flags after their own.
    assert parse(TINY_RUN + ["--output_dir", "unused", "--length_penalty", "1.0", "--length_penalty", "0.6"])[
        2].length_penalty == 0.6
    arguments = TINY_RUN + ["--output_dir", str(tmp_path / "run"), "--length_penalty", "1.0",
                            "--generation_config", str(tmp_path / "generation_config.json")]
    with pytest.raises(ValueError, match="--length_penalty 1.0 and --generation_config .* both set the trained model's"):
        run(*parse(arguments))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_length_penalty_that_is_not_a_finite_number_is_refused(tmp_path, value):
    message = f"--length_penalty must be a finite number \\(the length penalty.s alpha\\), got {value}"
    with pytest.raises(ValueError, match=message):
        parse(TINY_RUN + ["--output_dir", str(tmp_path / "run"), "--length_penalty", value])


def test_a_time_budget_stops_training_cleanly_with_a_checkpoint_of_the_last_step(tmp_path, monkeypatch, caplog):
    clock = iter(range(0, 10_000, 60))  # a minute passes between two readings of the clock
    monkeypatch.setattr("vanilla_transformer.training.trainer.time.monotonic", lambda: next(clock))
    arguments = TINY_RUN + ["--output_dir", str(tmp_path / "run"), "--max_eval_samples", "2", "--save_steps", "100",
                            "--max_train_minutes", "2.5"]
    arguments[arguments.index("--save_strategy") + 1] = "steps"
    arguments[arguments.index("--max_steps") + 1] = "1000"
    with caplog.at_level(logging.WARNING, logger="vanilla_transformer.training.trainer"):
        results = run(*parse(arguments))
    assert "Training stops after 2.5 minutes or at step 1000, whichever comes first" in caplog.text
    # Read at the start (0), then after steps 1, 2 and 3 (1, 2 and 3 minutes): step 3 is the first past 2.5 minutes.
    assert results["train"]["stopped_by_time_budget_at_step"] == 3 and results["train"]["max_train_minutes"] == 2.5
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == ["checkpoint-3"]
    assert json.loads((tmp_path / "run" / "results.json").read_text())["train"]["stopped_by_time_budget_at_step"] == 3


def test_a_decaying_time_budget_anneals_the_noam_rate_towards_zero_at_its_end(tmp_path, monkeypatch, caplog):
    clock = iter(range(0, 10_000, 60))  # a minute passes between two readings of the clock
    monkeypatch.setattr("vanilla_transformer.training.trainer.time.monotonic", lambda: next(clock))
    arguments = TINY_RUN + ["--output_dir", str(tmp_path / "run"), "--max_eval_samples", "2", "--save_steps", "100",
                            "--max_train_minutes", "6", "--lr_decay_minutes", "4"]
    for flag, value in (("--save_strategy", "steps"), ("--max_steps", "1000"), ("--logging_steps", "1")):
        arguments[arguments.index(flag) + 1] = value
    with caplog.at_level(logging.WARNING, logger="vanilla_transformer.training.trainer"):
        results = run(*parse(arguments))
    assert "its learning rate falling linearly to zero over the last 4.0 minutes" in caplog.text
    assert results["train"]["stopped_by_time_budget_at_step"] == 6 and results["train"]["lr_decay_minutes"] == 4
    state = json.loads((tmp_path / "run" / "checkpoint-6" / "trainer_state.json").read_text())
    logged = [(entry["step"], entry["learning_rate"]) for entry in state["log_history"] if "learning_rate" in entry]
    # After step k the clock reads k minutes and the ramp is (6 - k) / 4, at most 1; the scheduler has already
    # fixed update k + 1's rate, so the ramp read after step k drives update k + 2.
    ramp = {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 0.75, 6: 0.5}
    d_model, warmup = 64, 4
    assert [step for step, _ in logged] == list(ramp)
    for step, lr in logged:
        assert lr == pytest.approx(ramp[step] * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5), rel=1e-6)


def test_early_stopping_ends_training_its_patience_after_the_best_evaluation(tmp_path):
    arguments = TINY_RUN + ["--output_dir", str(tmp_path / "run"), "--max_eval_samples", "4", "--eval_steps", "1",
                            "--prediction_loss_only", "--metric_for_best_model", "loss",
                            "--early_stopping_patience", "2",
                            # Training lowers the loss, so with higher counted better the best comes early.
                            "--greater_is_better", "true"]
    for flag, value in (("--eval_strategy", "steps"), ("--max_steps", "50")):
        arguments[arguments.index(flag) + 1] = value
    results = run(*parse(arguments))
    stopping = results["train"]["early_stopping"]
    assert stopping["stopped"] and (stopping["patience"], stopping["metric"]) == (2, "loss")
    assert results["train"]["steps"] == stopping["best_step"] + 2 < 50


def test_a_patience_of_0_given_after_a_recipes_trains_to_the_end(tmp_path):
    # As `--recipe wu2021 --early_stopping_patience 0` reaches train.py: the recipe's patience, then the user's.
    # With higher loss counted better the best comes within the first steps, so a patience of 2 left on stops early.
    arguments = TINY_RUN + ["--output_dir", str(tmp_path / "run"), "--max_eval_samples", "4", "--eval_steps", "1",
                            "--prediction_loss_only", "--metric_for_best_model", "loss", "--greater_is_better", "true",
                            "--early_stopping_patience", "2", "--early_stopping_patience", "0"]
    for flag, value in (("--eval_strategy", "steps"), ("--max_steps", "20")):
        arguments[arguments.index(flag) + 1] = value
    results = run(*parse(arguments))
    assert results["train"]["steps"] == 20 and "early_stopping" not in results["train"]
    with pytest.raises(ValueError, match=re.escape("--early_stopping_patience must be an int of at least 0, got -1")):
        parse(arguments + ["--early_stopping_patience", "-1"])


@pytest.mark.parametrize("flags, message", [
    (["--early_stopping_patience", "3"], "--early_stopping_patience 3 counts evaluations, but --eval_strategy is no"),
    (["--early_stopping_patience", "3", "--eval_strategy", "epoch"],
     "--early_stopping_patience 3 watches --metric_for_best_model, which is not set"),
    (["--metric_for_best_model", "bleu", "--prediction_loss_only"],
     "--metric_for_best_model bleu is not computed with --prediction_loss_only"),
    (["--metric_for_best_model", "loss", "--save_strategy", "steps", "--save_steps", "1",
      "--average_last_checkpoints", "3", "--save_total_limit", "3"],
     "--average_last_checkpoints 3 needs --save_total_limit of at least 4 (with metric_for_best_model loss"),
    (["--lowercase", "--tokenizer_name_or_path", "somewhere"],
     "--lowercase trains the vocabulary on lowercased text, but --tokenizer_name_or_path somewhere gives one"),
    (["--split_punctuation", "--model_name_or_path", "elsewhere"],
     "--split_punctuation trains the vocabulary with punctuation split off, but --model_name_or_path elsewhere gives"),
])
def test_early_stopping_and_lowercasing_are_refused_before_anything_is_written(tmp_path, flags, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        run(*parse(TINY_RUN + ["--output_dir", str(tmp_path / "run"), *flags]))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flags, message", [
    (["--lr_decay_minutes", "5"], "--lr_decay_minutes 5.0 ends the decay at the time budget: give --max_train_minutes"),
    (["--max_train_minutes", "3", "--lr_decay_minutes", "4"],
     "--lr_decay_minutes must be a number of minutes above 0 and at most --max_train_minutes 3.0, got 4.0"),
    (["--max_train_minutes", "3", "--lr_decay_minutes", "0"], "above 0 and at most --max_train_minutes 3.0, got 0.0"),
])
def test_a_learning_rate_decay_without_a_budget_to_end_at_is_refused(tmp_path, flags, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse(TINY_RUN + ["--output_dir", str(tmp_path / "run"), *flags])


def test_a_learning_rate_decay_on_another_scheduler_is_refused_before_anything_is_written(tmp_path):
    arguments = TINY_RUN + ["--output_dir", str(tmp_path / "run"), "--lr_scheduler_type", "linear", "--learning_rate",
                            "5e-4", "--max_train_minutes", "3", "--lr_decay_minutes", "2"]
    with pytest.raises(ValueError, match="--lr_decay_minutes 2.0 anneals the Noam schedule, not --lr_scheduler_type linear"):
        run(*parse(arguments))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("minutes", ["0", "-5", "nan", "inf"])
def test_a_time_budget_that_is_not_a_positive_number_of_minutes_is_refused(tmp_path, minutes):
    with pytest.raises(ValueError, match=f"--max_train_minutes must be a positive number of minutes, got {minutes}"):
        parse(TINY_RUN + ["--output_dir", str(tmp_path / "run"), "--max_train_minutes", minutes])


def test_a_noam_factor_beside_a_learning_rate_is_refused_before_anything_is_written(tmp_path):
    parsed = parse(TINY_RUN + ["--output_dir", str(tmp_path / "run"), "--learning_rate", "5e-4", "--noam_factor", "2"])
    with pytest.raises(ValueError, match=re.escape("--noam_factor 2.0 scales the Noam schedule's peak, but "
                                                   "--learning_rate 0.0005 already sets it")):
        run(*parsed)
    assert not (tmp_path / "run").exists()


def test_another_scheduler_needs_its_own_learning_rate(tmp_path):
    arguments = TINY_RUN + ["--output_dir", str(tmp_path / "run"), "--lr_scheduler_type", "linear"]
    with pytest.raises(ValueError, match="--lr_scheduler_type linear takes its peak rate from --learning_rate: give one"):
        parse(arguments)
    parsed = parse(arguments + ["--learning_rate", "5e-4", "--max_steps", "2"])
    assert (parsed[3].lr_scheduler_type, parsed[3].warmup_steps) == ("linear", 4)  # --noam_warmup_steps is --warmup_steps
    results = run(*parsed)
    assert results["train"]["steps"] == 2 and math.isfinite(results["train"]["train_loss"])


def test_fp16_on_a_cpu_is_refused_rather_than_silently_ignored(tmp_path):
    arguments = TINY_RUN + ["--output_dir", str(tmp_path / "run"), "--fp16"]
    with pytest.raises(ValueError, match="--fp16 has no effect on a CPU"):
        parse(arguments + ["--use_cpu"])
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="--fp16 has no effect on a CPU"):
            parse(arguments)
    parse(TINY_RUN + ["--output_dir", str(tmp_path / "run"), "--bf16", "--use_cpu"])  # bf16 works on a CPU


def test_bad_config_overrides_are_named(tmp_path):
    parsed = parse(TINY_RUN + ["--output_dir", str(tmp_path / "run"), "--config_overrides", "dropout"])
    with pytest.raises(ValueError, match="'dropout'"):
        run(*parsed)


@pytest.mark.parametrize("override, message", [
    ("dropout=0.3,label_smoothing=0.2", "label_smoothing=0.2, but --label_smoothing sets it: pass --label_smoothing 0.2"),
    ("vocab_size=100", "vocab_size=100, but the tokenizer sets it"),
    ("pad_token_id=3", "pad_token_id=3, but the tokenizer sets it"),
])
def test_config_overrides_of_fields_set_elsewhere_are_refused_before_anything_is_written(tmp_path, override, message):
    parsed = parse(TINY_RUN + ["--output_dir", str(tmp_path / "run"), "--config_overrides", override])
    with pytest.raises(ValueError, match=re.escape(message)):
        run(*parsed)
    assert not (tmp_path / "run").exists()


def test_config_overrides_read_json_and_pythons_constants():
    from vanilla_transformer.training.run import parse_config_overrides

    text = "dropout=0.3,scale_embedding=False,normalize_before=true,activation_function=gelu"
    assert parse_config_overrides(text) == {
        "dropout": 0.3, "scale_embedding": False, "normalize_before": True, "activation_function": "gelu"}


def test_split_files_must_come_in_pairs(tmp_path):
    source = tmp_path / "train.en"
    source.write_text("a house\n")
    parsed = parse(TINY_RUN + ["--output_dir", str(tmp_path / "run"), "--train_source_file", str(source)])
    with pytest.raises(ValueError, match="train_target_file"):
        run(*parsed)


def test_the_demo_runs_end_to_end_in_short_form(tmp_path, monkeypatch, capsys):
    """`make demo` runs scripts/demo.py; this is the same job with fewer steps and sentences."""
    monkeypatch.setattr(sys, "argv", ["demo.py", "--output_dir", str(tmp_path / "demo"), "--max_steps", "6",
                                      "--max_train_samples", "600", "--max_eval_samples", "20"])
    runpy.run_path(str(ROOT / "scripts" / "demo.py"), run_name="__main__")
    summary = json.loads((tmp_path / "demo" / "demo_summary.json").read_text())
    assert summary["reload_identical"] == "20/20"
    printed = capsys.readouterr().out
    assert "BLEU on the built-in test split" in printed and "identical to the trained model" in printed
    assert (tmp_path / "demo" / "model" / "training_curves.png").stat().st_size > 10_000


def test_resume_true_picks_the_newest_complete_checkpoint(tmp_path):
    from conftest import tiny_model

    from vanilla_transformer.training.checkpoints import resolve_checkpoint

    tiny_model().save_pretrained(tmp_path / "weights")
    weights = (tmp_path / "weights" / "model.safetensors").read_bytes()
    # 12: killed before trainer_state.json; 14: killed while writing its weights.
    for step, state, weight_bytes in ((2, True, weights), (10, True, weights), (12, False, weights),
                                      (14, True, weights[: len(weights) // 2])):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(weight_bytes)
        if state:
            (folder / "trainer_state.json").write_text("{}")
    assert resolve_checkpoint("True", str(tmp_path)) == str(tmp_path / "checkpoint-10")
    assert resolve_checkpoint("last", str(tmp_path)) == str(tmp_path / "checkpoint-10")
    assert resolve_checkpoint(None, str(tmp_path)) is None
    assert resolve_checkpoint(str(tmp_path / "checkpoint-2"), str(tmp_path)) == str(tmp_path / "checkpoint-2")
    # A checkpoint named explicitly is taken as it is, or refused with its path when it cannot load.
    with pytest.raises(ValueError, match=r"checkpoint-14.*(?i:incomplete|header)"):
        resolve_checkpoint(str(tmp_path / "checkpoint-14"), str(tmp_path))
    # Two ranks: a checkpoint needs both ranks' RNG states to be complete.
    with pytest.raises(ValueError, match="no complete checkpoint"):
        resolve_checkpoint("true", str(tmp_path), world_size=2)
    with pytest.raises(ValueError, match="no complete checkpoint"):
        resolve_checkpoint("true", str(tmp_path / "empty"))


def test_training_into_a_finished_run_is_refused_unless_asked(tmp_path):
    from vanilla_transformer.training.run import check_output_dir_is_free

    output = tmp_path / "run"
    output.mkdir()
    (output / "model.safetensors").write_bytes(b"a trained model")
    parsed = parse(TINY_RUN + ["--output_dir", str(output)])
    with pytest.raises(ValueError, match=rf"{output}.*--resume_from_checkpoint.*--overwrite_output_dir"):
        run(*parsed)
    assert (output / "model.safetensors").read_bytes() == b"a trained model"
    for flags in (["--overwrite_output_dir"], ["--resume_from_checkpoint", "true"]):
        check_output_dir_is_free(parse(TINY_RUN + ["--output_dir", str(output), *flags])[3])
    check_output_dir_is_free(parse(TINY_RUN + ["--output_dir", str(tmp_path / "new")])[3])


# Compiled training (--torch_compile) and what keeps it fast -------------------------------------------------

def test_train_script_trains_compiled_with_the_noam_schedule_on_padded_token_batches(tmp_path):
    """--torch_compile as Trainer runs it (accelerate's dynamo plugin; aot_eager here, inductor on a GPU)."""
    output = tmp_path / "run"
    arguments = TINY_RUN + ["--output_dir", str(output), "--torch_compile", "--torch_compile_backend", "aot_eager",
                            "--max_tokens_per_batch", "256", "--max_eval_samples", "2"]
    results = run(*parse(arguments))
    assert torch.isfinite(torch.tensor(results["train"]["train_loss"]))
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(output)  # saved without the compile wrapper's prefixes
    assert not any(key.startswith("_orig_mod") for key in reloaded.state_dict())


def test_pad_to_multiple_of_must_be_positive_and_the_optimizer_is_fused_adamw(tmp_path):
    with pytest.raises(ValueError, match="--pad_to_multiple_of must be an int of at least 1, got 0"):
        parse(TINY_RUN + ["--output_dir", str(tmp_path), "--pad_to_multiple_of", "0"])
    args = parse(TINY_RUN + ["--output_dir", str(tmp_path)])[3]
    assert args.optim == "adamw_torch_fused"  # Trainer's default from torch 2.8: one kernel per step, not per tensor
    assert not args.logging_nan_inf_filter  # Trainer's NaN filter reads every micro-batch's loss back to the host


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused_before_training(tmp_path):
    from vanilla_transformer.data.tokenization import train_shared_tokenizer

    from conftest import VOCAB, tiny_model

    folder = tmp_path / "model"
    tiny_model().save_pretrained(folder)
    texts = [f"word{i} other{i} more{i % 7}" for i in range(200)]
    tokenizer = train_shared_tokenizer(texts, vocab_size=120)
    tokenizer.save_pretrained(folder)
    assert len(tokenizer) > VOCAB
    with pytest.raises(ValueError, match=rf"tokenizer \(from .*model\) has {len(tokenizer)} tokens but the model "
                                         rf"\(from .*model\) has vocab_size {VOCAB}"):
        run(*parse(TINY_RUN + ["--output_dir", str(tmp_path / "run"), "--model_name_or_path", str(folder)]))
