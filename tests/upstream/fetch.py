#!/usr/bin/env python
"""Fetches transformers' own common model tests for the transformers installed here: `ModelTesterMixin`
(tests/test_modeling_common.py) and `ConfigTester` (tests/test_configuration_common.py), the harness transformers
runs on every in-tree model, MarianMTModel included. They come from that version's source distribution, downloaded by
pip, into tests/upstream/transformers_tests/ (ignored by git); tests/test_transformers_common.py
runs them on this model. `make test` runs this script; run it again after changing transformers.

The sdist ships those two files but not the three modules they import, so those are stood in for, and what they
would have run is not run here: generation/test_utils.py (`GenerationTesterMixin`; tests/test_modeling.py checks
cached against uncached decoding, static caches, beam search and sampling), exporters/test_export.py
(`ExportTesterMixin`; tests/test_onnx.py and tests/test_ctranslate2.py check our exports against the model) and
utils/test_configuration_utils.py (only its `config_common_kwargs` is used, copied below from transformers' tree)."""

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import transformers

PACKAGE = Path(__file__).resolve().parent / "transformers_tests"
FILES = ("test_modeling_common.py", "test_configuration_common.py")
STAND_INS = {
    "exporters/test_export.py": '''class ExportTesterMixin:
    """Stands in for transformers' export tests, which its sdist does not ship (see tests/upstream/fetch.py)."""
''',
    "generation/test_utils.py": '''class GenerationTesterMixin:
    """Stands in for transformers' generation tests, which its sdist does not ship (see tests/upstream/fetch.py)."""
''',
    "utils/test_configuration_utils.py": '''# From transformers' tests/utils/test_configuration_utils.py (Apache-2.0), which its sdist does not ship.
config_common_kwargs = {
    "return_dict": False,
    "output_hidden_states": True,
    "output_attentions": True,
    "dtype": "float16",
    "chunk_size_feed_forward": 5,
    "architectures": ["BertModel"],
    "id2label": {0: "label"},
    "label2id": {"label": "0"},
    "problem_type": "regression",
}
''',
}


def sdist(version: str, folder: Path) -> Path:
    """The source distribution of transformers `version`, downloaded by pip from the index pip is configured with
    (PyPI by default; pip checks the hash the index gives)."""
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
               "--no-build-isolation", f"transformers=={version}", "--dest", str(folder)]
    if subprocess.run(command).returncode != 0:
        sys.exit(f"pip could not download the source distribution of transformers {version}: its common tests "
                 "cannot be fetched")
    return next(folder.glob("transformers-*.tar.gz"))


def extract(archive_path: Path, version: str) -> dict[str, bytes]:
    """The common test files, by name, from the sdist's top-level tests/ folder."""
    with tarfile.open(archive_path) as archive:
        members = {Path(member.name).name: member for member in archive.getmembers()
                   if Path(member.name).parent == Path(f"transformers-{version}", "tests")
                   and Path(member.name).name in FILES}
        missing = sorted(set(FILES) - set(members))
        if missing:
            sys.exit(f"{archive_path.name} has no tests/{missing[0]}: transformers' common tests cannot be run "
                     f"for {version}")
        return {name: archive.extractfile(member).read() for name, member in members.items()}


def main():
    version = transformers.__version__
    with tempfile.TemporaryDirectory() as folder:
        archive_path = sdist(version, Path(folder))
        sources = extract(archive_path, version)
    PACKAGE.mkdir(parents=True, exist_ok=True)
    for subpackage in ("", "exporters", "generation", "utils"):
        (PACKAGE / subpackage).mkdir(exist_ok=True)
        (PACKAGE / subpackage / "__init__.py").write_text("")
    for name, source in sources.items():
        (PACKAGE / name).write_bytes(source)
    for name, source in STAND_INS.items():
        (PACKAGE / name).write_text(source)
    (PACKAGE / "VERSION").write_text(f"{version}\n{archive_path.name}\n")
    print(f"transformers {version}'s common model tests, from {archive_path.name}, in {PACKAGE}")


if __name__ == "__main__":
    main()
