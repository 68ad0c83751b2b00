"""Convert a local MarianMTModel folder (an OPUS-MT checkpoint) into a vanilla_transformer folder with the same
outputs; the Marian tokenizer files are copied along.

    python scripts/convert_marian_to_vanilla.py --marian_dir opus-mt-en-de --output_dir opus-mt-en-de-vanilla
"""

import argparse
from pathlib import Path

from vanilla_transformer.tools.folders import check_output_dir
from vanilla_transformer.tools.marian import convert_marian


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--marian_dir", required=True, help="a folder saved by MarianMTModel.save_pretrained")
    parser.add_argument("--output_dir", required=True, help="a new (or empty) folder for the converted model")
    parser.add_argument("--allow_pickle", action="store_true",
                        help="also read pytorch_model.bin (torch.load with weights_only=True) when there is no "
                             "model.safetensors; off by default")
    parser.add_argument("--no_verify", action="store_true",
                        help="skip the check that the converted model gives Marian's logits on a fixed random "
                             "batch (within 1e-4) before anything is written")
    args = parser.parse_args(argv)
    try:  # refused before anything is read or written, naming the flag
        check_output_dir(args.output_dir)
    except ValueError as error:
        parser.error(f"--output_dir {error}")
    if not Path(args.marian_dir).is_dir():
        parser.error(f"--marian_dir {args.marian_dir}: no such folder")
    try:
        model = convert_marian(args.marian_dir, args.output_dir, allow_pickle=args.allow_pickle,
                               verify=not args.no_verify)
    except ValueError as error:  # what the model cannot represent, or a failed verification: nothing was written
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    print(f"Converted {args.marian_dir} ({model.num_parameters():,} parameters) into {args.output_dir}")


if __name__ == "__main__":
    main()
