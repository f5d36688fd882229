"""GPU sharing end to end: the scheduler as a process, its admission webhook registered with
the real API server over TLS, and the shipped RBAC (manifests/20-rbac.yaml and
25-gpu-sharing.yaml) - see docs/gpu-sharing.md.

Two ``gpu-fraction: "0.5"`` pods share the one device of a node, held by exactly one
reservation pod; each container's env is sourced from its device ConfigMap, which names the
device; a third half-GPU pod waits saying why and shows as a whole-GPU scaling pod for
autoscalers; deleting the sharers removes the reservation pod. A pod asking both
``gpu-fraction`` and ``nvidia.com/gpu`` is refused at admission.
"""

from __future__ import annotations

import base64
import json
import socket
import uuid
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.admission import MUTATE_PATH
from scheduler.cache.grants import GPU_GRANT_ANNOTATION
from scheduler.cluster.gpusharing import (
    CONFIG_MAP_LABEL,
    RESERVATION_LABEL,
    RESERVATION_NAMESPACE,
    SCALING_LABEL,
    VISIBLE_DEVICES_KEY,
)
from testenv import ControlPlane
from testenv.pki import make_pki
from tests.e2e.scheduler_process import (
    REPO,
    KaiCluster,
    StartScheduler,
    kai_cluster,
    kubectl_json,
    pod_manifest,
    run_tag,
    start_scheduler,
    wait_for,
)

pytestmark = pytest.mark.e2e
__all__ = ["kai_cluster", "start_scheduler"]  # fixtures used by this module


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _share_pod(name: str, tag: dict[str, str], **extra: Any) -> dict[str, Any]:
    pod = pod_manifest(name, node_selector=tag, annotations={"gpu-fraction": "0.5"}, **extra)
    pod["spec"]["terminationGracePeriodSeconds"] = 0
    return pod


