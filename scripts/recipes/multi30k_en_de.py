#!/usr/bin/env python
"""Multi30k English→German (Elliott et al., 2016) with the paper's model and recipe, sized for 29k training pairs
and a CPU: one command from the corpus to a Hub-ready folder whose weights average the last checkpoints (§6.1),
scored on the whole validation set with beam search, and on any held-out test sets given, all within --minutes
(default 60): training takes what the rest of the command does not need, however fast the machine.

    python scripts/recipes/multi30k_en_de.py --output_dir runs/multi30k
    python scripts/recipes/multi30k_en_de.py --output_dir runs/m30k --data_dir DIR \\
        --test_source_file test_2016_flickr.en --test_target_file test_2016_flickr.de     # repeatable, in pairs
    python scripts/recipes/multi30k_en_de.py --recipe wu2021 --output_dir runs/m30k_wu2021   # Wu et al.'s, 150 min

Every set is scored in sacreBLEU (cased and lowercased), chrF and the Multi30k literature's BLEU (lowercased Moses
tokens, as the dataset's official *.lc.norm.tok files; metrics.multi30k_bleu), the figure the literature quotes.

--data_dir holds line-aligned train.{en,de} and val.{en,de} (default: ../shared/data/multi30k). Every other flag
goes to scripts/train.py (all of Seq2SeqTrainingArguments) and wins over the recipe's value, e.g. --max_steps,
--max_train_minutes or --config_overrides. --precision auto trains in bf16 autocast (float32 weights and loss)
where the machine multiplies bf16 natively, else in float32, and says which in one log line. The choices and what
each bought on validation: scripts/recipes/README.md.
"""

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, TrainerCallback

from vanilla_transformer.data.corpora import load_parallel_text_files
from vanilla_transformer.tools.model_card import write_run_card
from vanilla_transformer.training import check_run_can_start, evaluate_bleu, parse_training_args, run
from vanilla_transformer.training.precision import native_bf16
from vanilla_transformer.training.run import dataset_description

ROOT = Path(__file__).resolve().parents[2]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"
RESULTS = ROOT / "scripts" / "benchmarks" / "results"
# What a recorded run measured: a change to these after its commit makes its figures stale (scripts/utils/pages.py).
MEASURES = ("vanilla_transformer", "scripts/recipes/multi30k_en_de.py")
# The held-out sets by the names the pages give them (the files' stems in the dataset's data/task1/raw).
SET_NAMES = {"test_2016_flickr": "test2016", "test_2017_flickr": "test2017", "test_2017_mscoco": "mscoco2017"}
logger = logging.getLogger("multi30k_en_de")

# The recipe, chosen on the validation set (scripts/recipes/README.md has the runs behind each choice). Its length
# is a wall-clock budget, not a step count: training stops when the command's --minutes, less what follows training,
# are spent, so a fast CPU trains longer and a slow one still ends in time. max_steps is only a ceiling.
RECIPE = dict(preset="small", vocab_size=6000, max_tokens_per_batch=2000, noam_warmup_steps=400, noam_factor=0.5,
              minutes=60, max_steps=50_000, save_steps=100, average_last_checkpoints=5, eval_steps=1000,
              lowercase=False, split_punctuation=False, length_penalty=1.0,
              config_overrides="dropout=0.3,attention_dropout=0.1,activation_dropout=0.0")
# Wu et al. (2021, "Good for Misconceived Reasons", github LividWo/Revisit-MMT), the strongest small text-only
# Transformer on Multi30k (41.02 on test2016 in the literature's BLEU): their README-baseline.md's command with their
# fairseq fork's defaults, as train.py flags (scripts/recipes/README.md maps each one to theirs). Their Transformer-Tiny
# (4 + 4 layers, d 128, FFN 256, 4 heads, all embeddings shared, post-LN, sinusoidal positions) on lowercased text,
# its BPE learnt with punctuation split from words (theirs on Moses tokens);
# 8,192 tokens an update (--max-tokens 4096 on 2 GPUs: 2 accumulated batches of 4,096 here); Adam (0.9, 0.98), eps
# 1e-8; inverse_sqrt, lr 0.005, 2,000 warmup updates; clip-norm 25; dropout 0.3, label smoothing 0.1; 8,000 updates,
# or fewer where the validation loss, taken after every epoch, has not improved for 10 (--patience 10); the last 10
# epoch checkpoints averaged; beam 5 with fairseq's length normalisation (|Y|^1); their initialisation
# (init_method=xavier). Eager attention: with no attention dropout, SDPA picks a CPU kernel measured slower at these
# shapes (scripts/recipes/README.md); the same mathematics.
WU2021 = dict(preset="small", vocab_size=10000, max_tokens_per_batch=4096, minutes=150, max_steps=8000,
              average_last_checkpoints=10, patience=10, lowercase=True, split_punctuation=True, length_penalty=1.0,
              config_overrides="d_model=128,encoder_layers=4,decoder_layers=4,encoder_ffn_dim=256,decoder_ffn_dim=256,"
                               "encoder_attention_heads=4,decoder_attention_heads=4,dropout=0.3,attention_dropout=0.0,"
                               "activation_dropout=0.0,init_method=xavier",
              schedule=["--attn_implementation", "eager", "--lr_scheduler_type", "inverse_sqrt", "--learning_rate", "0.005", "--warmup_steps", "2000",
                        "--adam_epsilon", "1e-8", "--max_grad_norm", "25", "--gradient_accumulation_steps", "2",
                        "--save_strategy", "epoch", "--num_beams", "5", "--length_penalty_type", "hf"])
