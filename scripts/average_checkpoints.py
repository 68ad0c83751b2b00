"""Average checkpoints into one model (§6.1: the last 5 for the base model, the last 20 for the big one).

    python scripts/average_checkpoints.py --run_dir runs/base --last 5 --output_dir runs/base/averaged
    python scripts/average_checkpoints.py --checkpoints ckpt-a ckpt-b ckpt-c --output_dir averaged
"""

import argparse

from vanilla_transformer.training.checkpoints import average_checkpoints, last_checkpoints


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run_dir", help="a Trainer output directory holding checkpoint-<step> folders")
    source.add_argument("--checkpoints", nargs="+", help="explicit checkpoint folders, oldest first")
    parser.add_argument("--last", type=int, default=5, help="with --run_dir: how many of the latest to average")
    parser.add_argument("--output_dir", required=True, help="a new (or empty) folder for the averaged model")
    args = parser.parse_args(argv)

    folders = last_checkpoints(args.run_dir, args.last) if args.run_dir else args.checkpoints
    output_dir = average_checkpoints(folders, args.output_dir)
    print(f"Averaged {len(folders)} checkpoints ({', '.join(str(f) for f in folders)}) into {output_dir}")


if __name__ == "__main__":
    main()
