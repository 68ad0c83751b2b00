"""Convert a local MarianMTModel folder (an OPUS-MT checkpoint) into a vanilla_transformer folder with the same
outputs; the Marian tokenizer files are copied along.

    python scripts/convert_marian_to_vanilla.py --marian_dir opus-mt-en-de --output_dir opus-mt-en-de-vanilla
"""

import argparse

from vanilla_transformer.conversion import convert_marian


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--marian_dir", required=True, help="a folder saved by MarianMTModel.save_pretrained")
    parser.add_argument("--output_dir", required=True, help="a new (or empty) folder for the converted model")
    parser.add_argument("--allow_pickle", action="store_true",
                        help="also read pytorch_model.bin (torch.load with weights_only=True) when there is no "
                             "model.safetensors; off by default")
    args = parser.parse_args(argv)
    model = convert_marian(args.marian_dir, args.output_dir, allow_pickle=args.allow_pickle)
    print(f"Converted {args.marian_dir} ({model.num_parameters():,} parameters) into {args.output_dir}")


if __name__ == "__main__":
    main()