RECIPES = {"ours": RECIPE, "wu2021": WU2021}
# Kept from --minutes for what is not training: the vocabulary and data before it; averaging, saving and the beam
# search over the validation set after it; and each held-out set given.
RESERVED_MINUTES, MINUTES_PER_HELD_OUT_SET = 2.0, 1.0


def recipe_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", type=Path, default=ROOT / "runs" / "multi30k")
    parser.add_argument("--data_dir", type=Path, default=MULTI30K, help="train.{en,de} and val.{en,de}")
    parser.add_argument("--test_source_file", type=Path, action="append", default=[],
                        help="a held-out English file to translate and score (repeatable)")
    parser.add_argument("--test_target_file", type=Path, action="append", default=[],
                        help="its German references, in the same order as --test_source_file")
    parser.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto")
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="ours",
                        help="ours (chosen on validation for a CPU hour) or wu2021 (Wu et al.'s Transformer-Tiny)")
    parser.add_argument("--minutes", type=float, help="wall-clock budget of the whole command; training gets what the "
                        "rest does not need (train.py's --max_train_minutes, if given, wins); default: the recipe's, "
                        "60 for ours and 150 for wu2021")
    parser.add_argument("--record", action="store_true",
                        help=f"write the run's record (command, commit, machine, scores, validation curve) to "
                             f"{RESULTS.relative_to(ROOT)}/multi30k_<recipe>.json, the file the pages render the "
                             "recipe's figures from")
    return parser


def training_minutes(parser, recipe, elapsed_minutes: float) -> float:
    """What --minutes leaves for training once the rest of the command is provided for."""
    kept = RESERVED_MINUTES + MINUTES_PER_HELD_OUT_SET * len(recipe.test_source_file) + elapsed_minutes
    if not recipe.minutes - kept > 0:
        parser.error(f"--minutes {recipe.minutes:g} leaves no time to train: the vocabulary, averaging and the final "
                     f"evaluations keep {kept:.1f} of them")
    return recipe.minutes - kept


def schedule_flags(chosen: dict) -> list[str]:
    """The learning-rate schedule and checkpoint interval: ours (Noam, a checkpoint every few steps) or the recipe's own."""
    return chosen.get("schedule") or [
        "--noam_warmup_steps", str(chosen["noam_warmup_steps"]), "--noam_factor", str(chosen["noam_factor"]),
        "--save_strategy", "steps", "--save_steps", str(chosen["save_steps"])]


def evaluation_flags(chosen: dict) -> list[str]:
    """Evaluation during training: ours decodes the validation set greedily every few steps to draw the BLEU curve;
    a recipe with a patience (fairseq's) takes the validation loss after every epoch and stops when it has not
    improved for that many epochs. The final model is decoded with beam search either way."""
    if "patience" in chosen:
        return ["--eval_strategy", "epoch", "--prediction_loss_only", "--metric_for_best_model", "loss",
                "--early_stopping_patience", str(chosen["patience"])]
    return ["--eval_strategy", "steps", "--eval_steps", str(chosen["eval_steps"]), "--generation_num_beams", "1"]


