#!/usr/bin/env python
"""The paper's WMT14 English→German runs end to end (§5, §6.1): one command per model.

    accelerate launch scripts/recipes/wmt14_en_de.py --model base                # data from the Hub (wmt/wmt14 de-en)
    accelerate launch scripts/recipes/wmt14_en_de.py --model base --dataset_name /data/wmt14  # a local copy of it
    accelerate launch scripts/recipes/wmt14_en_de.py --model big --data_dir /data/wmt14   # or local text files
    python scripts/recipes/wmt14_en_de.py --model base --scale tiny              # the same pipeline, minutes on a CPU
    python scripts/recipes/wmt14_en_de.py --cost_table --step_times device_check.json   # what the full runs cost

Stages, each the paper's:
1. data: WMT14 train, newstest2013 (validation), newstest2014 (test), read into memory-mapped Arrow and tokenized once
   into datasets' cache, which the next run (and every other process of this one) reads back;
2. one shared BPE vocabulary of 37,000 tokens (§5.1), trained once into --tokenizer_dir and reused by every run;
3. batches of about 25,000 source + 25,000 target tokens per optimizer step (§5.1), whatever the number of processes:
   the per-device budget and gradient accumulation are planned from the data's lengths and logged;
4. Adam (0.9, 0.98, 1e-9) with the Noam schedule, warmup 4000 (§5.3); dropout 0.1 (base) / 0.3 (big), label
   smoothing 0.1 (§5.4); 100k / 300k steps, a checkpoint every 1,250 / 600 steps (about the paper's "10-minute
   intervals" at its own speed: 12 h for 100k base steps, 3.5 days for 300k big ones);
5. the final model averages the last 5 (base) / 20 (big) checkpoints (§6.1);
6. newstest2014 decoded with beam 4, α 0.6, at most source length + 50 tokens (§6.1), scored with sacreBLEU (with its
   signature) and with the paper's tokenized BLEU (`metrics.paper_bleu`), side by side in results.json and the card.

`--scale tiny` runs every stage on this machine's data instead: Multi30k from ../shared/data/multi30k/ (its val set
halved into validation and test, written beside the output folder) or, where that is absent, the package's built-in task; a tiny model, 2,000
tokens per step, 600 steps and a checkpoint every 10. Every flag the recipe does not know goes to scripts/train.py
(all of Seq2SeqTrainingArguments: --bf16, --torch_compile, --dataloader_num_workers, --resume_from_checkpoint, ...)
and wins over the recipe's own value, except that the planned batch (--tokens_per_step) cannot be combined with
--max_tokens_per_batch or --gradient_accumulation_steps.

Under accelerate the main process alone downloads the data and trains the vocabulary while the others wait, so
the process group waits up to max(--ddp_timeout, 2 h) instead of torch's default. The main process also reads and
tokenizes the data first (scripts/train.py's `run()`); the others then read the cache it wrote.
"""

import argparse
import json
from datetime import timedelta
from pathlib import Path

from accelerate import PartialState
from vanilla_transformer.data.corpora import sentence_batches
from vanilla_transformer.data.tokenization import train_shared_tokenizer
from vanilla_transformer.training import check_run_can_start, load_raw_splits, parse_training_args, run

ROOT = Path(__file__).resolve().parents[2]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"

# Steps, checkpoint interval and how many checkpoints to average, per model (§5.2, §6.1). Dropout is the preset's.
# The paper wrote a checkpoint every 10 minutes: 1,389 of its base steps (100k in 12 h) and 595 big ones (300k in
# 3.5 days); 1,250 and 600 are the nearest intervals that divide the runs, so the averaged ones are evenly spaced.
PAPER = {"base": dict(preset="base", max_steps=100_000, save_steps=1_250, average=5, eval_steps=10_000),
         "big": dict(preset="big", max_steps=300_000, save_steps=600, average=20, eval_steps=30_000)}
PAPER_TRAINING = dict(tokens_per_step=25_000, vocab_size=37_000, warmup=4_000, noam_factor=1.0, max_length=256)
# The same stages sized for a CPU: every stage runs, nothing is skipped. The Noam curve peaks at
# d_model^-0.5 * warmup^-0.5, which for a 64-wide model and a short warmup is ten times the base model's peak:
# it is scaled down to about the paper's rate.
TINY = dict(preset="tiny", max_steps=600, save_steps=10, eval_steps=600, tokens_per_step=2_000, vocab_size=4_000,
            warmup=100, noam_factor=0.2, max_length=64)


