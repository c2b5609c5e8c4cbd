"""Monitoring, checked by the real tools: promtool on the alert rules (syntax and unit tests),
and a real Prometheus scraping a running lookup service and a Pushgateway holding a run's
metrics, on which every expression of the Grafana dashboard evaluates. `make test` installs
Debian's prometheus and prometheus-pushgateway."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from precompute.flows.run_metrics import JOB, publish_run_metrics
from precompute.jobs.work_dir import WorkPath
from precompute.kinds.report import Computed, OutputReport, RunReport
from precompute.models import Engine
from precompute.stores.key_value.server import free_port
from tests.faults.service import published_service
from tests.lookup.test_keys import ITEMS
from tests.waiting import wait_for

INFRA = Path(__file__).parents[2] / "infra"
RULES = INFRA / "prometheus" / "alerts.yml"
DASHBOARD = INFRA / "grafana" / "precompute.json"
START_TIMEOUT_S = 120


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is not on PATH: `make test` installs it (apt-get install prometheus)")
    return path


def test_alert_rules_pass_promtool() -> None:
    promtool = tool("promtool")
    checked = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [promtool, "test", "rules", "alerts_test.yml"], cwd=RULES.parent, capture_output=True, text=True
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


@contextmanager
def process(args: list[str], ready_url: str, log: Path) -> Iterator[None]:
    """Start a server, wait until `ready_url` answers 200, terminate it on exit."""
    with open(log, "wb") as out:
        child = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        def ready() -> bool:
            if child.poll() is not None:
                raise RuntimeError(f"{args[0]} did not start: {log.read_text()[-2000:]}")
            try:
                return httpx.get(ready_url).status_code == 200
            except httpx.TransportError:
                return False

        try:
            wait_for(ready, f"{args[0]} to answer {ready_url}", ceiling_s=START_TIMEOUT_S, every_s=0.2)
            yield
        finally:
            child.terminate()
            child.wait(timeout=30)


def dashboard_expressions() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


SAMPLE_SUFFIXES = ("", "_bucket", "_count", "_sum", "_total", "_created")
"""The series names a metric family exposes (a histogram's buckets, a counter's total)."""


def exposed_names(exposition: str) -> set[str]:
    """Every series name the families in a /metrics text can have, samples or not yet: a labelled
    counter with no sample so far (store errors, say) is still a real name."""
    families = re.findall(r"^# TYPE (\S+) ", exposition, re.MULTILINE)
    return {family + suffix for family in families for suffix in SAMPLE_SUFFIXES}


def report() -> RunReport:
    """A run's report, as flows/nightly.py makes it: one output published, one failed."""
    failed = "compute: RejectRatioExceededError: 24 of 224 rows"
    published = OutputReport(
        kind="embeddings",
        published=True,
        version="20261125T031500Z-aa01",
        computed=Computed(rows=204, rejects=4, seconds={"embed": 3.5, "load": 0.4}),
        steps={"compute": 4.0, "check": 0.2, "publish": 0.01, "collect": 0.05},
    )
    return RunReport(
        "20261125T031500Z-run", "demo.toml", {"embeddings": published, "labels": OutputReport(kind="labels", error=failed)},
        {"labels": failed},
    )


@pytest.mark.slow
def test_prometheus_scrapes_the_service_and_a_runs_metrics(
    tmp_path: Path, redis_url: str, encoder, settings: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway, prometheus_port = f"127.0.0.1:{free_port()}", free_port()
    prometheus = f"http://127.0.0.1:{prometheus_port}"
    config = tmp_path / "prometheus.yml"
    with published_service(
        encoder, settings, redis_url, tmp_path, monkeypatch, log=tmp_path / "service.log"
    ) as (
        base,
        _,
    ):
        config.write_text(
            json.dumps(  # YAML is a superset of JSON
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(RULES)],
                    "scrape_configs": [
                        {
                            "job_name": "precompute-lookup",
                            "static_configs": [{"targets": [base.split("//")[1]]}],
                        },
                        {
                            "job_name": "pushgateway",
                            "honor_labels": True,
                            "static_configs": [{"targets": [gateway]}],
                        },
                    ],
                }
            )
        )
        with (
            process(
                [tool("prometheus-pushgateway"), f"--web.listen-address={gateway}"],
                f"http://{gateway}/-/ready",
                tmp_path / "pushgateway.log",
            ),
            process(
                [
                    tool("prometheus"),
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{prometheus_port}",
                ],
                f"{prometheus}/-/ready",
                tmp_path / "prometheus.log",
            ),
        ):
            scrape(base, gateway, prometheus, tmp_path)


def scrape(base: str, gateway: str, prometheus: str, tmp_path: Path) -> None:
    """Traffic and a run's metrics in; Prometheus's view of both out."""
    publish_run_metrics(report(), "demo", 42.0, time.time(), WorkPath.of(tmp_path / "work"), f"http://{gateway}")
    for _ in range(5):
        assert httpx.get(f"{base}/v1/labels/{ITEMS[0]}").status_code == 200

    def query(expr: str) -> list[dict]:
        answer = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}).json()
        assert answer["status"] == "success", (expr, answer)
        return answer["data"]["result"]

    wait_for(
        lambda: query('precompute_request_seconds_count{status="200"}') and query("precompute_run_success"),
        "Prometheus to scrape both targets",
        ceiling_s=START_TIMEOUT_S,
        every_s=0.5,
    )
    assert query('up{job="precompute-lookup"}')[0]["value"][1] == "1"
    run = query("precompute_run_success")[0]
    assert (run["metric"]["job"], run["metric"]["pipeline"], run["value"][1]) == (JOB, "demo", "0")
    assert {r["metric"]["output"] for r in query("precompute_output_published == 0")} == {"labels"}
    exposed = exposed_names(httpx.get(f"{base}/metrics").text + httpx.get(f"http://{gateway}/metrics").text)
    for expr in dashboard_expressions():
        query(expr)  # each panel's query is valid PromQL ...
        named = set(re.findall(r"\bprecompute_[a-z_]+\b", expr))
        assert named and named <= exposed, (expr, named - exposed)  # ... over the metrics' real names
    rules = httpx.get(f"{prometheus}/api/v1/rules").json()["data"]["groups"]
    loaded = {rule["name"]: rule["health"] for group in rules for rule in group["rules"]}
    assert "PrecomputeRunFailed" in loaded and set(loaded.values()) == {"ok"}