def data_flags(parser, recipe) -> list[str]:
    """train.py's data flags, each file checked before anything is written."""
    flags = []
    for split, stem in (("train", "train"), ("validation", "val")):
        for side, lang in (("source", "en"), ("target", "de")):
            path = recipe.data_dir / f"{stem}.{lang}"
            if not path.is_file():
                parser.error(f"--data_dir {recipe.data_dir} has no {path.name}: it needs train.en, train.de, val.en "
                             "and val.de (line-aligned text)")
            flags += [f"--{split}_{side}_file", str(path)]
    if len(recipe.test_source_file) != len(recipe.test_target_file):
        parser.error(f"give --test_source_file and --test_target_file in pairs: got {len(recipe.test_source_file)} "
                     f"source and {len(recipe.test_target_file)} target files")
    for flag in ("test_source_file", "test_target_file"):
        for path in getattr(recipe, flag):
            if not path.is_file():
                parser.error(f"--{flag} {path}: no such file")
    return flags


def precision_flags(precision: str, passthrough: list[str]) -> list[str]:
    if "--bf16" in passthrough or "--fp16" in passthrough:
        return []  # asked for on the command line: train.py's flag wins
    bf16 = native_bf16() if precision == "auto" else precision == "bf16"
    logger.warning("Precision: %s%s.", "bf16 autocast (float32 weights and loss)" if bf16 else "float32",
                   "" if precision != "auto" else " (this machine " + ("multiplies bf16 natively)" if bf16 else
                                                                      "has no native bf16 matrix multiply)"))
    # Without an accelerator Trainer accepts bf16 only with --use_cpu (it then runs CPU autocast).
    return ["--bf16", *([] if torch.cuda.is_available() else ["--use_cpu"])] if bf16 else []


class WallClock(TrainerCallback):
    """Minutes since the recipe started, written into every log entry (for BLEU against wall-clock time)."""

    def __init__(self, start: float):
        self.start = start

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.log_history:
            state.log_history[-1]["minutes"] = (time.time() - self.start) / 60


def main(argv=None) -> dict:
    start = time.time()
    parser = recipe_parser()
    recipe, passthrough = parser.parse_known_args(argv)
    chosen = RECIPES[recipe.recipe]
    measured = measured_environment(parser) if recipe.record else None
    recipe.minutes = chosen["minutes"] if recipe.minutes is None else recipe.minutes
    flags = [
        "--output_dir", str(recipe.output_dir), "--preset", chosen["preset"], "--vocab_size", str(chosen["vocab_size"]),
        "--config_overrides", chosen["config_overrides"], "--max_tokens_per_batch", str(chosen["max_tokens_per_batch"]),
        *schedule_flags(chosen), "--max_steps", str(chosen["max_steps"]),
        "--max_train_minutes", f"{training_minutes(parser, recipe, (time.time() - start) / 60):.2f}",
        # Where a metric picks the best checkpoint, Trainer keeps it beside the newest ones.
        "--save_total_limit", str(chosen["average_last_checkpoints"] + int("patience" in chosen)),
        "--average_last_checkpoints", str(chosen["average_last_checkpoints"]),
        "--length_penalty", str(chosen["length_penalty"]), "--multi30k_bleu",
        *(["--lowercase"] if chosen["lowercase"] else []),
        *(["--split_punctuation"] if chosen["split_punctuation"] else []), *evaluation_flags(chosen),
        "--per_device_eval_batch_size", "128", "--logging_steps", "25", "--report_to", "none",
        *data_flags(parser, recipe), *precision_flags(recipe.precision, passthrough), *passthrough,
    ]
    model_args, data, recipe_args, args = parse_training_args(flags)
    check_run_can_start(model_args, recipe_args, args)
    results = run(model_args, data, recipe_args, args, callbacks=[WallClock(start)])
    if not args.should_save:  # the other processes of a distributed run: the main one writes the folder
        return results

    folder = Path(args.output_dir)
    held_out = []
    if recipe.test_source_file:
        model = AutoModelForSeq2SeqLM.from_pretrained(folder).to(args.device)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        for source, target in zip(recipe.test_source_file, recipe.test_target_file):
            split = load_parallel_text_files(source, target, "en", "de")
            scores, translations = evaluate_bleu(model, tokenizer, split, data, args.per_device_eval_batch_size,
                                                 multi30k_bleu=True)
            held_out.append({**scores, "dataset_name": f"{source.stem} ({source.name}, {target.name})"})
            (folder / f"{source.stem}_translations.txt").write_text("".join(t + "\n" for t in translations),
                                                                    encoding="utf-8")
        results["held_out"] = held_out
    results["minutes"] = (time.time() - start) / 60
    (folder / "results.json").write_text(json.dumps(results, indent=2, default=str))
    write_run_card(folder, results, languages=[data.source_lang, data.target_lang], license=model_args.license,
                   dataset_name=dataset_description(data), held_out=held_out)
    plot_bleu_curve(folder, results, lowercase=chosen["lowercase"])
    if recipe.record:
        print(f"recorded {record_run(recipe, sys.argv[1:] if argv is None else argv, args, results, measured)}")
    print(json.dumps({"output_dir": str(folder), "minutes": round(results["minutes"], 1),
                      "validation_bleu": results["validation"]["bleu"],
                      "validation_bleu_lowercase": results["validation"]["bleu_lowercase"],
                      "validation_multi30k_bleu": results["validation"]["multi30k_bleu"]["bleu"],
                      "steps": results["train"]["steps"],
                      "bleu_signature": results["validation"]["bleu_signature"],
                      "held_out_bleu": {h["dataset_name"]: h["bleu"] for h in held_out},
                      "held_out_multi30k_bleu": {h["dataset_name"]: h["multi30k_bleu"]["bleu"] for h in held_out}},
                     indent=2))
    return results


