"""Data-parallel training on 2 CPU processes (gloo) through `torchrun` and `accelerate launch`, FSDP2 on CPU,
and resuming after SIGKILL. Every run is scripts/train.py (through tests/distributed_helpers/train_and_report.py,
which adds only a fixed initial seed and a per-rank state-dict dump) on the built-in task with the tiny preset.

Why SGD in the equality tests: Adam divides each update by sqrt(v) + 1e-9, so parameters whose true gradient
is zero (every attention key bias: softmax ignores a constant added to all scores) or nearly zero (dead ReLU
units) move by about the learning rate in a direction set by float rounding. Two runs that agree to 1e-7 in
loss then differ by ~0.04 in those entries (measured: 2x8 vs 1x16, 8 steps, max abs diff 0.042 in
`encoder_attn.k_proj.bias`). Adam also hides a wrong gradient *scale* (it is scale-invariant), which is the
bug data parallelism typically introduces (loss averaged per rank instead of over the global token count).
SGD's update is linear in the gradient, so it compares the gradients themselves. Resume, where the two runs do
the same arithmetic, uses the paper's Adam.

Tolerances: parameters 1e-6 absolute (the weights are O(0.1-1); measured differences are ~1e-7), losses
1e-5 relative; resume and rank-vs-rank comparisons are exact (0.0).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vanilla_transformer.training.schedule import NoamLambda

REPO = Path(__file__).resolve().parents[1]
HELPERS = REPO / "tests" / "distributed_helpers"
TRAIN = HELPERS / "train_and_report.py"
CPU_2PROC = REPO / "scripts" / "accelerate" / "cpu_2proc.yaml"

D_MODEL, WARMUP = 64, 4  # the tiny preset's d_model; --noam_warmup_steps
PARAM_ATOL = 1e-6
LOSS_RTOL = 1e-5
RUN_TIMEOUT = 300

BASE_ARGS = [
    "--preset", "tiny", "--vocab_size", "300", "--max_train_samples", "256", "--max_eval_samples", "4",
    "--eval_strategy", "no", "--report_to", "none", "--noam_warmup_steps", str(WARMUP), "--logging_steps", "1",
    "--config_overrides", "dropout=0.0", "--seed", "7", "--data_seed", "7", "--use_cpu",
    "--dataloader_num_workers", "0", "--save_strategy", "steps",
]
# Only under a launcher: with one process, --ddp_backend makes accelerate call get_world_size() on a process
# group nobody initialised (ValueError "Default process group has not been initialized").
DIST_ARGS = ["--ddp_backend", "gloo", "--ddp_find_unused_parameters", "false"]
# A time budget far beyond the run: under a launcher its clock is all-reduced every step, and its learning-rate
# ramp (1 until the last 300 minutes) must leave every rate as the schedule gives it.
SGD_ARGS = ["--optim", "sgd", "--max_steps", "8", "--save_steps", "4", "--max_train_minutes", "600",
            "--lr_decay_minutes", "300"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CPU_2PROC)]


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ACCELERATE_", "FSDP_", "TORCHELASTIC_"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1", **extra)
    return env


def _launch(command: list[str], output_dir: Path, env: dict) -> subprocess.Popen:
    output_dir.mkdir(parents=True, exist_ok=True)
    log = open(output_dir.parent / f"{output_dir.name}.log", "w")
    # A session of its own, so that a kill or a timeout reaches the launcher and every rank it started.
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _kill(process: subprocess.Popen):
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _run(launcher: list[str], output_dir: Path, args: list[str], base: list[str] = BASE_ARGS, **env) -> Path:
    """Run train_and_report.py under `launcher` (empty: one plain process); return the output dir."""
    dump = output_dir / "dump"
    command = [*launcher, str(TRAIN)] if launcher else [sys.executable, str(TRAIN)]
    command += ["--output_dir", str(output_dir), *base, *args]
    process = _launch(command, output_dir, _env(VT_DUMP_DIR=str(dump), **env))
    try:
        process.wait(timeout=RUN_TIMEOUT)
    finally:
        _kill(process)
    log = (output_dir.parent / f"{output_dir.name}.log").read_text(errors="replace")
    assert process.returncode == 0, f"{' '.join(command)} failed ({process.returncode}):\n{log[-6000:]}"
    return output_dir


def _dumps(output_dir: Path) -> dict[int, dict]:
    return {int(p.stem[4:]): torch.load(p) for p in sorted((output_dir / "dump").glob("rank*.pt"))}


def _hashes(output_dir: Path) -> dict[int, str]:
    """The hash of its weights each rank computed (read from files: the ranks' printed lines can interleave)."""
    return {int(p.stem[4:]): p.read_text() for p in sorted((output_dir / "dump").glob("rank*.sha256"))}


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def _log_history(checkpoint: Path) -> list[dict]:
    return json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]