def recipe_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(PAPER), default="base")
    parser.add_argument("--scale", choices=("paper", "tiny"), default="paper")
    parser.add_argument("--output_dir", type=Path, help="default: runs/wmt14_en_de_<model>[_tiny]")
    parser.add_argument("--dataset_name", default="wmt/wmt14", help="the dataset on the Hub, or a local folder laid "
                        "out like its repository (parquet files under de-en/, configs in README.md)")
    parser.add_argument("--dataset_config_name", default="de-en")
    parser.add_argument("--data_dir", type=Path, help="instead of --dataset_name: local line-aligned text files "
                        "train.{en,de}, newstest2013.{en,de}, newstest2014.{en,de}")
    parser.add_argument("--tokenizer_dir", type=Path,
                        help="the shared BPE vocabulary, trained here if absent; default: runs/wmt14_en_de_bpe<size>")
    parser.add_argument("--cost_table", action="store_true", help="print the projected cost of the full runs, exit")
    parser.add_argument("--step_times", type=Path,
                        help="with --cost_table: the device_check.json of a GPU check (scripts/device_check.sh)")
    return parser


def data_flags(recipe, output_dir: Path) -> list[str]:
    """train.py's data flags: WMT14 (a dataset by name, or local files) at paper scale; Multi30k or the built-in task
    tiny.
    Writes nothing: the input files are checked here, and the Multi30k halves are written by `write_val_halves`."""
    if recipe.scale == "tiny":
        if not (MULTI30K / "train.en").is_file():
            return ["--dataset_name", "builtin", "--max_train_samples", "20000", "--max_eval_samples", "200"]
        folder = val_halves_folder(output_dir)
        inputs = {"train": MULTI30K / "train", "val": MULTI30K / "val"}
        files = {"train": MULTI30K / "train", "validation": folder / "validation", "test": folder / "test"}
        where = f"--scale tiny reads Multi30k from {MULTI30K}, which needs train and val"
    elif recipe.data_dir is None:
        return ["--dataset_name", recipe.dataset_name, "--dataset_config_name", recipe.dataset_config_name]
    else:
        files = inputs = {"train": recipe.data_dir / "train", "validation": recipe.data_dir / "newstest2013",
                          "test": recipe.data_dir / "newstest2014"}
        where = f"--data_dir {recipe.data_dir} needs train, newstest2013 and newstest2014"
    for stem in inputs.values():
        for lang in ("en", "de"):
            if not Path(f"{stem}.{lang}").is_file():
                raise FileNotFoundError(f"{stem}.{lang} is missing: {where}, each as .en and .de line-aligned "
                                        "text files.")
    return [flag for split, stem in files.items()
            for side, lang in (("source", "en"), ("target", "de")) for flag in (f"--{split}_{side}_file", f"{stem}.{lang}")]


def val_halves_folder(output_dir: Path) -> Path:
    """Multi30k has no test split here: its val set, halved, is validation and test. Written beside the run
    folder (never into the repository: the data is for research use only)."""
    return output_dir.parent / "multi30k_val_halves"


def write_val_halves(output_dir: Path):
    folder = val_halves_folder(output_dir)
    if PartialState().is_main_process:
        folder.mkdir(parents=True, exist_ok=True)
        for lang in ("en", "de"):
            lines = (MULTI30K / f"val.{lang}").read_text(encoding="utf-8").splitlines()
            half = len(lines) // 2
            (folder / f"validation.{lang}").write_text("\n".join(lines[:half]) + "\n", encoding="utf-8")
            (folder / f"test.{lang}").write_text("\n".join(lines[half:]) + "\n", encoding="utf-8")
    PartialState().wait_for_everyone()


def shared_vocabulary(tokenizer_dir: Path, data, vocab_size: int, max_length: int) -> Path:
    """§5.1's shared source-target BPE: trained once (by the main process) from the training split, then reused."""
    state = PartialState()
    with state.main_process_first():
        if state.is_main_process and not (tokenizer_dir / "tokenizer.json").is_file():
            train = load_raw_splits(data)["train"]
            train_shared_tokenizer(sentence_batches(train, ("en", "de")), vocab_size=vocab_size,
                                   model_max_length=max_length, num_texts=2 * len(train)).save_pretrained(tokenizer_dir)
    return tokenizer_dir


