"""Checkpoint folders that load from the Hub without this package, and their upload.

A complete folder holds the weights (safetensors), config.json with `auto_map` (and `custom_pipelines` for
the translation pipeline), the configuration/modeling/pipeline `.py` files it names, generation_config.json,
the tokenizer files (`check_hub_folder` checks these) and the model card README.md. `save_for_hub` writes
one; `stage_for_hub` copies a folder into a staging folder, completes and checks it (card included);
`upload_to_hub` uploads a staged folder. A folder given to stage or upload is only ever read.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
from pathlib import Path

import huggingface_hub
from huggingface_hub import HfApi, ModelCard
from huggingface_hub.errors import HfHubHTTPError
from transformers.dynamic_module_utils import get_relative_imports

from .folders import INDEX_FILE, SINGLE_FILE, TOKENIZER_FILES, weight_files
from .model_card import render_model_card
from ..pipeline_vanilla_transformer import TASK, VanillaTranslationPipeline, translation_pipeline

PIPELINE_FILE = Path(__file__).parent.parent / "pipeline_vanilla_transformer.py"
CUSTOM_PIPELINES = {TASK: {"impl": f"{PIPELINE_FILE.stem}.{VanillaTranslationPipeline.__name__}",
                           "pt": ["AutoModelForSeq2SeqLM"]}}
REQUIRED_AUTO_CLASSES = ("AutoConfig", "AutoModelForSeq2SeqLM")
# Trainer output next to the weights: never part of a model repo.
TRAINING_STATE = {"optimizer.pt", "scheduler.pt", "scaler.pt", "trainer_state.json", "training_args.bin"}
# What a failed upload raises: HTTP errors, OSError (offline mode, files) and the HTTP client's transport
# errors (huggingface_hub 1.x/2.x: httpx, whose ConnectError is not an OSError), i.e. HfHubHTTPError's bases.
UPLOAD_ERRORS = (OSError, HfHubHTTPError, *HfHubHTTPError.__bases__)


def save_for_hub(model, tokenizer, folder: str | os.PathLike, card: ModelCard | str | None = None) -> list[str]:
    """Write a complete Hub folder for `model` and `tokenizer`; returns its files (see `check_hub_folder`).

    Goes through the translation pipeline's `save_pretrained`, which adds `custom_pipelines` to config.json and
    copies the pipeline file; the model's own config is left as it was. `card`: a `ModelCard`, or its text;
    None writes a draft card from the config alone (no scores; `render_model_card` for a full one).
    """
    folder = Path(folder)
    pipe = translation_pipeline(model, tokenizer)
    had_custom = "custom_pipelines" in vars(model.config)
    previous = getattr(model.config, "custom_pipelines", None)
    try:
        pipe.save_pretrained(folder)
    finally:
        # Pipeline.save_pretrained sets config.custom_pipelines; a later plain model.save_pretrained would
        # then promise a pipeline file it does not write.
        if had_custom:
            model.config.custom_pipelines = previous
        else:
            vars(model.config).pop("custom_pipelines", None)
    if card is None:
        card = render_model_card(folder, languages=None, license=None, datasets=None, eval_results=None,
                                 dataset_name=None)
    elif isinstance(card, str):
        card = ModelCard(card)
    card.save(folder / "README.md")
    return check_hub_folder(folder)


def missing_hub_files(folder: str | os.PathLike) -> list[str]:
    """What `folder` lacks to load with `trust_remote_code=True` and as a translation pipeline; [] if complete."""
    folder = Path(folder)
    if not folder.is_dir():
        return [f"{folder} (no such folder)"]
    missing = []
    config = {}
    if (folder / "config.json").is_file():
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    else:
        missing.append("config.json")

    if (folder / INDEX_FILE).is_file():
        missing += [shard for shard in weight_files(folder) if not (folder / shard).is_file()]
    elif not (folder / SINGLE_FILE).is_file():
        missing.append(f"{SINGLE_FILE} (or {INDEX_FILE} with its shards)")
    if not (folder / "generation_config.json").is_file():
        missing.append("generation_config.json")
    if not (folder / "tokenizer_config.json").is_file():
        missing.append("tokenizer_config.json")
    # Beside its config, a tokenizer needs its vocabulary: tokenizer.json, or a slow tokenizer's vocab or model files.
    not_vocabulary = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")
    vocabulary = [path for path in folder.iterdir() if path.name not in not_vocabulary and not
                  path.name.startswith("chat_template.") and any(fnmatch.fnmatch(path.name, p) for p in TOKENIZER_FILES)]
    if not vocabulary:
        missing.append("tokenizer.json (or the tokenizer's other vocabulary files)")

    if config:
        auto_map = config.get("auto_map") or {}
        missing += [f"auto_map[{name!r}] in config.json" for name in REQUIRED_AUTO_CLASSES if name not in auto_map]
        references = [ref for refs in auto_map.values() for ref in (refs if isinstance(refs, list) else [refs])]
        references += [task["impl"] for task in (config.get("custom_pipelines") or {}).values()]
        if TASK not in (config.get("custom_pipelines") or {}):
            missing.append(f"custom_pipelines[{TASK!r}] in config.json")
        # "module.Class" names a file of this folder; "other/repo--module.Class" lives in another repo.
        modules = {ref.rsplit(".", 1)[0] + ".py" for ref in references if ref and "--" not in ref}
        seen = set()
        while modules:
            name = modules.pop()
            seen.add(name)
            if not (folder / name).is_file():
                missing.append(name)
                continue
            modules |= {f"{module}.py" for module in get_relative_imports(folder / name)} - seen
    return missing


def check_hub_folder(folder: str | os.PathLike) -> list[str]:
    """The folder's files (sorted, relative) if it is a complete model; ValueError naming what is missing."""
    missing = missing_hub_files(folder)
    if missing:
        raise ValueError(f"{folder} is not a complete model folder; missing: {', '.join(missing)}")
    return sorted(p.relative_to(folder).as_posix() for p in Path(folder).rglob("*") if p.is_file())


