#!/usr/bin/env python
"""Export a saved model to ONNX in the layout transformers.js loads (needs `pip install ".[onnx]"`).

    python scripts/export_onnx.py --model demo_output/model --output_dir demo_output/onnx --quantize int8
    echo "I carry the blue pigs" | python scripts/translate.py --engine onnxruntime --model demo_output/onnx

The folder: onnx/encoder_model.onnx, onnx/decoder_model_merged.onnx (and their _int8 twins with --quantize int8),
config.json, generation_config.json and the tokenizer; transformers.js reads it with pipeline('translation', DIR).
"""

import argparse
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from vanilla_transformer.tools.folders import check_output_dir  # noqa: E402
from vanilla_transformer.tools.onnx import export_onnx  # noqa: E402
from vanilla_transformer.tools.onnx.runtime import QUANTIZATIONS  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="A folder saved by scripts/train.py (model and tokenizer).")
    parser.add_argument("--output_dir", required=True, help="A new folder for the ONNX export.")
    parser.add_argument("--quantize", default=None, help="int8: also write int8 graphs (dynamic quantization)")
    parser.add_argument("--no_verify", action="store_true",
                        help="skip the check that the float32 graphs give the model's encoder states and logits at "
                             "every step (within 1e-4) before the folder is written")
    args = parser.parse_args(argv)
    # Refused before anything is loaded or written, naming the flag.
    if not (Path(args.model) / "config.json").is_file():
        parser.error(f"--model {args.model}: not a saved model folder (no config.json there)")
    try:
        check_output_dir(args.output_dir)
    except ValueError as error:
        parser.error(f"--output_dir {error}")
    if args.quantize not in QUANTIZATIONS:
        parser.error(f"--quantize {args.quantize}: choose int8 (or leave it out for float32 only)")
    try:
        folder = export_onnx(args.model, args.output_dir, quantize=args.quantize, verify=not args.no_verify)
    except ValueError as error:  # what the export cannot express, or a failed verification: nothing was written
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    print(f"wrote {folder}")


if __name__ == "__main__":
    main()
