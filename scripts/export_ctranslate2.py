#!/usr/bin/env python
"""Export a saved model to CTranslate2, for fast CPU/GPU inference (needs `pip install ctranslate2`).

    python scripts/export_ctranslate2.py --model demo_output/model --output_dir demo_output/ct2-int8 --quantization int8
    echo "I carry the blue pigs" | python scripts/translate.py --engine ctranslate2 --model demo_output/ct2-int8
"""

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from vanilla_transformer.export import export_ctranslate2  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="A folder saved by scripts/train.py (model and tokenizer).")
    parser.add_argument("--output_dir", required=True, help="A new folder for the CTranslate2 model.")
    parser.add_argument("--quantization", default=None, help="int8 | int8_float16 | float16 | ... (default: float32)")
    parser.add_argument("--max_positions", type=int, default=1024, help="Longest input or output, in tokens.")
    args = parser.parse_args(argv)
    folder = export_ctranslate2(args.model, args.output_dir, quantization=args.quantization,
                                max_positions=args.max_positions)
    print(f"wrote {folder}")


if __name__ == "__main__":
    main()
