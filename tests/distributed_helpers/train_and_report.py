#!/usr/bin/env python
"""scripts/train.py with three test hooks, for tests/test_distributed.py (launched by torchrun / accelerate).

1. Before anything else it seeds torch with VT_INIT_SEED (default 0). `run()` builds the model before the
   Trainer seeds, so `--seed` alone does not fix the initial weights; the single-process reference and the
   distributed runs must start from the same ones.
2. After `trainer.train()` every rank prints `VT_RANK_HASH rank=<r> world=<w> sha256=<h>` over its full
   state dict and, with VT_DUMP_DIR set, writes that hash to `<VT_DUMP_DIR>/rank<r>.sha256` and saves the
   state dict as `<VT_DUMP_DIR>/rank<r>.pt`. Under FSDP the
   full state dict is gathered collectively (rank 0 receives it; the other ranks then report nothing).
   With VT_EXIT_AFTER_TRAIN=1 every rank exits right after that, skipping run()'s rank-0-only save and
   evaluation (which need collectives under FSDP / ZeRO-3; see docs/distributed.md).
3. With VT_STEP_SLEEP=<seconds> every training step sleeps that long first (no numerical effect), so that a
   test can kill a run between two checkpoints.
4. With VT_DUMP_DIR set, every rank that trains a vocabulary writes `<VT_DUMP_DIR>/vocabulary_rank<r>`, and every
   rank writes what its data stage did (the length filter's report) to `<VT_DUMP_DIR>/data_rank<r>.json`.

Everything else is scripts/train.py unchanged: same arguments, same `run()`.
"""

import hashlib
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import torch  # noqa: E402
from transformers import set_seed  # noqa: E402

from vanilla_transformer import training  # noqa: E402

import train as train_script  # noqa: E402  (scripts/train.py)


def state_dict_hash(state_dict: dict) -> str:
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().to("cpu", torch.float32).contiguous()
        digest.update(name.encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


def full_state_dict(trainer) -> dict | None:
    if trainer.is_fsdp_enabled:
        state = trainer.accelerator.get_state_dict(trainer.model)  # collective; full on rank 0 only
        return state if trainer.is_world_process_zero() else None
    if trainer.is_deepspeed_enabled:
        state = trainer.accelerator.get_state_dict(trainer.deepspeed)
        return state if trainer.is_world_process_zero() else None
    return trainer.accelerator.unwrap_model(trainer.model).state_dict()


_train = training.PaperTrainer.train
_training_step = training.PaperTrainer.training_step


def slow_training_step(self, *args, **kwargs):
    time.sleep(float(os.environ.get("VT_STEP_SLEEP", "0")))
    return _training_step(self, *args, **kwargs)


def train_and_report(self, *args, **kwargs):
    dump = os.environ.get("VT_DUMP_DIR")
    if dump and self.args.process_index == 0:  # the weights training starts from (before any resume)
        Path(dump).mkdir(parents=True, exist_ok=True)
        torch.save({k: v.detach().clone() for k, v in self.model.state_dict().items()}, Path(dump, "init.pt"))
    output = _train(self, *args, **kwargs)
    state = full_state_dict(self)
    if state is not None:
        state = {k: v.detach().to("cpu").clone() for k, v in state.items()}
        digest = state_dict_hash(state)
        print(f"VT_RANK_HASH rank={self.args.process_index} world={self.args.world_size} sha256={digest}", flush=True)
        if dump:
            # Also one file per rank: ranks share stdout, where their lines can interleave.
            Path(dump).mkdir(parents=True, exist_ok=True)
            Path(dump, f"rank{self.args.process_index}.sha256").write_text(digest)
            torch.save(state, Path(dump, f"rank{self.args.process_index}.pt"))
    if os.environ.get("VT_EXIT_AFTER_TRAIN") == "1":
        self.accelerator.wait_for_everyone()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        sys.exit(0)
    return output


RUN_MODULE = sys.modules["vanilla_transformer.training.run"]
_train_vocabulary = RUN_MODULE.train_shared_tokenizer
_run = train_script.run


def dump_path(name: str) -> Path | None:
    dump = os.environ.get("VT_DUMP_DIR")
    if not dump:
        return None
    Path(dump).mkdir(parents=True, exist_ok=True)
    return Path(dump, name.format(rank=os.environ.get("RANK", "0")))


def reported_vocabulary(*args, **kwargs):
    if (path := dump_path("vocabulary_rank{rank}")) is not None:
        path.write_text("trained")
    return _train_vocabulary(*args, **kwargs)


def reported_run(*args, **kwargs):
    results = _run(*args, **kwargs)
    if (path := dump_path("data_rank{rank}.json")) is not None:
        path.write_text(json.dumps(results["train"]["length_filter"]))
    return results


RUN_MODULE.train_shared_tokenizer = reported_vocabulary
train_script.run = reported_run
training.PaperTrainer.train = train_and_report
if float(os.environ.get("VT_STEP_SLEEP", "0")) > 0:
    training.PaperTrainer.training_step = slow_training_step

if __name__ == "__main__":
    set_seed(int(os.environ.get("VT_INIT_SEED", "0")))
    train_script.main()
