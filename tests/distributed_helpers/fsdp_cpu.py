#!/usr/bin/env python
"""FSDP2 (`torch.distributed.fsdp.fully_shard`) on CPU processes with gloo, for tests/test_distributed.py.

Trainer cannot run FSDP on CPUs: accelerate (1.15) only turns its FSDP plugin on for GPU-type distributed
setups, and on CPU processes `--fsdp` is silently ignored (plain DDP). This helper therefore shards our model
the way accelerate's FSDP2 path does (one unit per `_no_split_modules` layer, then the root), trains it for a
few SGD steps on a fixed global batch split across ranks, and writes

  <out>/dcp/            the sharded model state dict (torch.distributed.checkpoint: what Trainer/accelerate
                        write as `checkpoint-N/pytorch_model_fsdp_0` with SHARDED_STATE_DICT)
  <out>/full_rank<r>.pt the full state dict gathered on every rank after training
  <out>/report.json     per-rank hashes and losses

    torchrun --standalone --nproc_per_node 2 tests/distributed_helpers/fsdp_cpu.py <out>

The test trains the same steps in one plain process (`train_plain`) and compares.
"""

import hashlib
import json
import os
import sys
from pathlib import Path

import torch

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

STEPS = 4
GLOBAL_BATCH = 8
LR = 0.05
SEED = 0
VOCAB = 64


def config() -> VanillaTransformerConfig:
    return VanillaTransformerConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
                                    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                    decoder_ffn_dim=64, dropout=0.0, label_smoothing=0.1)


def build_model() -> VanillaTransformerForConditionalGeneration:
    torch.manual_seed(SEED)
    return VanillaTransformerForConditionalGeneration(config())


def batches() -> list[dict]:
    """STEPS global batches with right-padded sources and -100-padded labels of varying lengths."""
    generator = torch.Generator().manual_seed(1234)
    out = []
    for _ in range(STEPS):
        src_len = torch.randint(3, 11, (GLOBAL_BATCH,), generator=generator)
        tgt_len = torch.randint(2, 9, (GLOBAL_BATCH,), generator=generator)
        input_ids = torch.randint(4, VOCAB, (GLOBAL_BATCH, 10), generator=generator)
        mask = (torch.arange(10)[None] < src_len[:, None]).long()
        labels = torch.randint(4, VOCAB, (GLOBAL_BATCH, 8), generator=generator)
        labels = labels.masked_fill(torch.arange(8)[None] >= tgt_len[:, None], -100)
        out.append({"input_ids": input_ids.masked_fill(mask == 0, 0), "attention_mask": mask, "labels": labels})
    return out


def shard(batch: dict, rank: int, world: int) -> dict:
    per = GLOBAL_BATCH // world
    return {k: v[rank * per:(rank + 1) * per] for k, v in batch.items()}


def step(model, optimizer, batch: dict, num_items: int, world: int) -> float:
    # Trainer's contract: the loss is summed over this rank's tokens and divided by the global token count;
    # data parallelism averages gradients over ranks, so the loss is multiplied by the world size.
    loss = model(**batch, num_items_in_batch=num_items).loss * world
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item() / world


def train_plain() -> tuple[VanillaTransformerForConditionalGeneration, list[float]]:
    """The single-process reference: the same steps on the whole global batch."""
    model = build_model().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = [step(model, optimizer, b, int((b["labels"] != -100).sum()), 1) for b in batches()]
    return model.eval(), losses


def state_hash(state: dict) -> str:
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].detach().to(torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()


def main(out: Path):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model().train()
    # accelerate's transformer auto-wrap: one FSDP unit per class named in _no_split_modules, then the root
    # (which holds the shared embedding / output projection, tied by identity).
    units = [m for m in model.modules() if type(m).__name__ in model._no_split_modules]
    for unit in units:
        fully_shard(unit)
    fully_shard(model)
    sharded = sum(1 for p in model.parameters() if type(p).__name__ == "DTensor")
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for b in batches():
        local = shard(b, rank, world)
        num_items = int((b["labels"] != -100).sum())  # global count, as Trainer gathers it
        losses.append(step(model, optimizer, local, num_items, world))
    loss_sum = torch.tensor(losses)
    dist.all_reduce(loss_sum)  # the global loss of each step

    out.mkdir(parents=True, exist_ok=True)
    dcp.save(get_model_state_dict(model), checkpoint_id=str(out / "dcp"))
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    full = {k: v.detach().clone() for k, v in full.items()}
    torch.save(full, out / f"full_rank{rank}.pt")
    report = {"rank": rank, "world": world, "fsdp_units": len(units), "dtensor_params": sharded,
              "sha256": state_hash(full), "losses": loss_sum.tolist()}
    Path(out, f"report_rank{rank}.json").write_text(json.dumps(report))
    print("VT_FSDP " + json.dumps(report), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(Path(sys.argv[1]))
