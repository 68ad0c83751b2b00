"""Checkpoint averaging, as in §6.1 of the paper: "For the base models, we used a single model obtained by
averaging the last 5 checkpoints, which were written at 10-minute intervals. For the big models, we averaged
the last 20 checkpoints."

Averaging streams tensor by tensor: every input is opened with `safetensors.safe_open` (memory-mapped, nothing
read yet), and each output tensor is the float64 mean of that one tensor across the inputs. Output shards are
written one at a time, so memory holds about one output shard plus one float64 tensor, however many
checkpoints are averaged. Only safetensors are read: a pickle (`pytorch_model.bin`) can run code when loaded.

Resuming a run (`resolve_checkpoint`) skips, with a warning, a newest checkpoint whose save was interrupted.
"""

import json
import logging
import os
import re
import shutil
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..support_vanilla_transformer import check_int
from ..tools.folders import INDEX_FILE, check_output_dir, check_weights, copy_side_files, staged_output_dir, weight_files

logger = logging.getLogger(__name__)

# Fields that change the computed function without changing any tensor's name or shape.
_STRUCTURE_KEYS = ("model_type", "activation_function", "normalize_before", "scale_embedding", "is_encoder_decoder")
_CHECKPOINT_NAME = re.compile(r"checkpoint-(\d+)")


def last_checkpoints(run_dir: str | os.PathLike, n: int) -> list[Path]:
    """The last `n` `checkpoint-<step>` folders that Trainer wrote into `run_dir`, oldest first.

    Sorted by the step as a number, so checkpoint-10 comes after checkpoint-9.
    """
    check_int("n, the number of checkpoints to average,", n)
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"run_dir={str(run_dir)!r} is not a directory.")
    found = sorted(
        (int(match.group(1)), path)
        for path in run_dir.iterdir()
        if path.is_dir() and (match := _CHECKPOINT_NAME.fullmatch(path.name))
    )
    if len(found) < n:
        raise ValueError(f"Asked for the last {n} checkpoints, but {run_dir} holds only {len(found)} "
                         f"checkpoint-<step> folders: {[path.name for _, path in found]}.")
    return [path for _, path in found[-n:]]


def _read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise ValueError(f"{folder} has no config.json, so it cannot be loaded as a model.")
    return json.loads(path.read_text(encoding="utf-8"))


def _check_compatible(folders: list[Path], locations: list[dict[str, Path]]):
    """Every folder must hold the same architecture: structural config fields, tensor names and shapes.

    Shapes come from the safetensors headers, so this reads no tensor data and runs before anything is written.
    """
    reference, reference_config = folders[-1], _read_config(folders[-1])
    reference_shapes = _shapes(locations[-1])
    for folder, where in zip(folders[:-1], locations[:-1]):
        config = _read_config(folder)
        for key in _STRUCTURE_KEYS:
            if config.get(key) != reference_config.get(key):
                raise ValueError(f"{folder} has {key}={config.get(key)!r} but {reference} has "
                                 f"{reference_config.get(key)!r}: these are different architectures.")
        shapes = _shapes(where)
        if shapes.keys() != reference_shapes.keys():
            extra, missing = sorted(shapes.keys() - reference_shapes), sorted(reference_shapes.keys() - shapes)
            raise ValueError(f"{folder} and {reference} hold different tensors: only in {folder}: {extra[:5]}, "
                             f"only in {reference}: {missing[:5]}.")
        for name, shape in shapes.items():
            if shape != reference_shapes[name]:
                raise ValueError(f"Tensor {name!r} has shape {shape} in {folder} but {reference_shapes[name]} in "
                                 f"{reference}: these are different architectures.")


def _shapes(where: dict[str, Path]) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for path in sorted(set(where.values())):
        with safe_open(path, framework="pt") as f:
            shapes.update({name: tuple(f.get_slice(name).get_shape()) for name in f.keys() if where.get(name) == path})
    return shapes