def training_flags(recipe, paper: dict, scale: dict, output_dir: Path, tokenizer_dir: Path) -> list[str]:
    tiny = recipe.scale == "tiny"
    return [
        "--output_dir", str(output_dir), "--preset", scale["preset"] if tiny else paper["preset"],
        "--tokenizer_name_or_path", str(tokenizer_dir), "--source_lang", "en", "--target_lang", "de",
        "--max_source_length", str(scale["max_length"]), "--max_target_length", str(scale["max_length"]),
        "--tokens_per_step", str(scale["tokens_per_step"]), "--noam_warmup_steps", str(scale["warmup"]),
        "--noam_factor", str(scale["noam_factor"]),
        "--label_smoothing", "0.1", "--max_steps", str(scale["max_steps"] if tiny else paper["max_steps"]),
        "--save_strategy", "steps", "--save_steps", str(scale["save_steps"] if tiny else paper["save_steps"]),
        "--save_total_limit", str(paper["average"]), "--average_last_checkpoints", str(paper["average"]),
        "--eval_strategy", "steps", "--eval_steps", str(scale["eval_steps"] if tiny else paper["eval_steps"]),
        "--per_device_eval_batch_size", "64", "--paper_bleu", "--logging_steps", "10" if tiny else "100", "--report_to", "none" if tiny else "tensorboard",
    ]


def start_processes(passthrough: list[str]) -> PartialState:
    """accelerate's process group, created before anything waits on it, with a timeout that outlasts the main
    process' data download and vocabulary training."""
    timeout = argparse.ArgumentParser(add_help=False)
    timeout.add_argument("--ddp_timeout", type=int, default=1800)
    seconds = max(timeout.parse_known_args(passthrough)[0].ddp_timeout, 7200)
    return PartialState(timeout=timedelta(seconds=seconds))


def main(argv=None) -> dict | None:
    parser = recipe_parser()
    recipe, passthrough = parser.parse_known_args(argv)
    if recipe.cost_table:
        if recipe.step_times is None or not recipe.step_times.is_file():
            parser.error(f"--cost_table needs --step_times REPORT, the device_check.json of scripts/device_check.sh "
                         f"run on a GPU; got {recipe.step_times}" + ("" if recipe.step_times is None else
                                                                     ": no such file"))
        from vanilla_transformer.training.cost_model import cost_table

        print(cost_table(json.loads(recipe.step_times.read_text()), recipe.step_times))
        return None
    if recipe.scale == "tiny" and recipe.data_dir is not None:
        parser.error(f"--data_dir {recipe.data_dir} is for --scale paper: --scale tiny reads Multi30k from {MULTI30K} "
                     "(or the built-in task)")
    start_processes(passthrough)
    paper = PAPER[recipe.model]
    scale = TINY if recipe.scale == "tiny" else {**PAPER_TRAINING, **paper}
    suffix = "_tiny" if recipe.scale == "tiny" else ""
    output_dir = recipe.output_dir or ROOT / "runs" / f"wmt14_en_de_{recipe.model}{suffix}"
    data = data_flags(recipe, output_dir)
    tokenizer_dir = recipe.tokenizer_dir or ROOT / "runs" / f"wmt14_en_de{suffix}_bpe{scale['vocab_size']}"
    parsed = parse_training_args([*training_flags(recipe, paper, scale, output_dir, tokenizer_dir), *data, *passthrough])
    check_run_can_start(parsed[0], parsed[2], parsed[3])  # before the vocabulary or the data halves are written
    if recipe.scale == "tiny" and "--dataset_name" not in data:
        write_val_halves(output_dir)
    shared_vocabulary(tokenizer_dir, parsed[1], scale["vocab_size"], scale["max_length"])
    results = run(*parsed)
    if PartialState().is_main_process:
        test = results.get("test", {})
        print(json.dumps({"model": recipe.model, "scale": recipe.scale, "output_dir": str(output_dir),
                          "averaged_checkpoints": results.get("averaged_checkpoints"),
                          "batch_plan": results["train"].get("batch_plan"),
                          "sacrebleu": test.get("bleu"), "sacrebleu_signature": test.get("bleu_signature"),
                          "paper_bleu": test.get("paper_bleu", {}).get("bleu")}, indent=2))
    return results


if __name__ == "__main__":
    main()
