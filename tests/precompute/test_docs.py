"""The documentation: the pages generated from the code are current (precompute/cli/docs.py), and the
README is a user's guide: short, with no dated measurement history, its links going somewhere."""

from __future__ import annotations

import re

from precompute.bench.report import BEGIN, END, summary
from precompute.cli.docs import ROOT, pages, readme_summary, readme_with_summary

README = ROOT / "README.md"
MAX_README_LINES = 800
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
SHORT_COMMIT = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,12}\b")
"""A short commit hash, in backticks or not: 7 to 12 hex digits, at least one a digit and one a letter."""
MACHINE = re.compile(
    r"\b(EPYC|Xeon|Opteron|Ryzen|Threadripper|Graviton|Neoverse|Ampere Altra|Core i[3579]|Apple M[1-9]"
    r"|GeForce|RTX|Quadro|Tesla|Radeon|Instinct|[AHLV]100|[AH]10G?|H200|H800|A800|L4|L40S?|T4|B200|GB200)\b"
)
"""CPU and GPU model names: a figure measured on one machine belongs to docs/benchmarks.md."""
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")


def readme() -> str:
    return README.read_text()


def outside_benchmarks(text: str) -> str:
    return text[: text.index(BEGIN)] + text[text.index(END) + len(END) :]


def test_every_generated_page_is_what_the_code_generates() -> None:
    stale = [path for path, text in pages().items() if not (ROOT / path).is_file() or (ROOT / path).read_text() != text]
    assert stale == [], f"{', '.join(stale)}: stale, run `precompute docs`"


def test_the_readme_is_a_guide_not_a_notebook() -> None:
    lines = readme().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines: move reference prose to docs/"


def test_the_readme_names_no_date_commit_or_machine_outside_the_benchmarks_block() -> None:
    text = outside_benchmarks(readme())
    found = {
        "dates": DATE.findall(text),
        "commits": SHORT_COMMIT.findall(text),
        "machines": [m.group(0) for m in MACHINE.finditer(text)],
    }
    assert {what: names for what, names in found.items() if names} == {}, (
        "measurements and their history belong to docs/benchmarks.md (bench/results/), not the README"
    )


def test_the_readmes_benchmarks_block_is_the_summary_of_the_records() -> None:
    text = readme()
    assert readme_summary(text) == summary(ROOT / "bench" / "results"), "stale benchmarks table: run `precompute docs`"
    assert readme_with_summary(text, readme_summary(text)) == text


def test_every_docs_link_of_the_readme_points_to_a_page() -> None:
    links = [target for target in LINK.findall(readme()) if target.startswith("docs/")]
    assert links, "the README points at no page of docs/"
    assert [target for target in links if not (ROOT / target).exists()] == []


def test_every_relative_link_between_the_docs_pages_resolves() -> None:
    broken = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        for target in LINK.findall(page.read_text()):
            if "://" not in target and not target.startswith("mailto:") and not (page.parent / target).exists():
                broken.append(f"{page.name}: {target}")
    assert broken == []
