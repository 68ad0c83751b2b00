#!/usr/bin/env python
"""Translate a file (or stdin) with a saved model, in batches sorted by length; output keeps the input order.

    python scripts/translate.py --model demo_output/model --input sentences.en --output sentences.de
    echo "I see twenty-one red apples" | python scripts/translate.py --model demo_output/model
    echo "I carry the blue pigs" | python scripts/translate.py --model demo_output/model --attention_map attention.png
    python scripts/translate.py --model demo_output/ct2-int8 --input sentences.en      # an export: its own engine
    python scripts/translate.py --model demo_output/onnx --quantized int8 --input sentences.en
    python scripts/translate.py --model demo_output/model --split_sentences --input page.en   # lines of paragraphs
"""

import argparse
import sys
from pathlib import Path

import torch

import vanilla_transformer  # noqa: F401  registers the model with the Auto classes
from vanilla_transformer.tools.engines import ENGINES, load_translator
from vanilla_transformer.tools.exports import describe_folder
from vanilla_transformer.tools.sentences import split_text
from vanilla_transformer.tools.translation import InputTooLong, cross_attention


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="A folder saved by scripts/train.py (or a Hub id), or with "
                                                        "--engine ctranslate2 one written by scripts/export_ctranslate2.py, "
                                                        "with --engine onnxruntime by scripts/export_onnx.py.")
    parser.add_argument("--engine", choices=ENGINES, default=None,
                        help="Default: what the folder is (an export's own engine, else transformers' generate()).")
    parser.add_argument("--quantized", choices=("int8",), default=None,
                        help="--engine onnxruntime: run the export's int8 graphs (default: float32)")
    parser.add_argument("--compute_type", default=None,
                        help="--engine ctranslate2: the type it computes in (default: the fastest, measured here at "
                             "start; 'default' is the type the export was written in)")
    parser.add_argument("--input", default="-", help="One sentence per line; '-' reads stdin.")
    parser.add_argument("--split_sentences", action="store_true",
                        help="Each line is a text (a paragraph, say): translate it sentence by sentence and keep it "
                             "one line (needs pysbd).")
    parser.add_argument("--source_language", default=None,
                        help="--split_sentences: the language whose sentence rules apply (default: the folder's "
                             "source language, else en).")
    parser.add_argument("--output", default="-", help="'-' writes stdout.")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--num_beams", type=int, default=None, help="Default: the model's generation config (4).")
    parser.add_argument("--max_new_tokens", type=int, default=None,
                        help="Default: source length + 50 (§6.1), from the generation config.")
    parser.add_argument("--max_source_length", type=int, default=None,
                        help="Refuse (naming the line) an input of more tokens than this; default: no limit, "
                             "or an export's positions.")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--attention_map", default=None,
                        help="Also draw the encoder-decoder attention of the first sentence into this PNG.")
    args = parser.parse_args(argv)
    for flag in ("batch_size", "num_beams", "max_new_tokens", "max_source_length"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    if args.input != "-" and not Path(args.input).is_file():
        parser.error(f"--input {args.input}: no such file")
    described = describe_folder(args.model) if Path(args.model).is_dir() else {"engine": "transformers",
                                                                                "languages": None}
    if args.engine is None:
        args.engine = described["engine"]
    if args.compute_type is not None and args.engine != "ctranslate2":
        parser.error(f"--compute_type {args.compute_type} is for --engine ctranslate2, not {args.engine}")
    compute_type = (args.compute_type or "fastest") if args.engine == "ctranslate2" else "default"
    if args.engine != "transformers" and args.attention_map:
        parser.error("--attention_map needs the transformers engine (the model's own attention weights).")
    if args.quantized and args.engine != "onnxruntime":
        parser.error(f"--quantized {args.quantized} is for --engine onnxruntime (CTranslate2 exports are quantized "
                     "when written)")

    source = sys.stdin if args.input == "-" else open(args.input, encoding="utf-8")
    with source:
        lines = [line.rstrip("\r\n") for line in source]
    # Each line is one text: its sentences with --split_sentences, else the line itself; a blank line stays blank.
    language = args.source_language or (described["languages"] or ["en"])[0]
    splits = [split_text(line, language) if args.split_sentences else None for line in lines]
    texts, owners = [], []
    for i, (line, split) in enumerate(zip(lines, splits)):
        for k, sentence in enumerate(split.sentences if split else [line] if line.strip() else []):
            texts.append(sentence)
            owners.append(f"--input line {i + 1}" + (f", sentence {k + 1}," if split else ""))
    indices = [i for i, line in enumerate(lines) if line.strip()]
    translator = load_translator(args.engine, args.model, device=args.device, quantized=args.quantized,
                                 compute_type=compute_type)
    try:
        translations = translator.translate(texts, batch_size=args.batch_size, num_beams=args.num_beams,
                                            max_new_tokens=args.max_new_tokens,
                                            max_source_length=args.max_source_length, progress=args.output != "-")
    except InputTooLong as error:
        parser.exit(1, f"{parser.prog}: error: {error.describe(owners[error.index])}\n")
    if args.attention_map and indices:
        from vanilla_transformer.tools.plots import plot_cross_attention

        generate_kwargs = {k: v for k, v in (("num_beams", args.num_beams), ("max_new_tokens", args.max_new_tokens))
                           if v is not None}
        attention = cross_attention(translator.model, translator.tokenizer, lines[indices[0]], **generate_kwargs)
        plot_cross_attention(attention, args.attention_map)
    output, start = [""] * len(lines), 0
    for i, (line, split) in enumerate(zip(lines, splits)):
        count = len(split.sentences) if split else int(bool(line.strip()))
        output[i] = split.join(translations[start:start + count]) if split else "".join(translations[start:start + count])
        start += count
    target = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")
    with target:
        target.writelines(line + "\n" for line in output)


if __name__ == "__main__":
    main()
