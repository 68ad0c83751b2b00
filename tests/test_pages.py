"""Pages cannot drift: every figure a page quotes agrees with the committed results file that measured it, no results
file is older than a change to the code it measured, every flag
a page passes exists in the parser it reaches, every relative link and anchor resolves, every commit named is in the
history; and the README stays a page a newcomer reads in five minutes. Each check is also shown failing on a planted
error, so that none of them passes by checking nothing."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from scripts.utils import page_checks, pages

README = pages.ROOT / "README.md"


def test_every_page_and_report_agrees_with_its_results():
    assert pages.disagreements() == []


def test_a_wrong_figure_on_a_page_is_caught(tmp_path):
    text = README.read_text(encoding="utf-8")
    block = pages.BLOCK.search(text)
    figure = re.search(r"\d+\.\d\d", block["body"])
    planted = text[:block.start("body") + figure.start()] + "12.34" + text[block.start("body") + figure.end():]
    (tmp_path / "README.md").write_text(planted, encoding="utf-8")
    found = pages.disagreements(root=tmp_path)
    assert any(line.startswith("README.md:") for line in found), found


def test_a_new_result_changes_the_page(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(pages.RESULTS, results)
    bench = json.loads((results / "results_small.json").read_text())
    bench["ratios"]["beam_speed_vs_marian"] = 9.99
    (results / "results_small.json").write_text(json.dumps(bench))
    rendered = pages.render_page(README.read_text(encoding="utf-8"), results)
    assert "9.99×" in rendered and rendered != README.read_text(encoding="utf-8")


def test_a_block_with_no_renderer_is_refused():
    with pytest.raises(KeyError, match="no_such_block"):
        pages.render_page("<!-- rendered: no_such_block -->\n<!-- end: no_such_block -->\n")


def test_every_flag_on_every_page_exists():
    assert page_checks.wrong_flags() == []


def test_a_misspelt_flag_is_caught(tmp_path):
    shutil.copytree(pages.ROOT / "scripts", tmp_path / "scripts",
                    ignore=shutil.ignore_patterns("results", "node_modules"))
    (tmp_path / "README.md").write_text(
        "```bash\n.venv/bin/python scripts/train.py --output_dir x \\\n    --no_such_flag 3\n```\n"
        "Inline: `python -m scripts.benchmarks.engines --model m --cpu-smoke`, and `--also_not_a_flag 1`.\n",
        encoding="utf-8")
    found = "\n".join(line for line in page_checks.wrong_flags(root=tmp_path) if line.startswith("README.md"))
    for flag in ("--no_such_flag", "--cpu-smoke", "--also_not_a_flag"):
        assert f"{flag} (in" in found
    assert "no --output_dir" not in found and "no --model " not in found


def test_every_relative_link_and_anchor_resolves():
    assert page_checks.broken_links() == []


def test_a_broken_link_or_anchor_is_caught(tmp_path):
    (tmp_path / "other.md").write_text("# Some heading: with punctuation\n", encoding="utf-8")
    (tmp_path / "README.md").write_text(
        "[fine](other.md#some-heading-with-punctuation) [gone](missing.md) [bad anchor](other.md#nowhere) "
        "[web](https://example.org/x)\n", encoding="utf-8")
    found = "\n".join(page_checks.broken_links(root=tmp_path))
    assert "missing.md" in found and "#nowhere" in found
    assert "some-heading" not in found and "example.org" not in found


def _is_full_clone() -> bool:
    shallow = subprocess.run(["git", "-C", str(pages.ROOT), "rev-parse", "--is-shallow-repository"],
                             capture_output=True, text=True)
    return shallow.returncode == 0 and shallow.stdout.strip() == "false"


@pytest.mark.skipif(not _is_full_clone(), reason="needs the repository's full history (a clone, not shallow)")
def test_every_commit_named_exists():
    assert page_checks.named_commits(), "the pages name commits: the pattern must find them"
    assert page_checks.missing_commits() == []


@pytest.mark.skipif(not _is_full_clone(), reason="needs the repository's full history (a clone, not shallow)")
def test_a_commit_not_in_the_history_is_caught(tmp_path):
    head = subprocess.run(["git", "-C", str(pages.ROOT), "rev-parse", "--short=7", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    (tmp_path / "README.md").write_text(f"Measured at {head}, then at 0123abc; upstream mosesdecoder@3a0631a.\n",
                                        encoding="utf-8")
    assert set(page_checks.named_commits(tmp_path)) == {head, "0123abc"}
    missing = page_checks.missing_commits(tmp_path, repository=pages.ROOT)
    assert len(missing) == 1 and "0123abc" in missing[0]


@pytest.mark.skipif(not _is_full_clone(), reason="needs the repository's full history (a clone, not shallow)")
def test_no_figure_comes_from_code_changed_since_it_was_measured():
    assert pages.stale_figures() == []


def _planted(tmp_path, **environment):
    """The README and a copy of the results whose peer benchmark says it measured `environment`."""
    results = tmp_path / "results"
    shutil.copytree(pages.RESULTS, results)
    bench = json.loads((results / "results_small.json").read_text())
    bench["environment"].update(environment)
    (results / "results_small.json").write_text(json.dumps(bench))
    shutil.copy(README, tmp_path / "README.md")
    return pages.stale_figures(root=tmp_path, results=results)


@pytest.mark.skipif(not _is_full_clone(), reason="needs the repository's full history (a clone, not shallow)")
def test_a_figure_measured_before_its_code_changed_is_caught(tmp_path):
    # 9a2ad7c changed the model's dropout after bf1762e: a peer benchmark of bf1762e's model is stale.
    found = _planted(tmp_path, commit="bf1762e", measures=["vanilla_transformer/modeling_vanilla_transformer.py"])
    glance = [line for line in found if line.startswith("README.md: block `glance`")]
    assert len(glance) == 1 and "results_small.json measured bf1762e" in glance[0], found
    assert "vanilla_transformer/modeling_vanilla_transformer.py changed" in glance[0]
    assert any(line.startswith("results/results_small.md: stale") for line in found), found
    # The same file measuring code nothing has changed since is current.
    assert _planted(tmp_path / "current", commit="bf1762e", measures=["model_cards/README.md"]) == []


@pytest.mark.parametrize("environment, message", [
    ({"commit": "bf1762e+"}, "measured at bf1762e+: not a commit"),
    ({"measures": []}, "names no code it measured"),
])
def test_a_figure_from_uncommitted_or_unnamed_code_is_caught(tmp_path, environment, message):
    found = _planted(tmp_path, **environment)
    assert any(line.startswith("README.md: block `glance`") and message in line for line in found), found


# The README as a product page (issue 64's targets).
README_FIGURES_ALLOWED = {"3.10", "2.6", "5.23", "2.13.0", "0.02", "0.6", "1706.03762"}


def _readme_prose() -> str:
    text = pages.BLOCK.sub("", README.read_text(encoding="utf-8"))
    return page_checks.FENCE.sub("", text)


def test_the_readme_quotes_no_figure_outside_its_rendered_blocks():
    figures = set(re.findall(r"(?<![\w.§-])\d+\.\d+(?:\.\d+)?", _readme_prose()))
    assert figures <= README_FIGURES_ALLOWED, (
        f"typed figures {sorted(figures - README_FIGURES_ALLOWED)}: render them from results "
        "(scripts/utils/pages.py) or, for a constant of the paper or a version, allow them here")


def test_the_readme_reads_in_five_minutes():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150
    assert lines.index("<!-- rendered: glance -->") < 40, "the first result within the first 40 lines"
    prose = "\n".join(line for line in _readme_prose().splitlines() if not line.startswith(("|", "#", "!")))
    sentences = [sentence for paragraph in re.split(r"\n\s*\n", prose)
                 for sentence in re.split(r"(?<=[.!?:])\s+(?=[A-Z`*(\[])", " ".join(paragraph.split()))]
    long = [s for s in sentences if len(s.split()) > 60]
    assert long == [], long


def test_the_readme_python_runs_as_written(tmp_path):
    """The README's Python blocks, in order, on a folder laid out as `make demo` leaves it (a tiny model here)."""
    from conftest import confident_model, tiny_tokenizer

    from vanilla_transformer.tools.hub import save_for_hub

    folder = tmp_path / "demo_output" / "model"
    save_for_hub(confident_model(), tiny_tokenizer(), folder)
    code = "\n".join(re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL))
    assert "demo_output/model" in code and "Seq2SeqTrainer" in code
    (tmp_path / "snippets.py").write_text(code, encoding="utf-8")
    run = subprocess.run([sys.executable, "snippets.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "runs" / "finetune").is_dir()