def _losses(checkpoint: Path) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in _log_history(checkpoint) if "loss" in e}


def is_complete(checkpoint: Path, world_size: int) -> bool:
    """Trainer 5.24 writes checkpoint-N in place (no temporary folder and rename): model, optimizer,
    scheduler, each rank's RNG state, and trainer_state.json last. A folder without all of them was cut short."""
    needed = ["model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json",
              *[f"rng_state_{r}.pth" for r in range(world_size)]]
    return all((checkpoint / name).is_file() for name in needed)


def last_complete_checkpoint(output_dir: Path, world_size: int) -> Path | None:
    complete = [p for p in output_dir.glob("checkpoint-*") if p.name[11:].isdigit() and is_complete(p, world_size)]
    return max(complete, key=lambda p: int(p.name[11:]), default=None)


# Shared runs (module scope: each is launched once) --------------------------------------------------------

@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("distributed")


@pytest.fixture(scope="module")
def single(runs_dir) -> Path:
    """The reference: one process, batch 16."""
    return _run([], runs_dir / "single", [*SGD_ARGS, "--per_device_train_batch_size", "16"])


@pytest.fixture(scope="module")
def torchrun_2x8(runs_dir) -> Path:
    return _run(TORCHRUN, runs_dir / "torchrun", [*SGD_ARGS, *DIST_ARGS, "--per_device_train_batch_size", "8"])


@pytest.fixture(scope="module")
def accelerate_2x8(runs_dir) -> Path:
    return _run(ACCELERATE, runs_dir / "accelerate", [*SGD_ARGS, *DIST_ARGS, "--per_device_train_batch_size", "8"])


def _check_matches_single(distributed: Path, single: Path):
    reference = _dumps(single)[0]
    ranks = _dumps(distributed)
    assert sorted(ranks) == [0, 1]
    # Every rank holds the same weights: bit-equal dumps and equal hashes printed by each rank.
    hashes = _hashes(distributed)
    assert sorted(hashes) == [0, 1] and hashes[0] == hashes[1], hashes
    assert max_abs_diff(ranks[0], ranks[1]) == 0.0
    # The same training as one process with the same global batch.
    moved = max_abs_diff(reference, torch.load(single / "dump" / "init.pt"))
    assert moved > 1e-2, f"training barely moved the weights ({moved}): the comparison would be vacuous"
    assert torch.load(distributed / "dump" / "init.pt").keys() == reference.keys()
    assert max_abs_diff(torch.load(distributed / "dump" / "init.pt"), torch.load(single / "dump" / "init.pt")) == 0.0
    diff = max_abs_diff(ranks[0], reference)
    print(f"\n{distributed.name}: max |param(2x8) - param(1x16)| = {diff:.3g} (weights moved {moved:.3g})")
    assert diff <= PARAM_ATOL
    # The saved model is the trained one.
    saved = load_file(distributed / "model.safetensors")
    assert max(((saved[k] - ranks[0][k]).abs().max().item() for k in saved)) == 0.0
    # Same loss at every step.
    ours, theirs = _losses(distributed / "checkpoint-8"), _losses(single / "checkpoint-8")
    assert ours.keys() == theirs.keys() == set(range(1, 9))
    for step in ours:
        assert ours[step] == pytest.approx(theirs[step], rel=LOSS_RTOL), step


