#!/usr/bin/env python
"""Export a saved model to CTranslate2, for fast CPU/GPU inference (needs `pip install ctranslate2`).

    python scripts/export_ctranslate2.py --model demo_output/model --output_dir demo_output/ct2-int8 --quantization int8
    echo "I carry the blue pigs" | python scripts/translate.py --engine ctranslate2 --model demo_output/ct2-int8
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from vanilla_transformer.tools.ctranslate2 import export_ctranslate2  # noqa: E402
from vanilla_transformer.tools.exports import ExportCommand  # noqa: E402


def main(argv=None):
    command = ExportCommand(__doc__, output_help="A new folder for the CTranslate2 model.",
                            verify_help="skip the check that the float32 export scores a fixed random batch like the "
                                        "model (within 1e-4) before the folder is written")
    command.add_argument("--quantization", default=None, help="int8 | int8_float16 | float16 | ... (default: float32)")
    command.add_argument("--max_positions", type=int, default=1024, help="Longest input or output, in tokens.")
    args = command.parse_args(argv)
    if args.max_positions < 3:
        command.error(f"--max_positions must be at least 3, got {args.max_positions}")
    command.write(export_ctranslate2, args.model, args.output_dir, quantization=args.quantization,
                  max_positions=args.max_positions, verify=not args.no_verify,
                  languages=args.languages)


if __name__ == "__main__":
    main()
