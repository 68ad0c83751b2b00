#!/usr/bin/env python
"""Train our Transformer and a MarianMTModel of the same shape the same way on Multi30k en->de; compare BLEU.

    python scripts/quality_parity.py --max_steps 1000 --max_tokens_per_batch 1000      # writes scripts/results/parity_*
    python scripts/quality_parity.py --preset tiny --max_steps 50 --output_dir /tmp/p   # a quick smoke run

Skips (exit status 0, with the reason) where ../shared/data/multi30k is absent. See vanilla_transformer/parity.py.
"""

import os
import shlex
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is built locally

from transformers import HfArgumentParser  # noqa: E402

from vanilla_transformer.parity import ParitySettings, multi30k_missing, run_parity, write_report  # noqa: E402


def main(argv=None):
    (settings,) = HfArgumentParser(ParitySettings).parse_args_into_dataclasses(argv)
    reason = multi30k_missing(settings.data_dir)
    if reason:
        print(f"skipped: {reason}")
        return None
    results = run_parity(settings)
    command = shlex.join(["python", "scripts/quality_parity.py", *(sys.argv[1:] if argv is None else argv)])
    paths = write_report(results, settings.output_dir, command)
    runs = results["runs"]
    print(f"BLEU ours {runs['ours']['bleu']:.2f}, Marian {runs['marian']['bleu']:.2f}, gap {results['bleu_gap']:+.2f}; "
          f"wall {results['wall_seconds'] / 60:.1f} min; report: {paths['md']}")
    return results


if __name__ == "__main__":
    main()