def test_under_torchrun_one_process_reads_tokenizes_and_trains_the_vocabulary(runs_dir, tmp_path):
    corpus = {lang: tmp_path / f"train.{lang}" for lang in ("en", "de")}
    words = {"en": "the a small house green tree dog runs", "de": "das ein kleines Haus grüner Baum Hund läuft"}
    for lang, path in corpus.items():
        vocabulary = words[lang].split()
        path.write_text("".join(" ".join(vocabulary[(i + j) % 8] for j in range(2 + i % 5)) + "\n" for i in range(300)))
    output = _run(TORCHRUN, runs_dir / "torchrun_files", [
        *DIST_ARGS, "--max_steps", "2", "--per_device_train_batch_size", "8", "--preprocessing_num_workers", "2",
        "--train_source_file", str(corpus["en"]), "--train_target_file", str(corpus["de"])])
    dump = output / "dump"
    assert sorted(p.name for p in dump.glob("vocabulary_rank*")) == ["vocabulary_rank0"]
    reports = {rank: json.loads((dump / f"data_rank{rank}.json").read_text()) for rank in (0, 1)}
    # The main process tokenized; the other read the ids it had written into datasets' cache.
    assert [reports[rank]["tokenized_from_cache"] for rank in (0, 1)] == [False, True]
    assert reports[0]["kept"] == reports[1]["kept"] == 256
    hashes = _hashes(output)
    assert sorted(hashes) == [0, 1] and hashes[0] == hashes[1]


def test_torchrun_2_processes_match_one_process(torchrun_2x8, single):
    _check_matches_single(torchrun_2x8, single)


def test_accelerate_launch_2_processes_match_one_process(accelerate_2x8, single):
    _check_matches_single(accelerate_2x8, single)


@pytest.mark.parametrize("run", ["torchrun_2x8", "accelerate_2x8"])
def test_noam_schedule_advances_once_per_optimizer_step(run, request, single):
    """Trainer logs the rate of update k at step k: NoamLambda(k - 1) (the lambda is shifted by one so update 1
    does not run at lr 0). A scheduler stepped once per rank would log NoamLambda(2k - 1) instead."""
    output_dir = request.getfixturevalue(run)
    noam = NoamLambda(D_MODEL, WARMUP)
    for checkpoint in (output_dir / "checkpoint-4", output_dir / "checkpoint-8"):
        logged = {e["step"]: e["learning_rate"] for e in _log_history(checkpoint) if "learning_rate" in e}
        last = int(checkpoint.name.split("-")[1])
        assert sorted(logged) == list(range(1, last + 1))
        for step, rate in logged.items():
            assert rate == pytest.approx(noam(step - 1), rel=1e-12), (checkpoint.name, step)
        scheduler = torch.load(checkpoint / "scheduler.pt", weights_only=True)
        assert scheduler["last_epoch"] == last  # one scheduler step per optimizer step, not per rank
        # The saved rate is the peak, D_MODEL^-0.5 * WARMUP^-0.5; the lambda is the curve as a multiple of it.
        assert scheduler["lr_lambdas"][0] == {"d_model": D_MODEL, "warmup_steps": WARMUP, "factor": 1.0,
                                              "base_lr": D_MODEL**-0.5 * WARMUP**-0.5, "decay": 1.0}
    single_rates = [e["learning_rate"] for e in _log_history(single / "checkpoint-8") if "learning_rate" in e]
    rates = [e["learning_rate"] for e in _log_history(output_dir / "checkpoint-8") if "learning_rate" in e]
    assert rates == single_rates


# FSDP ----------------------------------------------------------------------------------------------------

