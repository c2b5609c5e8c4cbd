"""A run's metrics for Prometheus: whether it succeeded, when it finished, and per output
whether it published, its rows, rejects, seconds per step and per stage of its compute.

A nightly run is gone before Prometheus could scrape it, so after every run, failed or not,
its metrics are written as a textfile (`<work_dir>/metrics/nightly.prom`, the format of the
node exporter's textfile collector) and, where JobSettings.pushgateway_url is set, pushed to
a Pushgateway that Prometheus scrapes. infra/prometheus/alerts.yml pages on a failed run and
on a run missing for 26 h.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Gauge, generate_latest, push_to_gateway

from precompute.jobs.work_dir import WorkPath
from precompute.kinds.report import RunReport

log = logging.getLogger(__name__)

JOB = "precompute_nightly"
"""The Pushgateway's job label."""


def run_registry(report: RunReport, pipeline: str, seconds: float, finished: float) -> CollectorRegistry:
    """The run's metrics, labelled by pipeline (the pipeline file's name without its suffix)."""
    registry = CollectorRegistry()

    def gauge(name: str, help: str, *labels: str) -> Gauge:
        return Gauge(name, help, ["pipeline", *labels], registry=registry)

    gauge("precompute_run_success", "1 when every output of the run published, else 0").labels(pipeline).set(
        0 if report.failed else 1
    )
    gauge("precompute_run_finished_timestamp_seconds", "When the run ended").labels(pipeline).set(finished)
    gauge("precompute_run_duration_seconds", "The run's wall time").labels(pipeline).set(seconds)
    published = gauge("precompute_output_published", "1 when the output published", "output", "kind")
    rows = gauge("precompute_output_rows", "Input rows of the output's job", "output")
    rejects = gauge("precompute_output_rejects", "Rows quarantined, with their reasons", "output")
    steps = gauge("precompute_output_step_seconds", "Seconds per step of the output's night", "output", "step")
    stages = gauge(
        "precompute_output_stage_seconds", "Seconds per stage of the output's compute", "output", "stage"
    )
    for output, fields in report.outputs.items():
        published.labels(pipeline, output, fields.kind).set(1 if fields.published else 0)
        if not fields.published or fields.computed is None:
            continue
        rows.labels(pipeline, output).set(fields.computed.rows)
        rejects.labels(pipeline, output).set(fields.computed.rejects)
        for step, value in fields.steps.items():
            steps.labels(pipeline, output, step).set(value)
        for stage, value in fields.computed.seconds.items():
            stages.labels(pipeline, output, stage).set(value)
    return registry


def publish_run_metrics(
    report: RunReport,
    pipeline: str,
    seconds: float,
    finished: float,
    work_dir: WorkPath,
    pushgateway: str | None,
) -> WorkPath:
    """Write the run's textfile (returned) and push it where a Pushgateway is set. A push that
    fails is logged, not raised: the run's outputs are published, and a run that never reports
    trips PrecomputeRunMissing."""
    registry = run_registry(report, pipeline, seconds, finished)
    path = work_dir / "metrics" / "nightly.prom"
    path.write_bytes(generate_latest(registry))
    if pushgateway is not None:
        try:
            push_to_gateway(pushgateway, job=JOB, registry=registry, grouping_key={"pipeline": pipeline})
        except OSError as e:
            log.warning("run metrics not pushed to %s: %s (they are in %s)", pushgateway, e, path)
    return path
