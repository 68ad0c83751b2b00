"""Upload a saved model folder to the Hugging Face Hub, with its model card, through a staging copy.

    python scripts/push_to_hub.py --model_dir runs/base/averaged --repo_id my-org/transformer-base-en-de \\
        --card_results eval_results.json --languages en de --license apache-2.0 --dataset_name "WMT14 en-de"
    python scripts/push_to_hub.py --model_dir runs/base/averaged --repo_id my-org/x --dry_run

The model folder is only read: its top-level files are copied to a staging folder, which gets the translation
pipeline (if it was saved without it) and the model card, and is checked for completeness before anything is
uploaded. --dry_run keeps the staging folder (default <model_dir>-hub-dry-run) instead of uploading.

--card_results is a JSON file with the scores, as `vanilla_transformer.training.metrics.corpus_scores` returns them
(bleu, bleu_signature, chrf, chrf_signature; optionally dataset_split, dataset_config, dataset_type, decoding),
and optionally the card's other fields (languages, license, datasets, dataset_name, training_summary,
base_model), which the flags below override. The card is rendered when results or card flags are given, or
when the folder has no README.md; otherwise the folder's README.md is uploaded as it is.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from vanilla_transformer.tools.hub import UPLOAD_ERRORS, resolve_token, stage_for_hub, upload_to_hub

CARD_FIELDS = ("languages", "license", "datasets", "dataset_name", "training_summary", "base_model")


def card_arguments(args) -> dict | None:
    """render_model_card's keyword arguments from --card_results and the flags, or None to keep the folder's card."""
    results = {}
    if args.card_results:
        try:
            results = json.loads(Path(args.card_results).read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ValueError(f"--card_results {args.card_results} is not valid JSON ({error})") from None
        if not isinstance(results, dict):
            raise ValueError(f"--card_results {args.card_results} must hold a JSON object")
    fields = {key: results.pop(key) for key in CARD_FIELDS if key in results}
    fields.update({key: getattr(args, key) for key in CARD_FIELDS if getattr(args, key) is not None})
    if not results and not fields and (Path(args.model_dir) / "README.md").is_file():
        return None
    return {"languages": fields.get("languages"), "license": fields.get("license"),
            "datasets": fields.get("datasets"), "dataset_name": fields.get("dataset_name"),
            "training_summary": fields.get("training_summary") or "", "base_model": fields.get("base_model"),
            "eval_results": results or None, "repo_id": args.repo_id}


def list_files(folder: Path, files: list[str]) -> str:
    sizes = [(folder / name).stat().st_size for name in files]
    lines = [f"{size:>14,}  {name}" for size, name in zip(sizes, files)]
    return "\n".join(lines + [f"{sum(sizes):>14,}  total ({len(files)} files)"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_dir", required=True, help="folder written by save_for_hub or save_pretrained")
    parser.add_argument("--repo_id", required=True, help="target repository, org/name")
    parser.add_argument("--private", action="store_true", help="create the repository as private")
    parser.add_argument("--token", help="Hub token with write access (default: HF_TOKEN or `hf auth login`)")
    parser.add_argument("--dry_run", action="store_true",
                        help="stage and check, write the staging folder to --dry_run_dir, upload nothing")
    parser.add_argument("--dry_run_dir", help="default: <model_dir>-hub-dry-run")
    parser.add_argument("--card_results", help="JSON with the scores (and card fields) for the model card")
    parser.add_argument("--languages", nargs="+", help="ISO 639 codes, source then target: en de")
    parser.add_argument("--license", help="Hub license id, e.g. apache-2.0")
    parser.add_argument("--datasets", nargs="+", help="Hub dataset ids the model was trained on")
    parser.add_argument("--dataset_name", help="readable name of the test set of --card_results")
    parser.add_argument("--training_summary", help="training data and recipe, a few sentences of Markdown")
    parser.add_argument("--base_model", help="Hub id of the model this one was fine-tuned from")
    args = parser.parse_args(argv)

    model_dir = Path(args.model_dir)
    try:
        token = None if args.dry_run else resolve_token(args.token)
        card = card_arguments(args)
        if args.dry_run:
            dry_run_dir = Path(args.dry_run_dir or f"{os.path.normpath(model_dir)}-hub-dry-run")
            target = dry_run_dir.resolve()
            if target == model_dir.resolve() or model_dir.resolve() in target.parents:
                raise ValueError(f"--dry_run_dir {dry_run_dir} must lie outside --model_dir {model_dir}")
            if target.exists() and any(target.iterdir()):
                raise ValueError(f"--dry_run_dir {dry_run_dir} exists and is not empty; remove it or choose another")
        with tempfile.TemporaryDirectory(prefix="hub-staging-") as tmp:
            staging = Path(tmp) / "staging"
            files = stage_for_hub(model_dir, staging, card=card)
            if args.dry_run:
                shutil.copytree(staging, dry_run_dir, dirs_exist_ok=True)
                print(f"Dry run: {args.repo_id} would receive these files, staged in {dry_run_dir}:")
                print(list_files(dry_run_dir, files))
                return 0
            try:
                url = upload_to_hub(staging, args.repo_id, token=token, private=args.private)
            except UPLOAD_ERRORS as error:
                print(f"error: upload to {args.repo_id} failed: {type(error).__name__}: {error}\n"
                      f"Nothing in {model_dir} was changed.", file=sys.stderr)
                return 1
    except (ValueError, FileNotFoundError) as error:
        parser.error(str(error))
    print(f"Uploaded {len(files)} files to {args.repo_id}: {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
