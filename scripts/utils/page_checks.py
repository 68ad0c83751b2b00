"""The pages' other promises, checked by `python -m scripts.utils.pages --check`: every flag a page passes to a project
script exists in the parser it reaches, every relative link and #anchor resolves, and every commit a page or a results
file names is in the repository's history."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.MULTILINE)
COMMIT = re.compile(r"(?<![\w/.@+-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w.-])")
SCRIPT = re.compile(r"^(?:\./)?(scripts/[\w/]+\.(?:py|sh))$")


def markdown_pages(root: Path = ROOT) -> list[Path]:
    """Every page a person reads: the READMEs and reports (the model card template is filled in, not read)."""
    return sorted(path for path in root.glob("**/*.md") if not _ignored(path.relative_to(root)))


def _ignored(relative: Path) -> bool:
    parts = relative.parts
    return (parts[0].startswith(".") or "node_modules" in parts or parts[0] in ("runs", "demo_output", "build")
            or relative.name == "model_card_template.md" or parts[:2] == ("tests", "upstream"))


def _prose(text: str) -> str:
    return FENCE.sub("", text)


def command_lines(text: str) -> list[str]:
    """Commands a page shows: lines of its code blocks (continuations joined) and inline code spans."""
    commands = []
    for block in FENCE.findall(text):
        commands += [line.split(" #")[0].strip() for line in block.replace("\\\n", " ").splitlines()]
    commands += INLINE_CODE.findall(_prose(text))
    return [command for command in commands if command]


def _script_and_flags(command: str, root: Path) -> tuple[str, list[str]] | None:
    """The project script a command runs (a path or `-m scripts.…`) and the flags given to it, or None."""
    words = command.replace("=", " ").split()
    for i, word in enumerate(words):
        module = words[i + 1] if word == "-m" and i + 1 < len(words) else None
        if module and re.fullmatch(r"scripts(\.[a-z_]+)+", module):  # not a placeholder such as scripts.NAME
            script = module.replace(".", "/") + ".py"
        elif SCRIPT.match(word):
            script = SCRIPT.match(word)[1]
        else:
            continue
        return (script if (root / script).is_file() else f"{script} (missing)",
                [w for w in words[i + 1:] if w.startswith("--") and len(w) > 2])
    return None


def known_flags(script: str, root: Path = ROOT, cache: dict | None = None) -> set[str]:
    """The flags `script --help` lists; a recipe that passes the rest on to scripts/train.py accepts its flags too,
    and a shell wrapper accepts those of the script it runs."""
    cache = {} if cache is None else cache
    if script in cache:
        return cache[script]
    source = (root / script).read_text(encoding="utf-8")
    if script.endswith(".sh"):
        wrapped = SCRIPT.match(next(w for w in source.split() if SCRIPT.match(w) and w != script))[1]
        flags = known_flags(wrapped, root, cache)
    else:
        flags = _help_flags(script, root)
        if "parse_known_args" in source:
            flags |= known_flags("scripts/train.py", root, cache)
    cache[script] = flags
    return flags


def _help_flags(script: str, root: Path) -> set[str]:
    import contextlib
    import io
    import runpy
    import warnings

    out, argv = io.StringIO(), sys.argv
    sys.argv = [script, "--help"]
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module was imported before, as here
            runpy.run_module(script.removesuffix(".py").replace("/", "."), run_name="__main__")
    finally:
        sys.argv = argv
    return set(re.findall(r"(?<![\w-])--[A-Za-z][\w-]*", out.getvalue()))


def launcher_flags() -> set[str]:
    """Flags of the launchers the pages put before a script: accelerate launch and torchrun."""
    from accelerate.commands.launch import launch_command_parser
    from torch.distributed.run import get_args_parser

    return {option for parser in (launch_command_parser(), get_args_parser()) for action in parser._actions
            for option in action.option_strings if option.startswith("--")}


def wrong_flags(root: Path = ROOT) -> list[str]:
    """Each flag a page passes to a project script that the script does not know, and each inline flag (`--x`) no
    project script or launcher knows."""
    cache, found, everything = {}, [], None
    for page in markdown_pages(root):
        if page.parent.name == "results":  # a report quotes the command as it ran then
            continue
        text = page.read_text(encoding="utf-8")
        for command in command_lines(text):
            target = _script_and_flags(command, root)
            if target is not None:
                script, flags = target
                if script.endswith("(missing)"):
                    found.append(f"{page.relative_to(root)}: `{command}` runs {script}")
                    continue
                found += [f"{page.relative_to(root)}: {script} has no {flag} (in `{command}`)"
                          for flag in flags if flag not in known_flags(script, root, cache)]
            elif command.startswith("--"):
                if everything is None:
                    scripts = sorted({str(p.relative_to(root)) for p in root.glob("scripts/**/*.py")
                                      if "__" not in p.name and "def main" in p.read_text(encoding="utf-8")})
                    everything = launcher_flags().union(*(known_flags(s, root, cache) for s in scripts))
                flag = command.split()[0].split("=")[0]
                if flag not in everything:
                    found.append(f"{page.relative_to(root)}: no script or launcher knows {flag} (in `{command}`)")
    return found


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def broken_links(root: Path = ROOT) -> list[str]:
    """Each relative link whose file, or whose #anchor among that file's headings, does not exist."""
    found = []
    for page in markdown_pages(root):
        for target in LINK.findall(_prose(page.read_text(encoding="utf-8"))):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                found.append(f"{page.relative_to(root)}: link to {target}: no such file")
            elif anchor and linked.suffix == ".md":
                anchors = {github_anchor(h) for h in HEADING.findall(_prose(linked.read_text(encoding="utf-8")))}
                if anchor not in anchors:
                    found.append(f"{page.relative_to(root)}: link to {target}: no heading #{anchor} there")
    return found


def named_commits(root: Path = ROOT) -> dict[str, set[str]]:
    """Every commit a page or a results file names, with where (a hash after `@` or `/` is another repository's)."""
    named = {}
    for path in [*markdown_pages(root), *sorted((root / "scripts" / "benchmarks" / "results").glob("*.json"))]:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            text = " ".join(re.findall(r'"commit": "([0-9a-f]+)\+?"', text))
        for commit in COMMIT.findall(text):
            named.setdefault(commit, set()).add(str(path.relative_to(root)))
    return named


def missing_commits(root: Path = ROOT, repository: Path = ROOT) -> list[str]:
    found = []
    for commit, where in sorted(named_commits(root).items()):
        exists = subprocess.run(["git", "-C", str(repository), "cat-file", "-e", f"{commit}^{{commit}}"],
                                capture_output=True).returncode == 0
        if not exists:
            found.append(f"{', '.join(sorted(where))}: commit {commit} is not in this repository's history")
    return found
