#!/usr/bin/env python
"""The main job, end to end on the built-in English→German task (no download):

train (paper recipe) → BLEU on the test split with beam search → translate examples → save a Hub-ready
folder → reload it with AutoModelForSeq2SeqLM / AutoTokenizer and check the reloaded model translates the
same → learning-rate and loss plot next to the model.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import AutoModelForSeq2SeqLM, AutoTokenizer  # noqa: E402

from vanilla_transformer.training import load_raw_splits, parse_training_args, run  # noqa: E402
from vanilla_transformer.tools.plots import plot_cross_attention  # noqa: E402
from vanilla_transformer.tools.translation import cross_attention, translate  # noqa: E402

# Sized to finish in under 10 minutes on 2 CPU cores (see README for the measured time and BLEU).
DEMO_ARGS = [
    "--preset", "small", "--config_overrides", "d_model=128,encoder_ffn_dim=512,decoder_ffn_dim=512",
    "--vocab_size", "1000", "--per_device_train_batch_size", "64", "--per_device_eval_batch_size", "100",
    "--noam_warmup_steps", "400", "--eval_strategy", "no", "--save_strategy", "no",
    "--logging_steps", "25", "--report_to", "none", "--max_source_length", "64", "--max_target_length", "64",
]
RELOAD_CHECK_SENTENCES = 100
ATTENTION_EXAMPLE = "today the old horse washes the green chairs"  # German moves the verb: the map shows it


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="demo_output")
    parser.add_argument("--max_steps", type=int, default=1500)
    parser.add_argument("--max_eval_samples", type=int, default=None, help="Test sentences to score (all: 1000).")
    parser.add_argument("--max_train_samples", type=int, default=None)
    args = parser.parse_args(argv)

    model_dir = Path(args.output_dir, "model")
    if model_dir.exists() and any(model_dir.iterdir()):
        sys.exit(f"{model_dir} exists and is not empty: choose another --output_dir or remove it first.")
    train_args = DEMO_ARGS + ["--output_dir", str(model_dir), "--max_steps", str(args.max_steps)]
    for flag in ("max_eval_samples", "max_train_samples"):
        if getattr(args, flag) is not None:
            train_args += [f"--{flag}", str(getattr(args, flag))]
    parsed = parse_training_args(train_args)

    start = time.time()
    results = run(*parsed)
    test = results["test"]

    # The saved folder must stand on its own: reload it through the Auto classes and translate again.
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    sources = [pair["en"] for pair in load_raw_splits(parsed[1])["test"]["translation"]][:RELOAD_CHECK_SENTENCES]
    in_memory = (model_dir / "test_translations.txt").read_text(encoding="utf-8").splitlines()[: len(sources)]
    again = translate(reloaded, tokenizer, sources, batch_size=100)
    same = sum(a == b for a, b in zip(again, in_memory))
    attention_map = model_dir / "attention_map.png"
    plot_cross_attention(cross_attention(reloaded, tokenizer, ATTENTION_EXAMPLE), attention_map)
    elapsed = time.time() - start

    print("\n" + "=" * 80)
    print(f"BLEU on the built-in test split ({test['num_sentences']} sentences, beam 4): {test['bleu']:.2f}"
          f"   chrF: {test['chrf']:.2f}")
    print(f"sacreBLEU signature: {test['bleu_signature']}")
    for example in test["examples"]:
        print(f"  EN  {example['source']}\n  DE  {example['translation']}\n  REF {example['reference']}\n")
    print(f"Reloaded with AutoModelForSeq2SeqLM: {same}/{len(sources)} translations identical to the trained model.")
    print(f"Hub-ready folder: {model_dir}  (plots: {model_dir / 'training_curves.png'}, {attention_map})")
    print(f"Total time: {elapsed / 60:.1f} min")
    summary = {"bleu": test["bleu"], "chrf": test["chrf"], "signature": test["bleu_signature"],
               "reload_identical": f"{same}/{len(sources)}", "minutes": round(elapsed / 60, 2),
               "max_steps": args.max_steps}
    Path(args.output_dir, "demo_summary.json").write_text(json.dumps(summary, indent=2))
    if same != len(sources):
        sys.exit("The reloaded model translates differently from the trained one.")


if __name__ == "__main__":
    main()
