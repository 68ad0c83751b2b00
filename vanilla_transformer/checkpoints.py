"""Checkpoint averaging, as in §6.1 of the paper: "For the base models, we used a single model obtained by
averaging the last 5 checkpoints, which were written at 10-minute intervals. For the big models, we averaged
the last 20 checkpoints."

Averaging streams tensor by tensor: every input is opened with `safetensors.safe_open` (memory-mapped, nothing
read yet), and each output tensor is the float64 mean of that one tensor across the inputs. Output shards are
written one at a time, so memory holds about one output shard plus one float64 tensor, however many
checkpoints are averaged. Only safetensors are read: a pickle (`pytorch_model.bin`) can run code when loaded.
"""

import fnmatch
import json
import os
import re
import shutil
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Everything a loadable model folder needs besides its weights. Trainer state (optimizer.pt, scheduler.pt,
# rng_state.pth, trainer_state.json, training_args.bin) belongs to one step and is deliberately left behind.
TOKENIZER_FILES = ("tokenizer*.json", "special_tokens_map.json", "added_tokens.json", "vocab.*", "target_vocab.*",
                   "merges.txt", "*.model", "*.spm", "chat_template.*")
SIDE_FILES = ("config.json", "generation_config.json", "*.py", *TOKENIZER_FILES)
# Fields that change the computed function without changing any tensor's name or shape.
_STRUCTURE_KEYS = ("model_type", "activation_function", "normalize_before", "scale_embedding", "is_encoder_decoder")
_CHECKPOINT_NAME = re.compile(r"checkpoint-(\d+)")


def last_checkpoints(run_dir: str | os.PathLike, n: int) -> list[Path]:
    """The last `n` `checkpoint-<step>` folders that Trainer wrote into `run_dir`, oldest first.

    Sorted by the step as a number, so checkpoint-10 comes after checkpoint-9.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n, the number of checkpoints to average, must be a positive int, got {n!r}.")
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


def weight_files(folder: str | os.PathLike) -> dict[str, list[str]]:
    """{shard file name: [tensor names]} for a folder saved with `save_pretrained` (one file or sharded)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a directory.")
    if (folder / INDEX_FILE).is_file():
        weight_map = json.loads((folder / INDEX_FILE).read_text(encoding="utf-8"))["weight_map"]
        shards: dict[str, list[str]] = {}
        for name, shard in weight_map.items():
            shards.setdefault(shard, []).append(name)
        return shards
    if (folder / SINGLE_FILE).is_file():
        with safe_open(folder / SINGLE_FILE, framework="pt") as f:
            return {SINGLE_FILE: list(f.keys())}
    pickles = sorted(p.name for p in folder.glob("pytorch_model*.bin"))
    if pickles:
        raise ValueError(f"{folder} holds only pickled weights ({', '.join(pickles)}); only safetensors are "
                         "supported, because loading a pickle can run arbitrary code. Re-save the model with "
                         "save_pretrained(..., safe_serialization=True).")
    raise ValueError(f"{folder} holds no model weights ({SINGLE_FILE} or {INDEX_FILE}).")


def check_weights(folder: str | os.PathLike) -> None:
    """Raise a ValueError naming the file when one of a folder's safetensors files does not open, as a save
    that was killed midway leaves it. Reads only the headers, which cover the file's whole length."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a directory.")
    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(path, framework="pt"):
                pass
        except Exception as error:  # safetensors raises its own error type for every kind of damage
            raise ValueError(f"{path} does not load ({error}).") from error


def check_output_dir(output_dir: str | os.PathLike) -> Path:
    """Never overwrite what a user saved: the output folder must not exist, or be empty."""
    output_dir = Path(output_dir)
    if output_dir.exists() and (not output_dir.is_dir() or any(output_dir.iterdir())):
        raise ValueError(f"Output directory {output_dir} already exists and is not empty; choose a new one.")
    return output_dir


@contextmanager
def staged_output_dir(output_dir: str | os.PathLike):
    """Yield a hidden folder beside `output_dir` to write into; it becomes `output_dir` when the block ends and
    is removed if the block fails, so an output folder appears whole (checked, verified) or not at all."""
    output_dir = check_output_dir(output_dir)
    staging = output_dir.with_name(f".{output_dir.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging
        check_output_dir(output_dir)  # nothing else appeared there meanwhile
        if output_dir.exists():
            output_dir.rmdir()
        staging.rename(output_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def copy_side_files(source: str | os.PathLike, target: str | os.PathLike, patterns=SIDE_FILES) -> list[str]:
    """Copy the files matching `patterns` (default: config, generation config, remote code and tokenizer)."""
    copied = []
    for path in sorted(Path(source).iterdir()):
        if path.is_file() and any(fnmatch.fnmatch(path.name, pattern) for pattern in patterns):
            shutil.copy2(path, Path(target) / path.name)
            copied.append(path.name)
    return copied


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


__all__ = ["average_checkpoints", "last_checkpoints", "weight_files", "check_output_dir", "staged_output_dir",
           "check_weights",
           "copy_side_files",
           "SIDE_FILES", "TOKENIZER_FILES"]
