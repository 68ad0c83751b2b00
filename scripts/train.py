#!/usr/bin/env python
"""Train the paper's Transformer on a parallel corpus with `PaperTrainer`: Seq2SeqTrainer with the paper's schedule
(§5.3) and token-based batches (§5.1).

    python scripts/train.py --output_dir runs/demo --max_steps 2000            # the built-in en-de task
    python scripts/train.py --output_dir runs/m30k --train_source_file ../shared/data/multi30k/train.en \
        --train_target_file ../shared/data/multi30k/train.de ...
    torchrun --nproc_per_node 2 scripts/train.py ...      # or: accelerate launch scripts/train.py ...

Every Seq2SeqTrainingArguments flag works (--per_device_train_batch_size, --resume_from_checkpoint, ...).
"""

import json

from vanilla_transformer.training import parse_training_args, run


def main(argv=None):
    results = run(*parse_training_args(argv))
    summary = {split: {k: v for k, v in r.items() if k in ("bleu", "chrf", "bleu_signature", "num_sentences")}
               for split, r in results.items() if split != "train"}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
