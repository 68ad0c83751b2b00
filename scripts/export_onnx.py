#!/usr/bin/env python
"""Export a saved model to ONNX in the layout transformers.js loads (needs `pip install ".[onnx]"`).

    python scripts/export_onnx.py --model demo_output/model --output_dir demo_output/onnx --quantize int8
    echo "I carry the blue pigs" | python scripts/translate.py --engine onnxruntime --model demo_output/onnx

The folder: onnx/encoder_model.onnx, onnx/decoder_model_merged.onnx (and their _quantized twins with --quantize int8),
config.json, generation_config.json and the tokenizer; transformers.js reads it with pipeline('translation', DIR).
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from vanilla_transformer.tools.exports import ExportCommand  # noqa: E402
from vanilla_transformer.tools.onnx import export_onnx  # noqa: E402
from vanilla_transformer.tools.onnx.runtime import QUANTIZATIONS  # noqa: E402


def main(argv=None):
    command = ExportCommand(__doc__, output_help="A new folder for the ONNX export.",
                            verify_help="skip the check that the float32 graphs give the model's encoder states and "
                                        "logits at every step (within 1e-4) before the folder is written")
    command.add_argument("--quantize", default=None, help="int8: also write int8 graphs (dynamic quantization)")
    args = command.parse_args(argv)
    if args.quantize not in QUANTIZATIONS:
        command.error(f"--quantize {args.quantize}: choose int8 (or leave it out for float32 only)")
    command.write(export_onnx, args.model, args.output_dir, quantize=args.quantize, verify=not args.no_verify,
                  languages=args.languages)


if __name__ == "__main__":
    main()
