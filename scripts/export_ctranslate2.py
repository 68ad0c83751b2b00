#!/usr/bin/env python
"""Export a saved model to CTranslate2, for fast CPU/GPU inference (needs `pip install ctranslate2`).

    python scripts/export_ctranslate2.py --model demo_output/model --output_dir demo_output/ct2-int8 --quantization int8
    echo "I carry the blue pigs" | python scripts/translate.py --engine ctranslate2 --model demo_output/ct2-int8
"""

import argparse
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from vanilla_transformer.tools.ctranslate2 import export_ctranslate2  # noqa: E402
from vanilla_transformer.tools.folders import check_output_dir  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="A folder saved by scripts/train.py (model and tokenizer).")
    parser.add_argument("--output_dir", required=True, help="A new folder for the CTranslate2 model.")
    parser.add_argument("--quantization", default=None, help="int8 | int8_float16 | float16 | ... (default: float32)")
    parser.add_argument("--max_positions", type=int, default=1024, help="Longest input or output, in tokens.")
    parser.add_argument("--no_verify", action="store_true",
                        help="skip the check that the float32 export scores a fixed random batch like the model "
                             "(within 1e-4) before the folder is written")
    args = parser.parse_args(argv)
    # Refused before anything is loaded or written, naming the flag.
    if not (Path(args.model) / "config.json").is_file():
        parser.error(f"--model {args.model}: not a saved model folder (no config.json there)")
    try:
        check_output_dir(args.output_dir)
    except ValueError as error:
        parser.error(f"--output_dir {error}")
    if args.max_positions < 3:
        parser.error(f"--max_positions must be at least 3, got {args.max_positions}")
    try:
        folder = export_ctranslate2(args.model, args.output_dir, quantization=args.quantization,
                                    max_positions=args.max_positions, verify=not args.no_verify)
    except ValueError as error:  # what CTranslate2 cannot express, or a failed verification: nothing was written
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    print(f"wrote {folder}")


if __name__ == "__main__":
    main()
