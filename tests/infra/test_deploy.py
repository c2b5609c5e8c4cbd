"""infra/ validated by the tools that exist here: the compose file by `docker-compose config`
(Debian's docker-compose; no container is started), the Kubernetes manifests against the
Kubernetes API's schemas (kubernetes-validate, strict: unknown fields are errors). KubeRay's
RayCluster has no schema there: its pod templates, which hold nearly all of it, are validated
as PodTemplates, and its own fields are checked by name."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import ray
import yaml

INFRA = Path(__file__).parents[2] / "infra"
K8S = INFRA / "k8s"
KUBERNETES = "1.33"
SECRETS = {"RAY_AUTH_TOKEN": "t", "POSTGRES_PASSWORD": "p", "LOOKUP_TOKEN": "l"}


def compose_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    compose = shutil.which("docker-compose")
    if compose is None:
        raise RuntimeError("docker-compose is not on PATH: `make test` installs it")
    file = INFRA / "compose" / "docker-compose.yml"
    return subprocess.run(
        [compose, "-f", str(file), "config"], env={**os.environ, **env}, capture_output=True, text=True
    )


def test_the_compose_file_is_valid_and_holds_the_whole_stack() -> None:
    config = compose_config(SECRETS)
    assert config.returncode == 0, config.stderr
    services = yaml.safe_load(config.stdout)["services"]
    assert set(services) == {
        "redis", "qdrant", "postgres", "prefect-server", "ray-head", "ray-worker",
        "scheduler", "lookup", "pushgateway", "prometheus", "grafana",
    }  # fmt: skip
    assert services["lookup"]["environment"]["PRECOMPUTE_QDRANT_URL"] == "http://qdrant:6333"
    missing = compose_config({})
    assert missing.returncode != 0 and "set POSTGRES_PASSWORD" in missing.stderr  # no default secrets


def manifests() -> list[tuple[str, dict]]:
    files = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    return [(name, doc) for name in files for doc in yaml.safe_load_all((K8S / name).read_text())]


@pytest.mark.parametrize(
    ("name", "resource"), manifests(), ids=lambda v: v if isinstance(v, str) else v["kind"]
)
def test_each_manifest_is_valid(name: str, resource: dict) -> None:
    if resource["kind"] != "RayCluster":
        kubernetes_validate.validate(resource, KUBERNETES, strict=True)
        return
    spec = resource["spec"]
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    assert set(spec) == {"rayVersion", "headGroupSpec", "workerGroupSpecs"}
    minor = spec["rayVersion"].rsplit(".", 1)[0]
    assert ray.__version__.startswith(f"{minor}.")  # the Ray pyproject.toml pins, and these tests ran
    for group in groups:
        template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": "t"},
            "template": group["template"],
        }
        kubernetes_validate.validate(template, KUBERNETES, strict=True)
    for group in spec["workerGroupSpecs"]:
        assert {"groupName", "replicas", "minReplicas", "maxReplicas", "rayStartParams", "template"} == set(
            group
        )


def test_the_service_is_probed_on_its_health_endpoints() -> None:
    deployment = next(
        doc for name, doc in manifests() if doc["kind"] == "Deployment" and name == "lookup.yaml"
    )
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
