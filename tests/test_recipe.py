"""The recipes in miniature: scripts/recipes/wmt14_en_de.py (every stage of the paper's run, from data to both BLEU
figures) and scripts/recipes/multi30k_en_de.py (to an averaged folder scored on validation and held-out sets)."""

import json
import logging
import os
import runpy
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from conftest import hub_dataset_folder, snapshot
from vanilla_transformer.training import load_raw_splits, parse_training_args
from vanilla_transformer.training.metrics import corpus_scores, multi30k_bleu, paper_bleu

ROOT = Path(__file__).resolve().parents[1]


def recipe(absent_multi30k: Path) -> dict:
    namespace = runpy.run_path(str(ROOT / "scripts" / "recipes" / "wmt14_en_de.py"), run_name="recipe")
    # The built-in task: the test must not depend on shared data. run_path returns a copy of the module's
    # globals, so the functions' own globals are the ones to change.
    namespace["main"].__globals__["MULTI30K"] = absent_multi30k
    return namespace


def test_the_tiny_recipe_trains_averages_and_reports_both_bleu_figures(tmp_path):
    namespace = recipe(tmp_path / "no_multi30k")
    output, tokenizer_dir = tmp_path / "run", tmp_path / "bpe"
    results = namespace["main"]([
        "--model", "base", "--scale", "tiny", "--output_dir", str(output), "--tokenizer_dir", str(tokenizer_dir),
        # train.py flags win over the recipe's: a shorter run still writes more checkpoints than it averages.
        "--max_steps", "12", "--save_steps", "2", "--max_train_samples", "600", "--max_eval_samples", "6",
        "--eval_strategy", "no", "--per_device_eval_batch_size", "6"])

    saved = json.loads((output / "results.json").read_text())
    test = saved["test"]
    assert test["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert "get_ende_bleu.sh" in test["paper_bleu"]["protocol"]
    # Both figures score the saved translations of the test split, each by its own protocol.
    translations = (output / "test_translations.txt").read_text(encoding="utf-8").splitlines()
    data = parse_training_args(["--output_dir", str(output), "--dataset_name", "builtin", "--max_eval_samples", "6"])[1]
    references = [pair["de"] for pair in load_raw_splits(data)["test"]["translation"]]
    assert test["bleu"] == corpus_scores(translations, references)["bleu"]
    assert test["paper_bleu"]["bleu"] == paper_bleu(translations, references, lang="de")["bleu"]
    assert saved["averaged_checkpoints"] == [f"checkpoint-{step}" for step in (4, 6, 8, 10, 12)]
    plan = saved["train"]["batch_plan"]
    assert plan["tokens_per_step"] == 2000 and plan["world_size"] == 1
    assert results["test"]["bleu"] == test["bleu"]

    # The final folder holds the average of the last 5 checkpoints (§6.1) and loads as any transformers model.
    averaged = AutoModelForSeq2SeqLM.from_pretrained(output)
    checkpoints = [load_file(output / name / "model.safetensors") for name in saved["averaged_checkpoints"]]
    name = "model.encoder.layers.0.self_attn.q_proj.weight"
    expected = torch.stack([c[name].double() for c in checkpoints]).mean(0).float()
    torch.testing.assert_close(averaged.state_dict()[name], expected, atol=1e-7, rtol=0)
    assert not torch.equal(expected, checkpoints[-1][name])  # not simply the last step's weights
    assert averaged.generation_config.num_beams == 4 and averaged.generation_config.length_penalty == 0.6
    card = (output / "README.md").read_text()
    assert "BLEU, tokenized" in card and "get_ende_bleu.sh" in card and "sacreBLEU" in card

    # The vocabulary is trained once and reused by the next run.
    stamp = (tokenizer_dir / "tokenizer.json").stat().st_mtime_ns
    namespace["shared_vocabulary"](tokenizer_dir, [], 4000, 64)
    assert (tokenizer_dir / "tokenizer.json").stat().st_mtime_ns == stamp


def test_the_paper_recipes_default_path_runs_on_a_dataset_by_name(tmp_path):
    """What `wmt14_en_de.py --model base` runs without --data_dir (the Hub's wmt/wmt14, de-en), end to end, with a local
    folder in the Hub's layout standing in for it: vocabulary, a few steps, averaging, the test split scored."""
    from vanilla_transformer.data.builtin_task import build_builtin_task

    task = build_builtin_task()
    splits = {split: [(p["en"], p["de"]) for p in task[split].select(range(n))["translation"]]
              for split, n in (("train", 400), ("validation", 8), ("test", 8))}
    folder = hub_dataset_folder(tmp_path / "wmt14", splits)
    namespace = recipe(tmp_path / "no_multi30k")
    assert namespace["recipe_parser"]().parse_args([]).dataset_name == "wmt/wmt14"
    output = tmp_path / "run"
    results = namespace["main"]([
        "--model", "base", "--dataset_name", str(folder), "--output_dir", str(output),
        "--tokenizer_dir", str(tmp_path / "bpe"), "--preset", "tiny", "--tokens_per_step", "1000",
        "--max_steps", "5", "--save_steps", "1", "--eval_strategy", "no", "--report_to", "none", "--use_cpu"])
    saved = json.loads((output / "results.json").read_text())
    assert saved["averaged_checkpoints"] == [f"checkpoint-{step}" for step in range(1, 6)]
    assert saved["test"]["num_sentences"] == 8 and "bleu" in saved["test"]["paper_bleu"]
    assert results["train"]["length_filter"]["kept"] == 400
    assert f"{folder} (de-en)" in (output / "README.md").read_text()


def test_the_recipe_refuses_settings_that_would_fail_after_training(tmp_path, monkeypatch):
    main = recipe(tmp_path / "no_multi30k")["main"]
    base = ["--scale", "tiny", "--output_dir", str(tmp_path / "run"), "--tokenizer_dir", str(tmp_path / "bpe"),
            "--max_train_samples", "200"]
    with pytest.raises(ValueError, match="--average_last_checkpoints 20 needs --save_total_limit of at least 20"):
        main(["--model", "big", *base, "--save_total_limit", "3"])
    with pytest.raises(ValueError, match="--average_last_checkpoints 5 needs checkpoints"):
        main(["--model", "base", *base, "--save_strategy", "no"])
    with pytest.raises(ValueError, match="--max_steps 30 with --save_steps 10 writes only 3 checkpoints"):
        main(["--model", "base", *base, "--max_steps", "30"])
    with pytest.raises(ValueError, match="--push_to_hub with --average_last_checkpoints 5 would upload the last step's weights before they are averaged"):
        main(["--model", "base", *base, "--push_to_hub"])
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(ValueError, match="FSDP checkpoints do not hold"):
        main(["--model", "base", *base])
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    with pytest.raises(ValueError, match="--tokens_per_step plans the accumulation itself"):
        main(["--model", "base", *base, "--gradient_accumulation_steps", "4"])
    with pytest.raises(ValueError, match="not both \\(got --tokens_per_step 2000 and --max_tokens_per_batch 500\\)"):
        main(["--model", "base", *base, "--max_tokens_per_batch", "500"])
    with pytest.raises(ValueError, match="--warmup_steps must be a whole number of updates, at least 1, with --lr_scheduler_type noam"):
        main(["--model", "base", *base, "--noam_warmup_steps", "0"])
    # Each refusal came before the recipe wrote anything: no vocabulary was trained, no run folder made.
    assert not (tmp_path / "bpe").exists() and not (tmp_path / "run").exists()


def test_the_recipe_never_writes_into_a_finished_run_and_names_the_flags_it_refuses(tmp_path):
    main = recipe(tmp_path / "no_multi30k")["main"]
    finished = tmp_path / "run"
    (finished / "checkpoint-10").mkdir(parents=True)
    (finished / "model.safetensors").write_bytes(b"weights a user trained")
    (finished / "checkpoint-10" / "trainer_state.json").write_text("{}")
    before = snapshot(finished)
    arguments = ["--scale", "tiny", "--output_dir", str(finished), "--tokenizer_dir", str(tmp_path / "bpe")]
    with pytest.raises(ValueError, match=f"{finished}.*--resume_from_checkpoint true.*--overwrite_output_dir"):
        main(arguments)
    assert snapshot(finished) == before and not (tmp_path / "bpe").exists()

    data_dir = tmp_path / "wmt14"
    data_dir.mkdir()
    for name in ("train.en", "train.de", "newstest2013.en", "newstest2013.de", "newstest2014.en"):
        (data_dir / name).write_text("a line\n")
    with pytest.raises(FileNotFoundError, match=rf"newstest2014\.de is missing: --data_dir {data_dir} needs"):
        main(["--data_dir", str(data_dir), "--output_dir", str(tmp_path / "paper"), "--tokenizer_dir",
              str(tmp_path / "bpe")])
    assert not (tmp_path / "paper").exists() and not (tmp_path / "bpe").exists()


@pytest.mark.parametrize("flags, message", [
    (["--scale", "tiny", "--data_dir", "somewhere"], "--data_dir somewhere is for --scale paper"),
    (["--cost_table", "--step_times", "no_such_report.json"], "got no_such_report.json: no such file"),
    (["--cost_table"], "--cost_table needs --step_times REPORT"),
    (["--model", "huge"], "--model: invalid choice: 'huge'"),
])
def test_the_recipes_own_flags_are_refused_by_name(flags, message, capsys, tmp_path):
    main = recipe(tmp_path / "no_multi30k")["main"]
    with pytest.raises(SystemExit) as exit_:
        main([*flags, "--output_dir", str(tmp_path / "run")])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_the_cost_table_projects_the_measured_step_to_the_papers_runs(capsys, tmp_path):
    from vanilla_transformer.training.cost_model import cost_table, measured_step_seconds

    report = {"environment": {"gpu": "NVIDIA H200"}, "sections": {"paper_batch_training": {"result": {
        "source_tokens": 10_000, "target_tokens": 15_000, "presets": {
            "base": {"systems": {"ours_eager": {"step_ms": 80.0}, "ours_compiled": {"step_ms": 25.0}}},
            "big": {"systems": {"ours_eager": {"step_ms": 100.0}}}}}}}}  # big's compile failed: its eager step
    measured = measured_step_seconds(report)
    assert measured["base"] == {"step_s": pytest.approx(0.05), "how": "compiled bf16 step at the paper batch"}
    assert measured["big"] == {"step_s": pytest.approx(0.2), "how": "eager bf16 step at the paper batch"}  # 25k of 50k
    table = cost_table(report, Path("/tmp/report.json"))
    assert "| base | 100,000 | 50 ms | 1.4 h | 0.17 h | 1 min | 1.4 | 12 h = 96 GPU-hours |" in table
    assert "| big | 300,000 | 200 ms | 16.7 h | 2.08 h | 16 min | 16.7 | 84 h = 672 GPU-hours |" in table
    assert "nothing to project" in cost_table({"sections": {}}, Path("old.json"))
    (tmp_path / "report.json").write_text(json.dumps(report))
    recipe(Path("/nonexistent"))["main"](["--cost_table", "--step_times", str(tmp_path / "report.json")])
    printed = capsys.readouterr().out.strip()  # the same, from the recipe's command line
    assert printed == cost_table(report, tmp_path / "report.json") and str(tmp_path / "report.json") in printed


# scripts/recipes/multi30k_en_de.py in miniature ---------------------------------------------------------------

def multi30k_recipe() -> dict:
    return runpy.run_path(str(ROOT / "scripts" / "recipes" / "multi30k_en_de.py"), run_name="recipe")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Multi30k's file layout (train, val) and a held-out pair, filled from the built-in task."""
    from vanilla_transformer.data.builtin_task import build_builtin_task

    folder = tmp_path_factory.mktemp("corpus")
    splits = build_builtin_task()
    for name, split, count in (("train", "train", 400), ("val", "validation", 12), ("heldout", "test", 8)):
        pairs = splits[split]["translation"][:count]
        for lang in ("en", "de"):
            (folder / f"{name}.{lang}").write_text("".join(pair[lang] + "\n" for pair in pairs), encoding="utf-8")
    return folder


def test_the_multi30k_recipe_ends_in_an_averaged_scored_folder_that_translate_py_uses(corpus, tmp_path):
    output = tmp_path / "m30k"
    started = time.time()
    # --record writes into the results folder the pages render; here a folder of the test's, and the commit that the
    # run would take from a clean tree (this test's tree may hold uncommitted work). run_path hands back a copy of
    # the module's globals: the functions' own are patched.
    recipe = multi30k_recipe()["main"].__globals__
    recipe["ROOT"], recipe["RESULTS"] = tmp_path, tmp_path / "results"
    recipe["RESULTS"].mkdir()
    recipe["measured_environment"] = lambda parser: {"commit": "0123abc", "measures": list(recipe["MEASURES"])}
    results = recipe["main"]([
        "--output_dir", str(output), "--data_dir", str(corpus), "--test_source_file", str(corpus / "heldout.en"),
        "--test_target_file", str(corpus / "heldout.de"), "--record",
        # train.py flags win over the recipe's: a tiny model, a few steps, still more checkpoints than averaged.
        "--preset", "tiny", "--vocab_size", "300", "--max_steps", "6", "--save_steps", "1", "--eval_steps", "3",
        "--noam_warmup_steps", "2", "--per_device_eval_batch_size", "8"])
    elapsed_minutes = (time.time() - started) / 60

    saved = json.loads((output / "results.json").read_text())
    # The hour, less 2 minutes for the rest of the command and 1 for the held-out pair, is training's budget.
    assert 56.9 < saved["train"]["max_train_minutes"] <= 57 and saved["train"]["stopped_by_time_budget_at_step"] is None
    assert saved["averaged_checkpoints"] == [f"checkpoint-{step}" for step in (2, 3, 4, 5, 6)]
    averaged = AutoModelForSeq2SeqLM.from_pretrained(output)
    checkpoints = [load_file(output / name / "model.safetensors") for name in saved["averaged_checkpoints"]]
    name = "model.decoder.layers.0.ffn.fc1.weight"
    expected = torch.stack([c[name].double() for c in checkpoints]).mean(0).float()
    torch.testing.assert_close(averaged.state_dict()[name], expected, atol=1e-7, rtol=0)
    # All validation sentences with beam search, and the held-out pair, each scored from its saved translations.
    assert saved["validation"]["num_sentences"] == 12 and averaged.generation_config.num_beams == 4
    assert averaged.generation_config.length_penalty == 1.0  # the recipe's alpha, chosen on validation
    validation = (output / "validation_translations.txt").read_text(encoding="utf-8").splitlines()
    references = (corpus / "val.de").read_text(encoding="utf-8").splitlines()
    expected = corpus_scores(validation, references)
    assert saved["validation"]["bleu"] == expected["bleu"]
    assert saved["validation"]["bleu_lowercase"] == expected["bleu_lowercase"]
    # And in the literature's own BLEU, on Moses tokens as the dataset's official files have them.
    assert saved["validation"]["multi30k_bleu"] == multi30k_bleu(validation, references)
    (held_out,) = saved["held_out"]
    translations = (output / "heldout_translations.txt").read_text(encoding="utf-8").splitlines()
    held_out_references = (corpus / "heldout.de").read_text(encoding="utf-8").splitlines()
    assert held_out["num_sentences"] == 8 and held_out["bleu"] == corpus_scores(translations, held_out_references)["bleu"]
    assert held_out["multi30k_bleu"]["bleu"] == multi30k_bleu(translations, held_out_references)["bleu"]
    assert results["validation"]["bleu"] == saved["validation"]["bleu"]
    card = (output / "README.md").read_text()
    assert "Held-out test sets" in card and f"| {held_out['dataset_name']} | 8 |" in card
    assert f"| BLEU, lowercased | {saved['validation']['bleu_lowercase']:.2f} | `nrefs:1\\|case:lc" in card
    assert f"| BLEU, Multi30k tokens | {saved['validation']['multi30k_bleu']['bleu']:.2f} | Multi30k's" in card
    assert (output / "validation_bleu.png").is_file()
    # The command's minutes, by its own clock: its whole run (training among it), within the test's.
    assert saved["train"]["train_runtime"] / 60 < saved["minutes"] <= elapsed_minutes
    # Each evaluation during training is logged with the minutes since the command began: after its own run time,
    # the second after the first by at least its own, both before the command ended.
    state = json.loads((output / "checkpoint-6" / "trainer_state.json").read_text())
    first, second = [entry for entry in state["log_history"] if "eval_bleu" in entry]
    assert first["eval_runtime"] / 60 <= first["minutes"]
    assert first["minutes"] + second["eval_runtime"] / 60 <= second["minutes"] <= saved["minutes"]
    # The run's own record, which the pages render: what ran, its scores and its validation curve.
    record = json.loads((tmp_path / "results" / "multi30k_ours.json").read_text())
    assert record["command"].startswith("python scripts/recipes/multi30k_en_de.py --output_dir") and "--record" in record["command"]
    assert record["environment"] == {"commit": "0123abc", "measures": ["vanilla_transformer", "scripts/recipes/multi30k_en_de.py"]}
    assert (record["recipe"], record["updates"], record["seed"]) == ("ours", 6, 42)
    assert record["scores"]["validation"]["sacrebleu"] == saved["validation"]["bleu"]
    assert record["scores"]["heldout"]["multi30k_bleu"] == held_out["multi30k_bleu"]["bleu"]
    assert [(point["step"], point["eval_bleu"], point["eval_loss"]) for point in record["curve"]] == [
        (entry["step"], entry["eval_bleu"], entry["eval_loss"]) for entry in (first, second)]

    command = [sys.executable, str(ROOT / "scripts" / "translate.py"), "--model", str(output), "--num_beams", "1",
               "--max_new_tokens", "8"]
    translated = subprocess.run(command, input="I carry the blue pigs\n", capture_output=True, text=True,
                                timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    # One line out for the line in (a model trained six steps may well translate it to nothing).
    assert translated.returncode == 0 and translated.stdout.count("\n") == 1, translated.stderr[-2000:]


def test_wu_et_al_s_recipe_is_their_shape_batch_schedule_averaging_and_beam(corpus, tmp_path):
    output = tmp_path / "wu2021"
    multi30k_recipe()["main"]([
        "--recipe", "wu2021", "--output_dir", str(output), "--data_dir", str(corpus), "--vocab_size", "300",
        "--max_steps", "24", "--warmup_steps", "4", "--per_device_eval_batch_size", "8", "--logging_steps", "1"])
    saved = json.loads((output / "results.json").read_text())
    model = AutoModelForSeq2SeqLM.from_pretrained(output)
    config = model.config
    assert (config.d_model, config.encoder_layers, config.decoder_layers, config.encoder_ffn_dim,
            config.encoder_attention_heads, config.dropout, config.label_smoothing, config.init_method) == (
        128, 4, 4, 256, 4, 0.3, 0.1, "xavier")
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight  # all embeddings shared
    decoding = model.generation_config
    assert (decoding.num_beams, decoding.length_penalty, decoding.length_penalty_type) == (5, 1.0, "hf")
    args = torch.load(output / "checkpoint-24" / "training_args.bin", weights_only=False)
    assert (args.lr_scheduler_type, args.learning_rate, args.warmup_steps, args.adam_epsilon, args.max_grad_norm,
            args.gradient_accumulation_steps) == ("inverse_sqrt", 0.005, 4, 1e-8, 25.0, 2)
    # The corpus is two updates an epoch: every epoch is checkpointed, and the last 10 are averaged (Trainer also
    # keeps the checkpoint with the best validation loss, so 11 may be kept).
    assert saved["averaged_checkpoints"] == [f"checkpoint-{step}" for step in range(6, 25, 2)]
    history = json.loads((output / "checkpoint-24" / "trainer_state.json").read_text())["log_history"]
    rates = [entry["learning_rate"] for entry in history if "learning_rate" in entry]
    assert max(rates) == pytest.approx(0.005, rel=0.3) and rates[-1] < max(rates)  # warmup, then 1 / sqrt(step)
    # fairseq's --patience 10: the validation loss alone after every epoch, training stopping once 10 in a row have
    # not beaten the best (here it never stops: the loss still falls).
    assert (args.eval_strategy, args.prediction_loss_only, args.metric_for_best_model, args.save_total_limit) == (
        "epoch", True, "loss", 11)
    assert [entry["step"] for entry in history if "eval_loss" in entry] == list(range(2, 25, 2))
    assert not any("eval_bleu" in entry for entry in history)
    assert saved["train"]["early_stopping"]["patience"] == 10 and not saved["train"]["early_stopping"]["stopped"]
    # Their text is lowercased: the vocabulary lowercases what it reads, so the model reads and writes lowercase.
    tokenizer = AutoTokenizer.from_pretrained(output)
    assert tokenizer("Ein Mann").input_ids == tokenizer("ein mann").input_ids
    # Their BPE is learnt on Moses tokens: no token joins punctuation to a word.
    assert tokenizer.tokenize("ein mann.")[-1] == "."
    translations = (output / "validation_translations.txt").read_text(encoding="utf-8")
    assert translations == translations.lower()
    assert "multi30k_bleu" in saved["validation"]


@pytest.mark.parametrize("flags, message", [
    (["--test_source_file", "{corpus}/heldout.en"], "in pairs: got 1 source and 0 target files"),
    (["--data_dir", "{tmp}"], "--data_dir {tmp} has no train.en"),
    (["--test_source_file", "{tmp}/missing.en", "--test_target_file", "{corpus}/heldout.de"],
     "--test_source_file {tmp}/missing.en: no such file"),
    (["--minutes", "2.5", "--test_source_file", "{corpus}/heldout.en", "--test_target_file", "{corpus}/heldout.de"],
     "--minutes 2.5 leaves no time to train: the vocabulary, averaging and the final evaluations keep 3.0"),
])
def test_the_multi30k_recipe_refuses_by_flag_before_it_writes(flags, message, corpus, tmp_path, capsys):
    values = {"corpus": corpus, "tmp": tmp_path}
    with pytest.raises(SystemExit) as exit_:
        multi30k_recipe()["main"](["--output_dir", str(tmp_path / "run"), "--data_dir", str(corpus),
                                   *[flag.format(**values) for flag in flags]])
    assert exit_.value.code == 2 and message.format(**values) in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_precision_follows_the_machine_unless_asked(monkeypatch, caplog):
    namespace = multi30k_recipe()
    flags = namespace["precision_flags"]
    monkeypatch.setitem(flags.__globals__, "native_bf16", lambda: False)
    with caplog.at_level(logging.WARNING, logger="multi30k_en_de"):
        assert flags("auto", []) == []
    assert "float32 (this machine has no native bf16 matrix multiply)" in caplog.text
    monkeypatch.setitem(flags.__globals__, "native_bf16", lambda: True)
    assert flags("auto", [])[0] == "--bf16" and flags("fp32", []) == [] and flags("auto", ["--bf16"]) == []
    # What the recipe passes on parses where it runs (on a CPU, Trainer wants --use_cpu with --bf16).
    args = parse_training_args(["--output_dir", "unused", *flags("bf16", [])])[3]
    assert args.bf16