def _unscheduled_message(pod: dict[str, Any]) -> str:
    """The message of the pod's PodScheduled=False condition ("" when it has none)."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond["type"] == "PodScheduled" and cond["status"] == "False":
            return str(cond.get("message") or "")
    return ""


def _reservations(cp: ControlPlane, label: str = RESERVATION_LABEL) -> list[dict[str, Any]]:
    out = kubectl_json(cp, "get", "pods", "-n", RESERVATION_NAMESPACE, "-l", label)
    return [p for p in out["items"] if not p["metadata"].get("deletionTimestamp")]


def _scaling_for(cp: ControlPlane, pod_key: str) -> list[dict[str, Any]]:
    return [
        p
        for p in _reservations(cp, SCALING_LABEL)
        if p["metadata"]["annotations"].get("kai.scheduler/scaling-for") == pod_key
    ]


@pytest.fixture
def webhook(
    kai_cluster: KaiCluster, namespace: str, tmp_path: Path
) -> Generator[dict[str, Any], None, None]:
    """Sharing RBAC applied, a serving certificate, and the MutatingWebhookConfiguration that
    sends this namespace's pod creations to the scheduler; yields the scheduler's config."""
    cp = kai_cluster.cp
    sharing_manifest = str(REPO / "manifests" / "25-gpu-sharing.yaml")
    # An install test's clean-up may still be deleting the reservation namespace.
    wait_for(
        "the reservation namespace applied",
        lambda: cp.kubectl("apply", "-f", sharing_manifest, check=False).returncode == 0,
        timeout=120,
    )
    pki = make_pki(tmp_path / "webhook-pki", service_ip="10.0.0.1")
    port = _free_port()
    name = f"kai-gpu-sharing-{uuid.uuid4().hex[:6]}"
    configuration = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "gpu-sharing.kai.scheduler",
                "clientConfig": {
                    "url": f"https://127.0.0.1:{port}{MUTATE_PATH}",
                    "caBundle": base64.b64encode(pki.ca_cert.read_bytes()).decode(),
                },
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                # As the chart sends them: only pods asking for a share.
                "matchConditions": [
                    {
                        "name": "asks-for-a-gpu-share",
                        "expression": "has(object.metadata.annotations) && "
                        "('gpu-fraction' in object.metadata.annotations || "
                        "'gpu-memory' in object.metadata.annotations)",
                    }
                ],
                # Only this test's namespace: other tests on the control plane are untouched.
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 5,
            }
        ],
    }
    cp.kubectl("create", "-f", "-", input=json.dumps(configuration))
    try:
        yield {
            "gpuSharing": {
                "enabled": True,
                "collectInterval": "300ms",
                "scalingPods": True,
                "webhookAddress": f"127.0.0.1:{port}",
                "webhookCertFile": str(pki.serving_cert),
                "webhookKeyFile": str(pki.serving_key),
            }
        }
    finally:
        cp.kubectl("delete", "mutatingwebhookconfiguration", name, "--ignore-not-found")


def test_two_half_gpu_pods_share_one_held_device(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
    webhook: dict[str, Any],
) -> None:
    cp = kai_cluster.cp
    tag = run_tag()
    (node,) = make_gpu_nodes(1, gpus=1, labels=tag)
    sched = start_scheduler(config=webhook)

    # Refused at admission, naming the annotation. Retried until the API server calls the
    # webhook (it picks up a new configuration within a moment).
    both = pod_manifest("both", gpus=1, node_selector=tag, annotations={"gpu-fraction": "0.5"})

    def refused() -> str:
        made = cp.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(both), check=False)
        if made.returncode != 0:
            return made.stderr
        cp.kubectl("delete", "pod", "both", "-n", namespace, "--grace-period=0", "--force")
        return ""

    message = wait_for("the webhook to refuse gpu-fraction with nvidia.com/gpu", refused)
    assert "gpu-fraction" in message and "not both" in message, message

    kai_cluster.create(_share_pod("a", tag), _share_pod("b", tag), namespace=namespace)

    def bound() -> list[dict[str, Any]]:
        pods = kai_cluster.pods(namespace)
        return pods if all(p["spec"].get("nodeName") for p in pods) and len(pods) == 2 else []

    pods = wait_for("both sharers bound", bound, timeout=30, logs=sched)
    grants = {json.loads(p["metadata"]["annotations"][GPU_GRANT_ANNOTATION])["0"] for p in pods}
    assert {p["spec"]["nodeName"] for p in pods} == {node} and grants == {500}

    # Exactly one reservation pod holds the device on that node.
    (reservation,) = wait_for("the reservation pod", lambda: _reservations(cp), logs=sched)
    assert reservation["spec"]["nodeName"] == node
    limits = reservation["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": "1"}

    # Each container's env comes from the pod's ConfigMap, which names the device.
    for pod in pods:
        config_map = pod["metadata"]["labels"][CONFIG_MAP_LABEL]
        env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
        ref = env[VISIBLE_DEVICES_KEY]["valueFrom"]["configMapKeyRef"]
        assert ref == {"name": config_map, "key": VISIBLE_DEVICES_KEY}
        data = wait_for(
            f"ConfigMap {config_map}",
            lambda name=config_map: kubectl_json(cp, "get", "configmaps", "-n", namespace)["items"],
            logs=sched,
        )
        (written,) = [c for c in data if c["metadata"]["name"] == config_map]
        assert written["data"][VISIBLE_DEVICES_KEY] == "0"

    # The device is full: a third half-GPU pod waits, saying why.
    kai_cluster.create(_share_pod("c", tag), namespace=namespace)

    def waiting() -> str:
        (c,) = [p for p in kai_cluster.pods(namespace) if p["metadata"]["name"] == "c"]
        return _unscheduled_message(c)

    reason = wait_for("c to wait with a reason", waiting, timeout=30, logs=sched)
    assert "GPU" in reason or "gpu" in reason, reason
    assert len(_reservations(cp)) == 1

    # For autoscalers: a whole-GPU scaling pod, pending and marked unschedulable, where c may
    # run (made with the shipped RBAC).
    (scaling,) = wait_for(
        "a scaling pod for c", lambda: _scaling_for(cp, f"{namespace}/c"), timeout=15, logs=sched
    )
    assert scaling["spec"]["nodeSelector"] == tag and not scaling["spec"].get("nodeName")
    scheduled = [c for c in scaling["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert [(c["status"], c["reason"]) for c in scheduled] == [("False", "Unschedulable")]

    # The sharers go (c first, so it does not take the device): so does the reservation pod.
    cp.kubectl("delete", "pod", "c", "-n", namespace, "--wait=false")
    wait_for(
        "the scaling pod deleted",
        lambda: not _scaling_for(cp, f"{namespace}/c"),
        timeout=10,
        logs=sched,
    )
    cp.kubectl("delete", "pod", "a", "b", "-n", namespace, "--wait=false")
    wait_for("the reservation pod deleted", lambda: not _reservations(cp), timeout=10, logs=sched)


def test_chart_turns_sharing_on_with_the_same_rules(control_plane: ControlPlane) -> None:
    chart = str(REPO / "manifests" / "chart")
    off = control_plane.helm("template", "k", chart, "-n", "kai-scheduler").stdout
    assert "MutatingWebhookConfiguration" not in off and RESERVATION_NAMESPACE not in off
    rendered = control_plane.helm(
        "template", "k", chart, "-n", "kai-scheduler", "--set", "gpuSharing.enabled=true"
    ).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    plain = [
        d for d in yaml.safe_load_all((REPO / "manifests" / "25-gpu-sharing.yaml").read_text())
    ]

    def reservation_role(objs: list[dict[str, Any]]) -> Any:
        (role,) = [
            d
            for d in objs
            if d["kind"] == "Role" and d["metadata"]["namespace"] == RESERVATION_NAMESPACE
        ]
        return role["rules"]

    assert reservation_role(docs) == reservation_role(plain)
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
    config = yaml.safe_load(config_map["data"]["config.yaml"])["gpuSharing"]
    assert config["enabled"] is True and config["webhookAddress"] == "0.0.0.0:8443"
    (hook,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    (webhook,) = hook["webhooks"]
    assert webhook["clientConfig"]["service"]["path"] == MUTATE_PATH
    assert webhook["clientConfig"]["caBundle"] and webhook["matchConditions"]
    (secret,) = [d for d in docs if d["kind"] == "Secret"]
    (deploy,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "k-kai-scheduler"
    ]
    volumes = {v["name"]: v for v in deploy["spec"]["template"]["spec"]["volumes"]}
    assert volumes["webhook-tls"]["secret"]["secretName"] == secret["metadata"]["name"]


def test_a_share_held_to_avoid_stranding_is_placed_after_the_max_wait(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
    webhook: dict[str, Any],
) -> None:
    """``placement.holdStrandingShares`` on the live path: 7 of 8 devices of the only node of
    its GPU model run whole-GPU pods (12.5 % free), so an 0.81 share would leave 0.19 of the
    idle device that nothing running fits. It waits, its condition naming the rule, and is
    bound once ``holdStrandingMaxWait`` has passed since its creation."""
    tag = run_tag()
    # A GPU model of its own: the rule measures free capacity per model, so nodes other
    # tests leave behind do not count.
    model = {"nvidia.com/gpu.product": f"strand-{tag[next(iter(tag))]}"}
    (node,) = make_gpu_nodes(1, gpus=8, labels={**tag, **model})
    placement = {
        "scoring": "fragmentation",
        "holdStrandingShares": True,
        "holdStrandingMaxWait": "12s",
        "solverWorkers": 1,
    }
    sched = start_scheduler(config={**webhook, "placement": placement})
    whole = [pod_manifest(f"w{i}", gpus=1, node_selector={**tag, **model}) for i in range(7)]
    kai_cluster.create(*whole, namespace=namespace)
    wait_for(
        "7 whole-GPU pods bound",
        lambda: len([p for p in kai_cluster.pods(namespace) if p["spec"].get("nodeName")]) == 7,
        timeout=30,
        logs=sched,
    )
    share = pod_manifest(
        "share", node_selector={**tag, **model}, annotations={"gpu-fraction": "0.81"}
    )
    share["spec"]["terminationGracePeriodSeconds"] = 0
    kai_cluster.create(share, namespace=namespace)

    def share_pod() -> dict[str, Any]:
        (pod,) = [p for p in kai_cluster.pods(namespace) if p["metadata"]["name"] == "share"]
        return pod

    def held() -> str:
        message = _unscheduled_message(share_pod())
        return message if "holdStrandingShares" in message else ""

    message = wait_for("the share held back", held, timeout=10, logs=sched)
    assert "190 thousandths" in message and "holdStrandingMaxWait" in message, message
    assert not share_pod()["spec"].get("nodeName")
    bound = wait_for(
        "the share bound after its longest wait",
        lambda: share_pod()["spec"].get("nodeName") or "",
        timeout=40,
        logs=sched,
    )
    assert bound == node
    created = share_pod()["metadata"]["creationTimestamp"]
    grant = json.loads(share_pod()["metadata"]["annotations"][GPU_GRANT_ANNOTATION])
    assert list(grant.values()) == [810], (created, grant)
