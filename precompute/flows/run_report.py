"""A run's report: `reports/<run>.json`, the page beside it (run_page.py), a Prefect artifact each,
and its metrics (run_metrics.py). Each output's block is its OutputReport (precompute/kinds/report.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from prefect.artifacts import create_link_artifact, create_markdown_artifact

from precompute.flows.run_metrics import publish_run_metrics
from precompute.flows.run_page import render
from precompute.jobs.work_dir import WorkPath
from precompute.kinds.report import RunReport

log = logging.getLogger(__name__)


def report_path(work_dir: WorkPath, run: str) -> WorkPath:
    return work_dir / "reports" / f"{run}.json"


def markdown(report: RunReport) -> str:
    sections = []
    for name, output in report.outputs.items():
        fields = output.json()
        rows = "\n".join(f"| {key} | {json.dumps(value)} |" for key, value in fields.items())
        sections.append(f"## {name}\n\n| field | value |\n| --- | --- |\n{rows}\n")
        if models := (fields.get("validation") or {}).get("models"):
            sections.append(models_table(fields["validation"], models))
    return f"# Nightly run {report.run}\n\n" + "\n".join(sections)


def models_table(quality: dict[str, Any], models: dict[str, dict[str, Any]]) -> str:
    """An output's models side by side on the held-out split."""
    k = quality["k"]
    head = (
        f"| model | HR@{k} | recall@{k} | NDCG@{k} | new-item NDCG@{k} | coverage | cold users served |\n"
        "| --- | --- | --- | --- | --- | --- | --- |\n"
    )
    rows = "\n".join(
        f"| {quality['published'] if name == 'published' else name} | {m['hit_rate']} | {dash(m.get('recall'))} | "
        f"{m['ndcg']} | {dash(m.get('new_item_ndcg'))} | {m['coverage']} | {dash(m['cold_served'])} |"
        for name, m in models.items()
    )
    cold = f", {quality['cold_users']} cold" if "cold_users" in quality else ""
    target = quality.get("target", "interaction")
    seen = f" Seen items: {quality['seen']}." if quality.get("seen") else ""
    return (
        f"Held-out quality ({quality['split']} split, each user's last {target}, {quality['users']} users{cold}).{seen}"
        f"\n\n{head}{rows}\n"
    )


def dash(value: object) -> object:
    return "-" if value is None else value


def write_report(
    report: RunReport, work_dir: WorkPath, pipeline: Path, seconds: float, finished: float, pushgateway: str | None
) -> WorkPath:
    """The JSON (returned), its page, the Prefect artifacts and the run's metrics."""
    path = report_path(work_dir, report.run)
    path.write_text(json.dumps(report.json(), indent=2))
    page = path.parent / f"{report.run}.html"
    try:
        page.write_text(render(report))
    except Exception:  # a view of the JSON beside it: a bug here must not fail a run that published
        log.exception("the run's page %s was not written", page)
    create_markdown_artifact(markdown(report), key="nightly-run-report", description=f"run {report.run}")
    create_link_artifact(page.as_uri(), link_text=f"run {report.run} report", key="nightly-run-page")
    publish_run_metrics(report, pipeline.stem, seconds, finished, work_dir, pushgateway)
    return path
