"""The multi-host deployments (deploy/kubernetes/multi-host/, a LeaderWorkerSet; and
deploy/docker-compose.multi-host.yml, two hosts) validate and form one group.

Oracles: kubernetes-validate's strict schemas for the Service and for each LWS pod template
(checked as a v1 PodTemplate: the LWS API embeds core PodTemplateSpecs); the LWS API's fields
and enums as its reference documents them (v1: size, leaderTemplate, workerTemplate,
restartPolicy RecreateGroupOnPodRestart | None, startupPolicy LeaderCreated | LeaderReady);
the restricted Pod Security checker of test_pod_security.py; docker-compose's own `config`
check; and tgserve's own `serve` parser and engine.Cluster, fed each pod's or service's
arguments with the LWS variables a group's pods get (LWS_LEADER_ADDRESS, LWS_GROUP_SIZE,
LWS_WORKER_INDEX) substituted as Kubernetes does, so every node resolves to the same
rendezvous, the leader alone holds rank 0, and the ranks divide over the nodes.
"""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import yaml

from server.cli import build_parser
from server.serve import cluster_of
from server.settings import Settings
from tests.deploy.docker_host import compose_config_errors
from tests.deploy.test_manifests import VERSION
from tests.deploy.test_pod_security import violations

ROOT = Path(__file__).resolve().parents[2]
LWS_FILE = ROOT / "deploy" / "kubernetes" / "multi-host" / "tgserve-lws.yaml"
DOCS = [doc for doc in yaml.safe_load_all(LWS_FILE.read_text()) if doc]
(LWS,) = [doc for doc in DOCS if doc["kind"] == "LeaderWorkerSet"]
COMPOSE = ROOT / "deploy" / "docker-compose.multi-host.yml"


def _templates() -> dict[str, dict]:
    spec = LWS["spec"]["leaderWorkerTemplate"]
    return {"leader": spec["leaderTemplate"], "worker": spec["workerTemplate"]}


def _expand(text: str, env: dict[str, str]) -> str:
    """`$(VAR)` replaced by VAR's value, as Kubernetes expands a container's args."""
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], text)


def _resolve(args: list[str], env: dict[str, str]):
    """(Settings, Cluster) of `tgserve serve ARGS` with `env` as its environment."""
    parsed = build_parser("serve").parse_args(["serve", *args])
    settings = Settings.resolve(parsed, env)
    return settings, cluster_of(settings, env)


def test_the_service_and_each_pod_template_validate_strictly() -> None:
    version = kubernetes_validate.latest_version()
    for doc in DOCS:
        if doc["kind"] != "LeaderWorkerSet":
            kubernetes_validate.validate(doc, version, strict=True)
    for role, template in _templates().items():
        as_core = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": role}}
        kubernetes_validate.validate({**as_core, "template": template}, version, strict=True)
        assert violations(template["spec"]) == [], role


def test_the_leader_worker_set_uses_the_api_as_documented() -> None:
    assert LWS["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    spec = LWS["spec"]
    assert set(spec) <= {"replicas", "leaderWorkerTemplate", "startupPolicy", "rolloutStrategy",
                         "networkConfig"}  # fmt: skip
    group = spec["leaderWorkerTemplate"]
    assert set(group) <= {"size", "leaderTemplate", "workerTemplate", "restartPolicy"}
    assert group["restartPolicy"] == "RecreateGroupOnPodRestart"  # one rank gone ends them all
    # LeaderReady would wait for a leader that is ready only once its workers joined.
    assert spec["startupPolicy"] == "LeaderCreated"
    (service,) = [doc for doc in DOCS if doc["kind"] == "Service"]
    leader_labels = _templates()["leader"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= leader_labels.items()
    assert (
        not service["spec"]["selector"].items()
        <= _templates()["worker"]["metadata"]["labels"].items()
    )


def test_every_pod_of_a_group_joins_one_rendezvous_with_its_own_node_rank() -> None:
    size = LWS["spec"]["leaderWorkerTemplate"]["size"]
    lws_env = {
        "LWS_LEADER_ADDRESS": "tgserve-multi-host-0.tgserve-multi-host",
        "LWS_GROUP_SIZE": str(size),
    }
    clusters, world = [], None
    for index in range(size):
        role = "leader" if index == 0 else "worker"
        (container,) = _templates()[role]["spec"]["containers"]
        assert container["image"] == f"tgserve:{VERSION}-cuda"
        env = {**lws_env, "LWS_WORKER_INDEX": str(index)}
        env.update({e["name"]: e["value"] for e in container["env"]})
        args = [_expand(a, env) for a in container["args"]]
        settings, cluster = _resolve(args, env)
        clusters.append(cluster)
        if index == 0:
            world = settings.tensor_parallel_size
            gpus = container["resources"]["limits"]["nvidia.com/gpu"]
            assert world == size * gpus  # one rank per GPU of every pod
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            assert ports["rendezvous"] == cluster.master_port
    assert [c.node_rank for c in clusters] == list(range(size))
    assert [c.is_leader for c in clusters] == [True] + [False] * (size - 1)
    assert {(c.nnodes, c.master_addr, c.master_port) for c in clusters} == {
        (size, lws_env["LWS_LEADER_ADDRESS"], clusters[0].master_port)
    }
    clusters[0].check_world(world)


def test_the_two_host_compose_file_validates_and_forms_one_group() -> None:
    assert compose_config_errors(COMPOSE) == ""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    assert set(services) == {"node0", "node1"}
    clusters = []
    for service in services.values():
        assert service["image"] == f"tgserve:{VERSION}"
        env = service["environment"]
        settings, cluster = _resolve(service["command"], env)
        clusters.append(cluster)
        assert float(service["stop_grace_period"].rstrip("s")) > settings.shutdown_timeout
        assert cluster.master_addr == services["node0"]["hostname"]
        assert ("ports" in service) == cluster.is_leader  # node0 alone serves HTTP
    assert [c.node_rank for c in clusters] == [0, 1] and {c.nnodes for c in clusters} == {2}