def test_fsdp2_on_cpu_checkpoint_reloads_into_plain_model(tmp_path):
    """torch's FSDP2 (`fully_shard`, what accelerate's fsdp.yaml uses, version 2) on 2 gloo CPU processes,
    sharded per `_no_split_modules` layer: trains like one process, and its sharded checkpoint (torch.distributed
    .checkpoint, as Trainer writes with SHARDED_STATE_DICT) merges into a plain model with identical outputs."""
    sys.path.insert(0, str(HELPERS))
    try:
        import fsdp_cpu
    finally:
        sys.path.remove(str(HELPERS))
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from transformers import AutoModelForSeq2SeqLM

    out = tmp_path / "fsdp"
    process = _launch([*TORCHRUN, str(HELPERS / "fsdp_cpu.py"), str(out)], out, _env())
    try:
        process.wait(timeout=RUN_TIMEOUT)
    finally:
        _kill(process)
    assert process.returncode == 0, (tmp_path / "fsdp.log").read_text(errors="replace")[-6000:]
    reports = [json.loads((out / f"report_rank{r}.json").read_text()) for r in range(2)]
    config = fsdp_cpu.config()
    assert reports[0]["fsdp_units"] == config.encoder_layers + config.decoder_layers
    assert reports[0]["dtensor_params"] > 0  # really sharded
    assert reports[0]["sha256"] == reports[1]["sha256"]  # the gathered weights agree on both ranks

    reference, reference_losses = fsdp_cpu.train_plain()
    assert reports[0]["losses"] == pytest.approx(reference_losses, rel=LOSS_RTOL)

    dcp_to_torch_save(out / "dcp", tmp_path / "merged.pt")  # what `accelerate merge-weights` does
    merged = torch.load(tmp_path / "merged.pt")
    gathered = torch.load(out / "full_rank0.pt")
    assert max_abs_diff(merged, gathered) == 0.0
    plain = fsdp_cpu.build_model()
    assert not plain.load_state_dict(merged, strict=True).missing_keys
    plain.save_pretrained(tmp_path / "plain")
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "plain").eval()
    assert reloaded.lm_head.weight is reloaded.model.shared.weight

    param_diff = max_abs_diff(merged, reference.state_dict())
    batch = fsdp_cpu.batches()[0]
    with torch.no_grad():
        logits = reloaded(**batch).logits
        exact = fsdp_cpu.build_model().eval()
        exact.load_state_dict(gathered)
        logit_diff_gathered = (logits - exact(**batch).logits).abs().max().item()
        logit_diff_plain = (logits - reference(**batch).logits).abs().max().item()
    print(f"\nFSDP2 2 procs vs 1 proc: max |param diff| = {param_diff:.3g}, max |logit diff| = {logit_diff_plain:.3g}; "
          f"merged checkpoint vs gathered in-memory weights: logits {logit_diff_gathered:.3g}")
    assert logit_diff_gathered == 0.0
    assert param_diff <= PARAM_ATOL
    assert logit_diff_plain <= 1e-4


@pytest.mark.skipif(
    torch.cuda.device_count() < 2,
    reason="Trainer FSDP needs >= 2 GPUs: accelerate 1.15 applies its FSDP plugin only when the distributed type is "
           "a GPU-type one (accelerate/state.py: MULTI_GPU, ...); CPU processes get MULTI_CPU and `--fsdp` / "
           "fsdp.yaml are silently ignored (plain DDP). FSDP2 itself on CPU is covered by "
           "test_fsdp2_on_cpu_checkpoint_reloads_into_plain_model.")
