"""What the two exports (`ctranslate2`, `onnx`) share: the optional package each one needs, imported only where it
is used (`require`); the record every export folder keeps of how the model decodes (`vanilla_transformer_export.json`),
which the engine reads back so that an export decodes as the model's `generate()` would; and the command line of
their scripts (`ExportCommand`)."""

import argparse
import json
import os
from pathlib import Path

from .folders import check_output_dir

EXPORT_RECORD = "vanilla_transformer_export.json"
# The extras of setup.py, by the name users install them with.
EXTRAS = {"ctranslate2": ("ctranslate2",), "onnx": ("onnx", "onnxscript", "onnxruntime")}


def require(module: str, extra: str, purpose: str):
    """Import the optional package `module` of the `extra`, or say how to install it."""
    try:
        return __import__(module)
    except ImportError as error:
        raise ImportError(f"{purpose} needs {module}: pip install 'vanilla-transformer[{extra}]' "
                          f"(or: pip install {' '.join(EXTRAS[extra])})") from error


def decoding_record(model) -> dict:
    """The model's decoding settings (its generation config and special ids) as an export records them."""
    config, generation = model.config, model.generation_config
    return {"decoder_start_token_id": config.first_decoder_token_id, "eos_token_id": config.eos_token_id,
            "pad_token_id": config.pad_token_id, "num_beams": generation.num_beams or 1,
            "length_penalty": 1.0 if generation.length_penalty is None else generation.length_penalty,
            "length_penalty_type": getattr(generation, "length_penalty_type", "hf"),
            "early_stopping": generation.early_stopping, "max_new_tokens": generation.max_new_tokens,
            "max_new_tokens_over_input": getattr(generation, "max_new_tokens_over_input", None),
            "max_length": generation.max_length or 20}


def export_languages(model_or_dir, languages=None) -> list[str] | None:
    """The [source, target] an export records: `languages` as given, else the pair of the saved folder's model card
    (scripts/train.py writes one), else None (the server then asks for --languages)."""
    if languages is not None:
        languages = list(languages)
        if len(languages) != 2 or not all(isinstance(code, str) and code for code in languages):
            raise ValueError(f"languages={languages!r}: give two language codes, source and target, e.g. ['en', 'de']")
        return languages
    if isinstance(model_or_dir, (str, os.PathLike)) and Path(model_or_dir).is_dir():
        from .model_card import card_languages

        pair = card_languages(model_or_dir)
        return list(pair) if pair else None
    return None


def write_export_record(folder: str | os.PathLike, model, engine: str, quantization: list[str],
                        languages: list[str] | None = None, **details) -> dict:
    """Write the record of an export for `engine` ("ctranslate2" or "onnxruntime") of `model`: the weights'
    quantizations, the language pair (None where unknown), the engine-specific `details`, the decoding settings and
    the versions it was written with."""
    import torch

    record = {"engine": engine, "quantization": quantization, "languages": languages, **details,
              "decoding": decoding_record(model), "versions": {"torch": torch.__version__}}
    extra = "ctranslate2" if engine == "ctranslate2" else "onnx"
    record["versions"].update({module: __import__(module).__version__ for module in EXTRAS[extra]})
    (Path(folder) / EXPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return record


def read_export_record(folder: str | os.PathLike, engine: str) -> dict:
    """The record of an export folder written for `engine`; a clear error for any other folder."""
    path = Path(folder) / EXPORT_RECORD
    writer = {"ctranslate2": "scripts/export_ctranslate2.py", "onnxruntime": "scripts/export_onnx.py"}[engine]
    if not path.is_file():
        raise FileNotFoundError(f"{folder} has no {EXPORT_RECORD}: not an export folder ({writer} writes one).")
    record = json.loads(path.read_text())
    if record.get("engine") != engine or "decoding" not in record:
        raise ValueError(f"{folder} is not an export for {engine} (its {EXPORT_RECORD} says "
                         f"{record.get('engine', 'nothing of the engine')}); export the model again with {writer}.")
    return record


def describe_folder(folder: str | os.PathLike) -> dict:
    """What serving a folder needs to know, read from the folder alone: {"engine": "transformers" for a saved model,
    else the export's engine, "quantization": the export's weights ([] for a saved model), "languages": the recorded
    or card-declared [source, target], or None, "max_positions": the longest input an export takes, or None}."""
    folder = Path(folder)
    if (folder / EXPORT_RECORD).is_file():
        record = json.loads((folder / EXPORT_RECORD).read_text())
        return {"engine": record.get("engine"), "quantization": record.get("quantization", []),
                "languages": record.get("languages"), "max_positions": record.get("max_positions")}
    from .model_card import card_languages

    pair = card_languages(folder)
    return {"engine": "transformers", "quantization": [], "languages": list(pair) if pair else None,
            "max_positions": None}


class ExportCommand(argparse.ArgumentParser):
    """The command line of an export script: --model (a saved folder), --output_dir (a new folder) and --no_verify,
    refused by name before anything is loaded or written; the script adds its own flags. `write` runs the export
    and prints the folder, or exits 1 with the reason nothing was written."""

    def __init__(self, description: str, output_help: str, verify_help: str):
        super().__init__(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
        self.add_argument("--model", required=True, help="A folder saved by scripts/train.py (model and tokenizer).")
        self.add_argument("--output_dir", required=True, help=output_help)
        self.add_argument("--no_verify", action="store_true", help=verify_help)
        self.add_argument("--languages", nargs=2, metavar=("SOURCE", "TARGET"), default=None,
                          help="The pair the export records for scripts/serve.py (default: the model card's).")

    def parse_args(self, args=None, namespace=None):
        parsed = super().parse_args(args, namespace)
        if not (Path(parsed.model) / "config.json").is_file():
            self.error(f"--model {parsed.model}: not a saved model folder (no config.json there)")
        try:
            check_output_dir(parsed.output_dir)
        except ValueError as error:
            self.error(f"--output_dir {error}")
        return parsed

    def write(self, export, *args, **kwargs):
        """`export(*args, **kwargs)`; a ValueError (what the export cannot express, or a failed verification:
        nothing was written) ends the command with its message."""
        try:
            folder = export(*args, **kwargs)
        except ValueError as error:
            self.exit(1, f"{self.prog}: error: {error}\n")
        print(f"wrote {folder}")


__all__ = ["EXPORT_RECORD", "require", "decoding_record", "export_languages", "write_export_record",
           "read_export_record", "describe_folder", "ExportCommand"]
