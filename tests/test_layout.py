"""The package shows its tiers: the files the Hub serves (HUB_FILES) import only torch, transformers, the standard
library and each other; `data` and `tools` build on them and not on each other's or the recipe's modules; the
recipe (`training`) uses all three; nothing in the package imports a script. The built-in task loads only where
it is used."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vanilla_transformer"
HUB_FILES = ("configuration_vanilla_transformer", "modeling_vanilla_transformer", "support_vanilla_transformer",
             "pipeline_vanilla_transformer")
# What each tier may import of the package (besides itself).
ALLOWED = {"hub": {"hub"}, "data": {"hub", "data"}, "tools": {"hub", "tools"},
           "training": {"hub", "data", "tools", "training"}}


def tier(module: str) -> str:
    """The tier of `vanilla_transformer.<...>` named by its dotted path inside the package."""
    first = module.split(".")[0]
    return "hub" if first in HUB_FILES or first in ("", "__init__") else first


def imports_of(path: Path) -> list[str]:
    """The package modules that `path` imports, as dotted paths inside the package (relative imports resolved)."""
    inside = path.relative_to(PACKAGE).with_suffix("").parts
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(inside[:-1])[: len(inside) - node.level]
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            found += [f"{module}.{alias.name}" if not node.module else module for alias in node.names]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module] if isinstance(node, ast.ImportFrom) else [alias.name for alias in node.names]
            found += [name.split(".", 1)[1] for name in names if name and name.startswith("vanilla_transformer.")]
    return found


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_each_module_imports_only_the_tiers_beneath_it(path):
    own = tier(".".join(path.relative_to(PACKAGE).with_suffix("").parts))
    for module in imports_of(path):
        assert tier(module) in ALLOWED[own], f"{path.relative_to(ROOT)} ({own}) imports {module} ({tier(module)})"


@pytest.mark.parametrize("name", HUB_FILES)
def test_the_hub_served_files_import_only_torch_transformers_the_standard_library_and_each_other(name):
    tree = ast.parse((PACKAGE / f"{name}.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            assert node.module in HUB_FILES, f"{name} imports .{node.module}"
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for module in [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]:
                top = module.split(".")[0]
                assert top in {"torch", "transformers", "__future__"} or top in sys.stdlib_module_names, \
                    f"{name} imports {module}"


def test_the_built_in_task_is_imported_only_where_it_is_used():
    code = ("import sys, vanilla_transformer.training, vanilla_transformer.data, vanilla_transformer.tools.hub; "
            "print('vanilla_transformer.data.builtin_task' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert result.stdout.strip() == "False"


def test_nothing_in_the_package_imports_a_script():
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0):
                names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                assert not any(n and n.split(".")[0] in {"scripts", "benchmarks", "tests"} for n in names), path


def import_graph() -> dict[str, set[str]]:
    """Each module of the package (a subpackage by its folder's dotted path, the package itself as "") and the
    modules of the package it imports, anywhere in its code (an import inside a function closes a circle too)."""
    paths = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def module_of(name: str) -> str:  # `from . import x` names x, a module or a name its package defines
        name = name.strip(".")
        while name not in paths:
            name = name.rpartition(".")[0]
        return name

    return {module: {module_of(name) for name in imports_of(path)} - {module} for module, path in paths.items()}


def import_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """A path of imports from a module back to itself, or None."""
    state = {}

    def visit(path):
        state[path[-1]] = "open"
        for imported in sorted(graph[path[-1]]):
            if state.get(imported) == "open":
                return path[path.index(imported):] + [imported]
            if imported not in state and (circle := visit(path + [imported])):
                return circle
        state[path[-1]] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (circle := visit([module])):
            return circle
    return None


def test_no_module_of_the_package_imports_itself_back_through_others():
    circle = import_circle(import_graph())
    assert circle is None, "an import circle: " + " -> ".join(f"vanilla_transformer.{m}".rstrip(".") for m in circle)
