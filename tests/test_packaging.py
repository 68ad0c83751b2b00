"""What `pip install` ships: a wheel carries every file the package reads at run time, and a wheel-installed copy
(not the repository's source tree) trains to the end, model card included."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vanilla_transformer"


def package_data_files() -> set[str]:
    """Every file of the source package that is not Python code, as a path inside the wheel."""
    return {path.relative_to(ROOT).as_posix() for path in PACKAGE.rglob("*")
            if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The package built into a wheel from a copy of the sources (the checkout is left as it is) and installed,
    without its dependencies (they are this environment's), into a folder of its own."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    source.mkdir()
    for name in ("setup.py", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(PACKAGE, source / PACKAGE.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(work / "dist"), str(source)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = (work / "dist").glob("vanilla_transformer-*.whl")
    site = work / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target",
                              str(site), str(wheel)], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    return wheel, site


def test_the_wheel_carries_the_model_card_template_and_every_other_data_file(installed):
    wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    data = package_data_files()
    assert "vanilla_transformer/tools/model_card_template.md" in data
    assert data <= names, sorted(data - names)


def test_a_wheel_installed_package_trains_to_the_end_and_writes_its_card(installed, tmp_path):
    _, site = installed
    output = tmp_path / "run"
    # A fresh interpreter whose only copy of the package is the installed one: no checkout on sys.path.
    runner = ("import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); import vanilla_transformer; "
              "print('PACKAGE', vanilla_transformer.__file__); sys.argv = sys.argv[1:]; "
              "runpy.run_path(sys.argv[0], run_name='__main__')")
    command = [sys.executable, "-c", runner, str(site), str(ROOT / "scripts" / "train.py"), "--output_dir",
               str(output), "--preset", "tiny", "--vocab_size", "300", "--max_train_samples", "200",
               "--max_eval_samples", "4", "--per_device_train_batch_size", "16", "--max_steps", "2",
               "--eval_strategy", "no", "--save_strategy", "no", "--report_to", "none", "--noam_warmup_steps", "2"]
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    environment.pop("PYTHONPATH", None)
    result = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    package_file = Path(result.stdout.split("PACKAGE ", 1)[1].split("\n", 1)[0])
    assert site in package_file.parents, package_file  # the installed copy ran, not the checkout
    card = (output / "README.md").read_text(encoding="utf-8")
    assert card.startswith("---\n") and "pipeline_tag: translation" in card
    assert json.loads((output / "results.json").read_text())["test"]["num_sentences"] == 4
