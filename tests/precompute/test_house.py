"""The house's rules, checked on the source: small modules, layers that point down, and a README
that names every module and shows every setting as the code declares it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from precompute.cli import inputs_table
from precompute.cli.settings_table import BEGIN, END, markdown

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("precompute", "models", "jobs", "stores", "flows", "lookup", "bench")
"""The source folders: `precompute` is the import root, the others install under it."""
BELOW_THE_CLI = ("models", "jobs", "stores", "flows", "lookup")
MAX_LINES = 400


def modules() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_is_small(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= MAX_LINES


def test_nothing_below_the_cli_imports_it() -> None:
    upward = {
        str(path.relative_to(ROOT)): sorted(n for n in imported(path) if n.startswith("precompute.cli"))
        for folder in BELOW_THE_CLI
        for path in (ROOT / folder).rglob("*.py")
    }
    assert {module: names for module, names in upward.items() if names} == {}


def holds_code(path: Path) -> bool:
    """More than a docstring: a package's `__init__.py` that only says what the package is needs no row."""
    body = ast.parse(path.read_text()).body
    return len(body) > (1 if body and isinstance(body[0], ast.Expr) else 0)


def test_the_readme_names_every_module() -> None:
    readme = (ROOT / "README.md").read_text()
    unnamed = [
        str(p.relative_to(ROOT)) for p in modules() if holds_code(p) and f"`{p.relative_to(ROOT)}`" not in readme
    ]
    assert unnamed == []


def test_the_readme_shows_what_inputs_the_checks_accept() -> None:
    readme = (ROOT / "README.md").read_text()
    shown = readme[readme.index(inputs_table.BEGIN) + len(inputs_table.BEGIN) : readme.index(inputs_table.END)]
    assert shown.strip() == inputs_table.markdown(), "the README's inputs table is stale: paste `precompute inputs` in"


def test_the_readme_shows_every_setting_as_the_code_declares_it() -> None:
    readme = (ROOT / "README.md").read_text()
    shown = readme[readme.index(BEGIN) + len(BEGIN) : readme.index(END)].strip()
    assert shown == markdown(), "the README's settings table is stale: paste `precompute settings` in"
