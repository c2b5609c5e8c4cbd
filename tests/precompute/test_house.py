"""The house's rules, checked on the source: packages in layers that point down, no import cycle,
modules and packages of a readable size, and comments that state rules rather than one machine's
measurements.

The import graph is grimp's reading of every import, also those inside functions and under
TYPE_CHECKING: a cycle hidden behind a function-level import is still a cycle to a reader.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "precompute"
LAYERS = (
    grimp.Layer("__main__", "cli", independent=False),
    grimp.Layer("bench"),
    grimp.Layer("flows", "service"),
    grimp.Layer("pipeline"),
    grimp.Layer("kinds"),
    grimp.Layer("settings"),
    grimp.Layer("jobs", "lookup", "demo_data"),
    grimp.Layer("models", "stores"),
)
"""The entry points at the top; each layer imports only the layers below it (names in one layer
are independent of each other)."""
MAX_MODULE_LINES = 600
MAX_PACKAGE_MODULES = 15
MEASURED = {
    "a date": r"\b20\d{2}-[01]\d-[0-3]\d\b|\b(January|February|March|April|May|June|July|August|September"
    r"|October|November|December) 20\d{2}\b",
    "a machine": r"\b(EPYC|Xeon|Ryzen|Zen ?\d|Sapphire Rapids|Ice Lake|Cascade Lake|Skylake|Graviton|H100|H200"
    r"|A100|vCPUs?)\b",
    "a by-hand measurement": r"\bmeasured here\b|\bby hand\b|\bMeasured \(",
    "a timing": r"(?<![\w.])\d[\d,]*(\.\d+)?( ?[-\u2013] ?\d[\d,]*(\.\d+)?)? ?(ns|µs|us|ms|s|sec|seconds|min|minutes|h"
    r"|hours)\b(?!\w)",
    "a throughput": r"(?<![\w.])\d[\d,]*(\.\d+)? ?(docs|rows|users|items|texts|queries|req|requests|keys|records"
    r"|vectors|points|GFLOP)/s\b",
    "a speed-up": r"\d(\.\d+)? ?\u00d7",
    "a README section": r"README, \"",
}
"""What a comment or docstring outside precompute/bench/ may not hold: the figures of one run on
one machine go stale the day they are written. A comment says why; the bench it names measures."""
RULES = re.compile(
    r"(<=|>=|<|>|\u2264|\u2265|\bunder|\bwithin|\bevery|\bafter|\bfor|\bgiven|\bat most|\bat least|\bup to) ?"
    r"\d[\d,.]* ?(ns|\u00b5s|us|ms|s|sec|seconds|min|minutes|h|hours)\b"
)
"""A bound, a timeout or a period is a rule, not a measurement ("p99 <= 2 ms", "within 30 s")."""


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("precompute", exclude_type_checking_imports=False)


def test_the_package_has_no_import_cycle(graph: grimp.ImportGraph) -> None:
    """Strongly connected components of the module graph (Tarjan's), of more than one module."""
    modules = sorted(graph.modules)
    edges = {m: sorted(set(graph.find_modules_directly_imported_by(m)) & set(modules)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in edges[module]:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = [stack.pop()]
            while component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in modules:
        if module not in index:
            visit(module)
    assert cycles == []


def test_layers_point_down(graph: grimp.ImportGraph) -> None:
    illegal = graph.find_illegal_dependencies_for_layers(layers=LAYERS, containers={"precompute"})
    assert {(d.importer, d.imported) for d in illegal} == set()


def test_every_module_of_the_package_is_in_a_layer(graph: grimp.ImportGraph) -> None:
    layered = {f"precompute.{tail}" for layer in LAYERS for tail in layer.module_tails}
    top = {".".join(m.split(".")[:2]) for m in graph.modules if m != "precompute"}
    assert top <= layered


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_is_at_most_600_lines(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= MAX_MODULE_LINES


def test_a_package_holds_at_most_15_modules_each_saying_what_it_owns() -> None:
    packages = sorted({p.parent for p in modules()})
    sizes = {str(p.relative_to(ROOT)): len(list(p.glob("*.py"))) - 1 for p in packages}
    assert {p: n for p, n in sizes.items() if n > MAX_PACKAGE_MODULES} == {}
    silent = [str(p.relative_to(ROOT)) for p in packages if ast.get_docstring(ast.parse((p / "__init__.py").read_text())) is None]
    assert silent == []


def documentation(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and every docstring line (attribute docstrings included)."""
    source = path.read_text()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        for statement in body if isinstance(body, list) else []:
            if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
                if isinstance(statement.value.value, str):
                    for offset, line in enumerate(statement.value.value.splitlines()):
                        yield statement.lineno + offset, line


def test_comments_state_rules_not_one_machines_figures() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {what}: {text.strip()}"
        for path in modules()
        if PACKAGE / "bench" not in path.parents
        for line, text in documentation(path)
        for what, pattern in MEASURED.items()
        if re.search(pattern, RULES.sub("", text))
    ]
    assert found == []


@pytest.mark.parametrize(
    "text",
    [
        "# 0.41-0.43 s on 2 vCPUs",
        '"""took 29.6 s of the night"""',
        "# an AVX-512 EPYC",
        "# (bench scale, 2026-12-01)",
        "# measured here",
        "# 1.44\u00d7 sentence-transformers",
        "# 71.2 docs/s",
        "# 123.3 GFLOP/s",
        '# README, "Scale"',
    ],
)
def test_the_check_finds_each_kind_of_figure(text: str, tmp_path: Path) -> None:
    path = tmp_path / "module.py"
    path.write_text(f"{text}\nx = 1\n")
    assert any(
        re.search(pattern, RULES.sub("", line)) for _, line in documentation(path) for pattern in MEASURED.values()
    )


@pytest.mark.parametrize("text", ["# p99 <= 2 ms at 500 req", "# stops within 30 s", "# measured on few rows"])
def test_a_bound_or_a_timeout_is_a_rule(text: str, tmp_path: Path) -> None:
    path = tmp_path / "module.py"
    path.write_text(f"{text}\nx = 1\n")
    assert not any(
        re.search(pattern, RULES.sub("", line)) for _, line in documentation(path) for pattern in MEASURED.values()
    )