def test_trainer_fsdp_through_accelerate_on_gpus(tmp_path):
    """scripts/accelerate/fsdp.yaml with Trainer on 2 GPUs: sharded checkpoints merge into a plain model equal to
    the weights gathered after training (VT_EXIT_AFTER_TRAIN: run()'s rank-0-only save/evaluation is skipped)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                str(REPO / "scripts" / "accelerate" / "fsdp.yaml"), "--num_processes", "2"]
    gpu_args = [a for a in BASE_ARGS if a != "--use_cpu"]
    out = _run(launcher, tmp_path / "fsdp", ["--max_steps", "8", "--save_steps", "8",
                                              "--per_device_train_batch_size", "8"], base=gpu_args,
               VT_EXIT_AFTER_TRAIN="1")
    gathered = _dumps(out)[0]  # gathered on rank 0 after training
    shards = out / "checkpoint-8" / "pytorch_model_fsdp_0"
    assert shards.is_dir()
    dcp_to_torch_save(shards, tmp_path / "merged.pt")
    merged = torch.load(tmp_path / "merged.pt")
    merged = merged.get("model", merged)
    common = gathered.keys() & merged.keys()
    assert len(common) >= len(gathered) - 3  # tied copies of the shared embedding may be stored once
    assert max(((merged[k].float().cpu() - gathered[k].float().cpu()).abs().max().item() for k in common)) == 0.0


# Resume after SIGKILL ------------------------------------------------------------------------------------

RESUME_ARGS = ["--max_steps", "16", "--save_steps", "4", "--per_device_train_batch_size", "8", *DIST_ARGS]


def test_resume_after_sigkill_matches_uninterrupted(runs_dir):
    """2 processes, Adam (the paper's recipe); the run is SIGKILLed after its first checkpoint, resumed from the
    last *complete* checkpoint, and ends with the uninterrupted run's weights, bit for bit.

    Trainer 5.24 writes checkpoint-N in place, so a kill during a save leaves a partial folder, and
    `get_last_checkpoint` (what `resume_from_checkpoint=True` uses) picks the highest number regardless. The test
    leaves such a folder (cut at the same point as a kill inside `save_model`) to show that resuming from the
    last complete checkpoint is unaffected by it."""
    from transformers.trainer_utils import get_last_checkpoint

    uninterrupted = _run(TORCHRUN, runs_dir / "uninterrupted", RESUME_ARGS)

    killed_dir = runs_dir / "killed"
    command = [*TORCHRUN, str(TRAIN), "--output_dir", str(killed_dir), *BASE_ARGS, *RESUME_ARGS]
    process = _launch(command, killed_dir, _env(VT_STEP_SLEEP="0.25"))
    first = killed_dir / "checkpoint-4"
    deadline = time.monotonic() + RUN_TIMEOUT
    try:
        while not is_complete(first, 2):
            assert process.poll() is None, (runs_dir / "killed.log").read_text(errors="replace")[-6000:]
            assert time.monotonic() < deadline, "no checkpoint in time"
            time.sleep(0.02)
    finally:
        _kill(process)  # SIGKILL to the launcher and both ranks
    assert process.returncode == -signal.SIGKILL
    assert not (killed_dir / "model.safetensors").exists()  # it really stopped before the end
    resume_from = last_complete_checkpoint(killed_dir, 2)
    resumed_step = int(resume_from.name.split("-")[1])
    assert 4 <= resumed_step < 16

    # A checkpoint cut short, as a kill inside save_model leaves it (config written, weights half written).
    partial = killed_dir / f"checkpoint-{resumed_step + 4}"
    if not partial.exists():
        partial.mkdir()
        shutil.copy(resume_from / "config.json", partial / "config.json")
        weights = (resume_from / "model.safetensors").read_bytes()
        (partial / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    assert not is_complete(partial, 2)
    assert Path(get_last_checkpoint(str(killed_dir))) == partial  # what resume_from_checkpoint=True would take
    assert last_complete_checkpoint(killed_dir, 2) == resume_from

    resumed = _run(TORCHRUN, killed_dir, [*RESUME_ARGS, "--resume_from_checkpoint", str(resume_from)])
    final, reference = _dumps(resumed), _dumps(uninterrupted)
    assert max_abs_diff(final[0], final[1]) == 0.0
    diff = max_abs_diff(final[0], reference[0])
    print(f"\nresumed from {resume_from.name} after SIGKILL: max |param - uninterrupted| = {diff:.3g}")
    assert diff == 0.0
    assert _losses(killed_dir / "checkpoint-16") == _losses(uninterrupted / "checkpoint-16")
    saved, reference_saved = load_file(killed_dir / "model.safetensors"), load_file(uninterrupted / "model.safetensors")
    assert max(((saved[k] - reference_saved[k]).abs().max().item() for k in saved)) == 0.0


def test_token_batches_resumed_mid_epoch_on_2_processes_match_uninterrupted(runs_dir):
    """The token-bucket sampler reshuffles per epoch; a run resumed inside a later epoch must see the same
    batches on every rank as the uninterrupted run, so it ends with the same weights, bit for bit."""
    args = ["--max_steps", "14", "--save_steps", "1", "--max_tokens_per_batch", "300", "--save_total_limit", "20",
            *DIST_ARGS]
    uninterrupted = _run(TORCHRUN, runs_dir / "tokens_uninterrupted", args)
    epochs = {int(p.name[11:]): json.loads((p / "trainer_state.json").read_text())["epoch"]
              for p in uninterrupted.glob("checkpoint-*")}
    inside_later_epoch = [step for step, epoch in sorted(epochs.items()) if 1 < epoch < 2 and step < 13]
    assert inside_later_epoch, f"no checkpoint inside the second epoch: {epochs}"
    resume_step = inside_later_epoch[len(inside_later_epoch) // 2]
    resumed_dir = runs_dir / "tokens_resumed"
    shutil.copytree(uninterrupted / f"checkpoint-{resume_step}", resumed_dir / f"checkpoint-{resume_step}")
    resumed = _run(TORCHRUN, resumed_dir, [*args, "--resume_from_checkpoint",
                                           str(resumed_dir / f"checkpoint-{resume_step}")])
    final, reference = _dumps(resumed), _dumps(uninterrupted)
    assert max_abs_diff(final[0], final[1]) == 0.0
    assert max_abs_diff(final[0], reference[0]) == 0.0
    assert _losses(resumed / "checkpoint-14") == _losses(uninterrupted / "checkpoint-14")