def _scores(entry: dict) -> dict:
    return {"sacrebleu": entry["bleu"], "sacrebleu_lowercased": entry["bleu_lowercase"], "chrf": entry["chrf"],
            "multi30k_bleu": entry["multi30k_bleu"]["bleu"]}


def measured_environment(parser) -> dict:
    """The machine and the commit, taken as the run starts (the tree may move on while it trains); a record names a
    commit, so the tree must have no uncommitted change."""
    if str(ROOT) not in sys.path:  # run as a file: the repository's measurement toolkit is beside this folder
        sys.path.insert(0, str(ROOT))
    from scripts.benchmarks.toolkit import environment

    measured = environment(measures=MEASURES)
    if measured["commit"] is None or measured["commit"].endswith("+"):
        parser.error(f"--record names the commit a run measured, but the work tree is at {measured['commit']}: commit "
                     "(or stash) the changes first")
    return measured


def record_run(recipe, argv: list[str], args, results: dict, measured: dict) -> Path:
    """results/multi30k_<recipe>.json: what ran (command, commit and the code it measured, machine, precision), how far
    it got, its scores on every set, and its validation curve (loss and greedy BLEU at each evaluation, against
    updates and minutes), so that a later run, whole or partial, compares at matched updates."""
    folder = Path(args.output_dir)
    state = sorted(folder.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[1]))
    history = json.loads(state[-1].read_text())["log_history"] if state else []
    curve = [{key: entry.get(key) for key in ("step", "minutes", "epoch", "eval_loss", "eval_bleu")}
             for entry in history if "eval_loss" in entry]
    scores = {"validation": _scores(results["validation"])}
    for source, held_out in zip(recipe.test_source_file, results.get("held_out", [])):
        scores[SET_NAMES.get(source.stem, source.stem)] = _scores(held_out)
    train = results["train"]
    record = {"command": " ".join(["python scripts/recipes/multi30k_en_de.py", *argv]),
              "environment": measured, "recipe": recipe.recipe, "seed": args.seed,
              "precision": "bf16 autocast" if args.bf16 else "float32", "updates": train["steps"],
              "epochs": train["epoch"], "stopped_by": "time budget" if train.get("stopped_by_time_budget_at_step")
              else "max_steps or patience", "command_minutes": results["minutes"],
              "train_minutes": train["train_runtime"] / 60, "scores": scores, "curve": curve}
    path = RESULTS / f"multi30k_{recipe.recipe}.json"
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return path


def plot_bleu_curve(folder: Path, results: dict, lowercase: bool = False):
    """validation_bleu.png: the greedy evaluations during training and the final averaged model, against minutes;
    a model that writes lowercase is drawn in lowercased BLEU (its cased figure counts capitals it never writes)."""
    from vanilla_transformer.tools.plots import plot_bleu_over_time

    state = sorted(folder.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[1]))
    history = json.loads(state[-1].read_text())["log_history"] if state else []
    points = [(entry["minutes"], entry["eval_bleu"]) for entry in history if "eval_bleu" in entry and "minutes" in entry]
    plot_bleu_over_time(points, folder / "validation_bleu.png",
                        title="Multi30k en→de, validation sacreBLEU" + (", lowercased" if lowercase else ""),
                        final=(results["minutes"], results["validation"]["bleu_lowercase" if lowercase else "bleu"]))


if __name__ == "__main__":
    main()
