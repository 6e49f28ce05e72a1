"""The Kubernetes manifests and the compose file validate offline and keep tgserve's promises.

Oracles: kubernetes-validate's strict schemas of the newest Kubernetes it ships (no cluster);
docker-compose's own `config` check; and the facts the manifests must agree with, read from
their sources: the UID of the Dockerfile's USER, the gauges server/metrics/engine_collectors.py exports, the
routes /ready and /health, the drain time (a grace period longer than preStop + the shutdown
timeout, so SIGKILL never cuts a drain short), one GPU per tensor-parallel rank, and image
references pinned: a digest or a version tag (never absent or `latest`), tgserve's own images
tagged with pyproject.toml's version (`-cuda` for the GPU variant), an `imagePullPolicy` on
every Kubernetes container.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from server.metrics.engine_collectors import ENGINE_GAUGES
from tests.deploy.docker_host import ensure_tools

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
DOCS = [doc for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]
COMPOSE = ROOT / "deploy" / "docker-compose.yml"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def _of_kind(kind: str) -> list[dict]:
    return [doc for doc in DOCS if doc["kind"] == kind]


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_each_manifest_validates_strictly(doc: dict):
    kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_the_set_has_what_a_deployment_needs():
    kinds = {doc["kind"] for doc in DOCS}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"} <= kinds
    gpu = [d for d in _of_kind("Deployment") if "nvidia.com/gpu" in str(d)]
    assert gpu, "no GPU variant"


@pytest.mark.parametrize("deployment", _of_kind("Deployment"), ids=lambda d: d["metadata"]["name"])
def test_deployments_drain_probe_and_run_as_the_image_user(deployment: dict):
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = _env(container)
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > int(pre_stop[1]) + float(
        env["TGSERVE_SHUTDOWN_TIMEOUT"]
    )
    for probe in ("startupProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert "memory" in container["resources"]["limits"]

    user = re.search(r"^USER (\d+)", (ROOT / "Dockerfile").read_text(), re.M)
    assert user and pod["securityContext"]["runAsUser"] == int(user.group(1))
    assert pod["securityContext"]["runAsNonRoot"] is True

    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert set(mounts) <= set(volumes)
    assert env["TGSERVE_MODEL"].startswith(mounts["models"] + "/")  # the model volume
    assert "persistentVolumeClaim" in volumes["models"]

    if "TGSERVE_TENSOR_PARALLEL_SIZE" in env:  # one GPU per rank
        gpus = container["resources"]["limits"]["nvidia.com/gpu"]
        assert container["resources"]["requests"]["nvidia.com/gpu"] == gpus
        assert gpus == int(env["TGSERVE_TENSOR_PARALLEL_SIZE"])


def test_services_autoscaler_and_budget_select_the_deployments():
    labels = {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"] for d in DOCS
              if d["kind"] == "Deployment"}  # fmt: skip
    for service in _of_kind("Service"):
        assert service["spec"]["selector"] in labels.values()
    for budget in _of_kind("PodDisruptionBudget"):
        assert budget["spec"]["selector"]["matchLabels"] in labels.values()
    exported = {name for _, name, _ in ENGINE_GAUGES}
    for hpa in _of_kind("HorizontalPodAutoscaler"):
        assert hpa["spec"]["scaleTargetRef"]["name"] in labels
        for target in hpa["spec"]["metrics"]:
            assert target["pods"]["metric"]["name"] in exported  # a gauge tgserve exports
        assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]


def test_the_compose_file_validates():
    ensure_tools()
    assert shutil.which("docker-compose")
    check = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr
    service = yaml.safe_load(COMPOSE.read_text())["services"]["tgserve"]
    grace = float(service["stop_grace_period"].rstrip("s"))
    assert grace > float(service["environment"]["TGSERVE_SHUTDOWN_TIMEOUT"])


def _containers(doc: dict) -> list[dict]:
    """Every container and init container of a workload (its pod template's spec)."""
    pod = doc.get("spec", {}).get("template", {}).get("spec", {})
    return pod.get("containers", []) + pod.get("initContainers", [])


def _tag(reference: str) -> str | None:
    """The tag of `name[:tag][@digest]` (a registry's port is not a tag); None without one."""
    name = reference.split("@")[0].rsplit("/", 1)[-1]
    return name.partition(":")[2] or None


def _assert_pinned(reference: str) -> None:
    if "@sha256:" in reference:
        return
    tag = _tag(reference)
    assert tag and tag != "latest" and any(c.isdigit() for c in tag), f"{reference}: not pinned"
    if reference.split(":")[0] == "tgserve":  # ours: the version this checkout builds
        assert tag.split("-")[0] == VERSION, f"{reference}: not pyproject.toml's {VERSION}"


def test_every_kubernetes_image_is_pinned_with_a_pull_policy():
    containers = [(doc, c) for doc in DOCS for c in _containers(doc)]
    assert containers
    for doc, container in containers:
        _assert_pinned(container["image"])
        assert container.get("imagePullPolicy"), f"{doc['metadata']['name']}: no imagePullPolicy"
        wants_gpu = "nvidia.com/gpu" in container.get("resources", {}).get("limits", {})
        if container["image"].startswith("tgserve:"):  # the GPU pods run the CUDA variant
            assert container["image"].endswith("-cuda") == wants_gpu, container["image"]


def test_every_compose_image_is_pinned():
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    for name, service in services.items():
        assert "image" in service, f"{name}: no image (a build alone is tagged by folder name)"
        _assert_pinned(service["image"])
