#!/usr/bin/env python
"""BLEU of one saved model under the paper's GNMT length penalty and under transformers' |Y|^alpha.

    python -m scripts.benchmarks.compare_beam_scoring --model demo_output/model   # built-in test split
    python -m scripts.benchmarks.compare_beam_scoring --model runs/multi30k \
        --source_file ../shared/data/multi30k/val.en --target_file ../shared/data/multi30k/val.de
"""

import argparse
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import AutoModelForSeq2SeqLM, AutoTokenizer  # noqa: E402

from vanilla_transformer.data.corpora import load_parallel_text_files  # noqa: E402
from vanilla_transformer.training import DataArguments, evaluate_bleu, load_raw_splits  # noqa: E402
from .toolkit import markdown_table  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--source_file")
    parser.add_argument("--target_file")
    parser.add_argument("--source_lang", default="en")
    parser.add_argument("--target_lang", default="de")
    parser.add_argument("--batch_size", type=int, default=64)
    args = parser.parse_args(argv)

    data = DataArguments(source_lang=args.source_lang, target_lang=args.target_lang, num_examples=0)
    if args.source_file:
        sentences = load_parallel_text_files(args.source_file, args.target_file, args.source_lang, args.target_lang)
    else:
        sentences = load_raw_splits(data)["test"]
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    rows, outputs = [], {}
    for penalty in ("gnmt", "hf"):
        scores, hypotheses = evaluate_bleu(model, tokenizer, sentences, data, args.batch_size,
                                           length_penalty_type=penalty)
        outputs[penalty] = hypotheses
        words = sum(len(h.split()) for h in hypotheses) / len(hypotheses)
        rows.append((penalty, scores["bleu"], scores["chrf"], words))
    changed = sum(a != b for a, b in zip(outputs["gnmt"], outputs["hf"]))
    print("\n".join(markdown_table(["length penalty", "BLEU", "chrF", "words per output"],
                                   [[penalty, f"{bleu:.2f}", f"{chrf:.2f}", f"{words:.2f}"]
                                    for penalty, bleu, chrf, words in rows])))
    print(f"\n{changed} of {len(sentences)} translations differ between the two scorings.")
    print(json.dumps({"rows": rows, "changed": changed, "sentences": len(sentences), "signature": scores["bleu_signature"]}))


if __name__ == "__main__":
    main()
