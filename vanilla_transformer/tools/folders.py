"""Model folders on disk: which files hold the weights (one safetensors file or an index of shards), which
files travel with them, and output folders that never overwrite what a user saved and appear whole or not at all.
"""

import fnmatch
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from safetensors import safe_open

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Everything a loadable model folder needs besides its weights. Trainer state (optimizer.pt, scheduler.pt,
# rng_state.pth, trainer_state.json, training_args.bin) belongs to one step and is deliberately left behind.
TOKENIZER_FILES = ("tokenizer*.json", "special_tokens_map.json", "added_tokens.json", "vocab.*", "target_vocab.*",
                   "merges.txt", "*.model", "*.spm", "chat_template.*")
SIDE_FILES = ("config.json", "generation_config.json", "*.py", *TOKENIZER_FILES)


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


def load_model_and_tokenizer(model_or_dir, tokenizer=None):
    """(model, tokenizer) from a saved folder or Hub id (which brings its tokenizer unless one is given), or an
    in-memory model with the tokenizer it needs."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    if isinstance(model_or_dir, (str, os.PathLike)):
        model = AutoModelForSeq2SeqLM.from_pretrained(model_or_dir)
        tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(model_or_dir)
    else:
        model = model_or_dir
    if tokenizer is None:
        raise ValueError("Pass the tokenizer with an in-memory model (a saved folder brings its own).")
    return model, tokenizer


def check_output_dir(output_dir: str | os.PathLike) -> Path:
    """Never overwrite what a user saved: the output folder must not exist, or be empty."""
    output_dir = Path(output_dir)
    if output_dir.exists() and (not output_dir.is_dir() or any(output_dir.iterdir())):
        raise ValueError(f"{output_dir} exists and is not empty; it is never overwritten: choose a new folder")
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


def parameter_shapes(folder: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """Every stored tensor's shape, read from the safetensors headers (no tensor data is loaded)."""
    folder = Path(folder)
    shapes = {}
    for shard, names in weight_files(folder).items():
        with safe_open(folder / shard, framework="pt") as f:
            shapes.update({name: tuple(f.get_slice(name).get_shape()) for name in names})
    return shapes


__all__ = ["SINGLE_FILE", "INDEX_FILE", "TOKENIZER_FILES", "SIDE_FILES", "weight_files", "parameter_shapes",
           "check_weights", "check_output_dir", "staged_output_dir", "copy_side_files"]