def average_checkpoints(folders: list[str | os.PathLike], output_dir: str | os.PathLike) -> Path:
    """Write the element-wise mean of the weights of `folders` into `output_dir`, a new model folder.

    The output keeps the shard layout, dtypes and safetensors metadata of the newest folder, taken to be the
    last one given (`last_checkpoints` returns them oldest first), and copies its config, generation config,
    remote-code and tokenizer files, so `AutoModelForSeq2SeqLM.from_pretrained(output_dir)` loads it.
    Floating-point tensors are summed in float64 and cast back; other tensors (integer buffers) must be equal.
    """
    folders = [Path(folder) for folder in folders]
    if not folders:
        raise ValueError("Give at least one checkpoint folder to average.")
    output_dir = check_output_dir(output_dir)
    layouts = [weight_files(folder) for folder in folders]  # fails early on pickle-only or empty folders
    # Where each tensor lives in each folder: the inputs need not share one shard layout.
    locations = [{name: folder / shard for shard, names in layout.items() for name in names}
                 for folder, layout in zip(folders, layouts)]
    _check_compatible(folders, locations)
    newest = folders[-1]

    with staged_output_dir(output_dir) as staging, ExitStack() as stack:
        handles = {}  # one memory-mapped handle per input file, opened once

        def open_file(path: Path):
            if path not in handles:
                handles[path] = stack.enter_context(safe_open(path, framework="pt"))
            return handles[path]

        for shard, names in layouts[-1].items():
            averaged = {name: _average_tensor(name, [open_file(where[name]) for where in locations], folders)
                        for name in names}
            save_file(averaged, staging / shard, metadata=open_file(newest / shard).metadata() or {"format": "pt"})
            del averaged
        if (newest / INDEX_FILE).is_file():
            shutil.copy2(newest / INDEX_FILE, staging / INDEX_FILE)
        copy_side_files(newest, staging)
    return output_dir


def _average_tensor(name: str, files: list, folders: list[Path]) -> torch.Tensor:
    reference = files[-1].get_tensor(name)
    if not reference.is_floating_point():
        for file, folder in zip(files[:-1], folders[:-1]):
            if not torch.equal(file.get_tensor(name), reference):
                raise ValueError(f"Tensor {name!r} ({reference.dtype}) differs between {folder} and {folders[-1]}; "
                                 "non-floating-point tensors cannot be averaged.")
        return reference
    total = torch.zeros(reference.shape, dtype=torch.float64)
    for file in files:  # shapes were checked up front
        total += file.get_tensor(name).to(torch.float64)
    return (total / len(files)).to(reference.dtype).contiguous()


def replace_weights_with_average(folder: Path, n: int) -> list[str]:
    """Replace the weights saved in `folder` by the average of its last `n` checkpoint-N folders (§6.1); returns
    their names. The last step's own weights remain in the newest checkpoint."""
    checkpoints = last_checkpoints(folder, n)
    staging = folder / ".averaging"
    shutil.rmtree(staging, ignore_errors=True)
    average_checkpoints(checkpoints, staging)
    for name in [*weight_files(folder), INDEX_FILE]:
        (folder / name).unlink(missing_ok=True)
    for name in [*weight_files(staging), INDEX_FILE]:
        if (staging / name).is_file():
            shutil.move(staging / name, folder / name)
    shutil.rmtree(staging)
    return [path.name for path in checkpoints]


def resolve_checkpoint(resume: str | bool | None, output_dir: str, world_size: int = 1) -> str | None:
    """--resume_from_checkpoint PATH, checked; "true"/"last" means the newest *complete* checkpoint-N of
    output_dir. Trainer writes checkpoints in place, so a run killed mid-save can leave a newer, partial one:
    without its trainer state, without every rank's RNG state, or with weights that do not load."""
    if resume is None or resume is False or str(resume).lower() in ("false", "none", ""):
        return None
    if str(resume).lower() not in ("true", "last"):
        try:
            check_weights(resume)
        except ValueError as error:
            raise ValueError(f"--resume_from_checkpoint {resume} cannot be resumed from: {error}") from error
        return str(resume)
    candidates = sorted((path for path in Path(output_dir).glob("checkpoint-*") if path.name.split("-")[-1].isdigit()),
                        key=lambda path: int(path.name.split("-")[-1]), reverse=True)
    for path in candidates:
        if not (path / "trainer_state.json").is_file():
            logger.warning("Skipping %s: no trainer_state.json (written last, so the save was interrupted).", path)
        elif world_size > 1 and len(list(path.glob("rng_state_*.pth"))) < world_size:
            logger.warning("Skipping %s: it holds the RNG states of fewer than %d ranks.", path, world_size)
        else:
            try:
                check_weights(path)
            except ValueError as error:
                logger.warning("Skipping %s: %s", path, error)
                continue
            return str(path)
    raise ValueError(f"--resume_from_checkpoint {resume}: no complete checkpoint-N folder in {output_dir}.")


__all__ = ["average_checkpoints", "last_checkpoints", "replace_weights_with_average", "resolve_checkpoint"]