def add_translation_pipeline(folder: str | os.PathLike):
    """Register the translation pipeline in a folder of ours saved without it (plain save_pretrained), and copy its
    file where config.json names it already (a model loaded from one of our folders carries the entry, not the file)."""
    folder = Path(folder)
    config_file = folder / "config.json"
    if not config_file.is_file():
        return
    config = json.loads(config_file.read_text(encoding="utf-8"))
    if config.get("model_type") != "vanilla_transformer":
        return
    if not config.get("custom_pipelines"):
        config["custom_pipelines"] = CUSTOM_PIPELINES
        config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    ours = CUSTOM_PIPELINES[TASK]["impl"]
    if any(task.get("impl") == ours for task in config["custom_pipelines"].values()) and not (
            folder / PIPELINE_FILE.name).is_file():
        shutil.copyfile(PIPELINE_FILE, folder / PIPELINE_FILE.name)


def stage_for_hub(model_dir: str | os.PathLike, staging_dir: str | os.PathLike,
                  card: ModelCard | dict | None = None) -> list[str]:
    """Copy `model_dir`'s top-level files (no sub-folders, hidden files or Trainer state) to `staging_dir`, add the
    translation pipeline if it was saved without one, and check the result; returns the staged files, or raises
    ValueError naming what is missing. `model_dir` is only read.

    card: a `ModelCard` to write as README.md, a dict of `render_model_card` keyword arguments to render one
    from the staged folder, or None to keep the folder's own README.md.
    """
    source, staging = Path(model_dir).resolve(), Path(staging_dir).resolve()
    if not source.is_dir():
        raise ValueError(f"model_dir={str(model_dir)!r} is not a folder")
    if staging == source or source in staging.parents:
        raise ValueError(f"the staging folder {staging_dir} must lie outside the model folder {model_dir}")
    if staging.exists() and any(staging.iterdir()):
        raise ValueError(f"the staging folder {staging_dir} exists and is not empty; remove it or choose another")
    staging.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.iterdir()):
        if path.is_file() and not path.name.startswith((".", "rng_state")) and path.name not in TRAINING_STATE:
            shutil.copy2(path, staging / path.name)
    add_translation_pipeline(staging)
    missing = missing_hub_files(staging)
    if not missing and isinstance(card, dict):
        card = render_model_card(staging, **card)
    if isinstance(card, ModelCard):
        card.save(staging / "README.md")
    if not (staging / "README.md").is_file():
        missing.append("README.md (the model card)")
    if missing:
        raise ValueError(f"{model_dir} is not a complete model folder; missing: {', '.join(missing)}")
    return check_hub_folder(staging)


def resolve_token(token: str | None = None) -> str:
    """`token`, else the logged-in token (`HF_TOKEN`, or the file `hf auth login` writes); ValueError if none."""
    token = token or huggingface_hub.get_token()
    if not token:
        raise ValueError(
            "No Hugging Face token found. Log in with `hf auth login` (or `huggingface-cli login`), set the "
            "HF_TOKEN environment variable, or pass token= (--token in scripts/push_to_hub.py); it needs write access "
            "to the target repository."
        )
    return token


def upload_to_hub(folder: str | os.PathLike, repo_id: str, *, token: str, private: bool = False,
                  commit_message: str = "Upload vanilla_transformer model") -> str:
    """Create `repo_id` if needed and upload `folder` to it in one commit; returns the commit URL.
    Raises one of `UPLOAD_ERRORS` on failure."""
    api = HfApi(token=token)
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    commit = api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model",
                               commit_message=commit_message)
    return str(getattr(commit, "commit_url", commit))


__all__ = ["save_for_hub", "add_translation_pipeline", "check_hub_folder", "missing_hub_files", "stage_for_hub", "resolve_token",
           "upload_to_hub", "UPLOAD_ERRORS"]
