"""Every pod spec in deploy/kubernetes/ meets the "restricted" Pod Security Standard, so a
namespace labelled `pod-security.kubernetes.io/enforce: restricted` admits it.

The oracle is the standard's own list of controls (Kubernetes docs, "Pod Security Standards",
baseline + restricted, latest), checked field by field on each pod template: no host
namespaces, host ports or hostPath; only the volume types restricted allows; no privileged
container; allowPrivilegeEscalation false, every capability dropped (NET_BIND_SERVICE the only
one added back), runAsNonRoot true and no UID 0, a seccomp profile of RuntimeDefault or
Localhost (never Unconfined) for the pod or every container; no unsafe sysctls, AppArmor or
SELinux relaxations. A deliberately loose pod fails the same checker (it can fail).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
DOCS = [doc for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}  # fmt: skip
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}  # fmt: skip
SELINUX_TYPES = {
    None,
    "",
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
}


def pod_specs(doc: dict) -> list[dict]:
    """The pod specs a manifest creates: a Pod's, or the template of a workload (CronJob's too)."""
    if doc["kind"] == "Pod":
        return [doc["spec"]]
    spec = doc.get("spec", {})
    if "jobTemplate" in spec:
        spec = spec["jobTemplate"]["spec"]
    return [spec["template"]["spec"]] if "template" in spec else []


def violations(pod: dict) -> list[str]:
    found: list[str] = []
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            found.append(f"{field} is true")
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']} is {sorted(kinds)}")
    pod_ctx = pod.get("securityContext", {})
    for sysctl in pod_ctx.get("sysctls", []):
        if sysctl["name"] not in SAFE_SYSCTLS:
            found.append(f"sysctl {sysctl['name']}")
    containers = [
        c
        for key in ("containers", "initContainers", "ephemeralContainers")
        for c in pod.get(key, [])
    ]
    for context, where in [(pod_ctx, "pod")] + [
        (c.get("securityContext", {}), c["name"]) for c in containers
    ]:
        if context.get("runAsUser") == 0:
            found.append(f"{where}: runAsUser 0")
        if context.get("runAsNonRoot") is False:
            found.append(f"{where}: runAsNonRoot false")
        seccomp = context.get("seccompProfile", {}).get("type")
        if seccomp not in (None, "RuntimeDefault", "Localhost"):
            found.append(f"{where}: seccompProfile {seccomp}")
        if context.get("appArmorProfile", {}).get("type") == "Unconfined":
            found.append(f"{where}: AppArmor unconfined")
        if context.get("seLinuxOptions", {}).get("type") not in SELINUX_TYPES:
            found.append(f"{where}: SELinux type")
        if context.get("procMount", "Default") != "Default":
            found.append(f"{where}: procMount")
    for container in containers:
        name, context = container["name"], container.get("securityContext", {})
        if context.get("privileged"):
            found.append(f"{name}: privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation is not false")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            found.append(f"{name}: capabilities not dropped (drop: [ALL])")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{name}: capabilities added {capabilities['add']}")
        if any(port.get("hostPort") for port in container.get("ports", [])):
            found.append(f"{name}: hostPort")
        if pod_ctx.get("runAsNonRoot") is not True and context.get("runAsNonRoot") is not True:
            found.append(f"{name}: runAsNonRoot unset (pod and container)")
        seccomp = context.get("seccompProfile") or pod_ctx.get("seccompProfile")
        if not seccomp:
            found.append(f"{name}: no seccompProfile (pod or container)")
    return found


PODS = [(doc, spec) for doc in DOCS for spec in pod_specs(doc)]


def test_the_manifests_hold_pods():
    kinds = {doc["kind"] for doc, _ in PODS}
    assert "Deployment" in kinds and len(PODS) >= 2  # the CPU and the GPU variant


@pytest.mark.parametrize("pod", PODS, ids=lambda p: f"{p[0]['kind']}/{p[0]['metadata']['name']}")
def test_every_pod_meets_the_restricted_profile(pod):
    _, spec = pod
    assert violations(spec) == []


def test_the_checker_catches_a_loose_pod():
    _, spec = PODS[0]
    loose = copy.deepcopy(spec)
    loose.pop("securityContext")
    container = loose["containers"][0]
    container["securityContext"] = {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}}
    loose["volumes"] = [{"name": "host", "hostPath": {"path": "/"}}]
    found = " ".join(violations(loose))
    for control in ("privileged", "allowPrivilegeEscalation", "drop: [ALL]", "SYS_ADMIN",
                    "hostPath", "runAsNonRoot", "seccompProfile"):  # fmt: skip
        assert control in found
