"""Fields that affect placement, against the real control plane: scheduling gates, placement
rules not supported yet, and pods whose author set ``spec.nodeName``.

The product's rule: a field that affects placement and is not implemented makes the pod wait
with a reason naming it; it is never silently ignored. Every test uses a fresh namespace and
fresh nodes labelled with a per-test tag that its pods select.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.e2e.scheduler_process import (
    KaiCluster,
    StartScheduler,
    bound_nodes,
    kai_cluster,
    pod_manifest,
    run_tag,
    start_scheduler,
    wait_for,
)

pytestmark = pytest.mark.e2e
__all__ = ["kai_cluster", "start_scheduler"]  # fixtures used by this module

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
#: Namespace labels are not watched, so a term selecting namespaces by label is not read.
NS_SELECTOR = f"spec.affinity.podAntiAffinity.{REQUIRED}[0].namespaceSelector"


def _condition(pod: dict[str, Any], kind: str = "PodScheduled") -> dict[str, Any]:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return {}


def _pod(kai_cluster: KaiCluster, namespace: str, name: str) -> dict[str, Any]:
    return next(p for p in kai_cluster.pods(namespace) if p["metadata"]["name"] == name)


def _events(kai_cluster: KaiCluster, namespace: str, pod: str, reason: str) -> list[str]:
    return [
        str(e.get("message", ""))
        for e in kai_cluster.events(namespace)
        if e["involvedObject"].get("name") == pod and e.get("reason") == reason
    ]


def test_gated_pod_waits_until_its_gate_is_removed(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    tag = run_tag()
    make_gpu_nodes(1, gpus=4, labels=tag)
    sched = start_scheduler()
    gated = pod_manifest("gated", gpus=1, node_selector=tag)
    gated["spec"]["schedulingGates"] = [{"name": "example.com/gate"}]
    plain = pod_manifest("plain", gpus=1, node_selector=tag)
    kai_cluster.create(gated, plain, namespace=namespace)

    # The ungated pod binds; cycles go by, and the gated one stays as the API server made it.
    wait_for("plain bound", lambda: "plain" in bound_nodes(kai_cluster.pods(namespace)), logs=sched)
    time.sleep(1.5)
    pod = _pod(kai_cluster, namespace, "gated")
    assert not pod["spec"].get("nodeName")
    condition = _condition(pod)
    assert (condition.get("status"), condition.get("reason")) == ("False", "SchedulingGated")
    assert not _events(kai_cluster, namespace, "gated", "FailedScheduling")

    kai_cluster.cp.kubectl(
        "patch", "pod", "gated", "-n", namespace, "--type=json",
        "-p", json.dumps([{"op": "remove", "path": "/spec/schedulingGates"}]),
    )  # fmt: skip
    wait_for(
        "gated bound once its gate is removed",
        lambda: "gated" in bound_nodes(kai_cluster.pods(namespace)),
        logs=sched,
    )
    assert sched.running()


def test_anti_affinity_selecting_namespaces_by_label_waits_with_a_reason_naming_it(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    """A pod anti-affinity term whose namespaceSelector selects by labels waits, named; the
    same rule without it (read and honoured) does not, nor does any other pod."""
    tag = run_tag()
    make_gpu_nodes(2, gpus=4, labels=tag)
    sched = start_scheduler()
    term = {
        "labelSelector": {"matchLabels": {"app": "web"}},
        "topologyKey": "kubernetes.io/hostname",
    }
    anti = pod_manifest("anti", gpus=1, node_selector=tag, labels={"app": "web"})
    anti["spec"]["affinity"] = {
        "podAntiAffinity": {
            REQUIRED: [{**term, "namespaceSelector": {"matchLabels": {"team": "a"}}}]
        }
    }
    readable = pod_manifest("readable", gpus=1, node_selector=tag, labels={"app": "web"})
    readable["spec"]["affinity"] = {"podAntiAffinity": {REQUIRED: [term]}}
    plain = pod_manifest("plain", gpus=1, node_selector=tag)
    kai_cluster.create(anti, readable, plain, namespace=namespace)

    def waiting_message() -> str | None:
        c = _condition(_pod(kai_cluster, namespace, "anti"))
        if c.get("status") == "False" and c.get("reason") == "Unschedulable":
            return str(c.get("message", ""))
        return None

    message = wait_for("PodScheduled=False on anti", waiting_message, logs=sched)
    assert message == (
        f"pod {namespace}/anti: {NS_SELECTOR} is not supported yet; the pod waits (list the "
        "namespaces in `namespaces` (or use namespaceSelector: {} for all), and give every term "
        "a topologyKey and a labelSelector with In/NotIn/Exists/DoesNotExist)"
    )
    events = wait_for(
        "FailedScheduling on anti",
        lambda: _events(kai_cluster, namespace, "anti", "FailedScheduling"),
        logs=sched,
    )
    assert all(NS_SELECTOR in e for e in events), events
    # Everything else keeps being scheduled, the readable rule included; "anti" never binds.
    wait_for(
        "plain and readable bound",
        lambda: {"plain", "readable"} <= set(bound_nodes(kai_cluster.pods(namespace))),
        logs=sched,
    )
    time.sleep(1.0)
    assert "anti" not in bound_nodes(kai_cluster.pods(namespace))
    assert not _events(kai_cluster, namespace, "readable", "FailedScheduling")
    assert sched.running()


def test_pod_with_node_name_set_by_its_author_is_left_alone_and_counted(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    tag = run_tag()
    (node,) = make_gpu_nodes(1, gpus=8, labels=tag)
    sched = start_scheduler()
    pinned = pod_manifest("pinned", gpus=6)
    pinned["spec"]["nodeName"] = node  # our schedulerName, but placed by its author
    kai_cluster.create(pinned, namespace=namespace)
    wait_for(
        "pinned Running",
        lambda: _pod(kai_cluster, namespace, "pinned")["status"].get("phase") == "Running",
        logs=sched,
    )
    # 2 of the node's 8 GPUs are free: a 4-GPU pod waits, a 2-GPU pod binds.
    big = pod_manifest("big", gpus=4, node_selector=tag)
    small = pod_manifest("small", gpus=2, node_selector=tag)
    kai_cluster.create(big, small, namespace=namespace)
    wait_for("small bound", lambda: "small" in bound_nodes(kai_cluster.pods(namespace)), logs=sched)

    def big_waiting() -> str | None:
        c = _condition(_pod(kai_cluster, namespace, "big"))
        return str(c.get("message")) if c.get("reason") == "Unschedulable" else None

    message = wait_for("big waits", big_waiting, logs=sched)
    assert "4 GPUs" in message, message
    pods = kai_cluster.pods(namespace)
    assert bound_nodes(pods) == {"pinned": node, "small": node}
    # Never bound (nor told it was scheduled) by us, and no grant written for it.
    assert not _events(kai_cluster, namespace, "pinned", "Scheduled")
    assert not _events(kai_cluster, namespace, "pinned", "FailedScheduling")
    pinned_now = _pod(kai_cluster, namespace, "pinned")
    assert "kai.scheduler/gpu-grant" not in (pinned_now["metadata"].get("annotations") or {})
    assert sched.running()


def test_host_port_one_pod_per_node(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    """Two nodes, three pods on host port 8080: one per node, the third waits saying why."""
    tag = run_tag()
    make_gpu_nodes(2, gpus=4, labels=tag)
    sched = start_scheduler()
    pods = [pod_manifest(f"web-{i}", gpus=1, node_selector=tag) for i in range(3)]
    for p in pods:
        p["spec"]["containers"][0]["ports"] = [{"containerPort": 8080, "hostPort": 8080}]
    kai_cluster.create(*pods, namespace=namespace)

    def two_bound() -> dict[str, str] | None:
        bound = bound_nodes(kai_cluster.pods(namespace))
        return bound if len(bound) == 2 else None

    bound = wait_for("two web pods bound", two_bound, logs=sched)
    assert len(set(bound.values())) == 2, bound  # never two on one node
    (left,) = {f"web-{i}" for i in range(3)} - set(bound)

    def waiting_message() -> str | None:
        c = _condition(_pod(kai_cluster, namespace, left))
        if c.get("status") == "False" and c.get("reason") == "Unschedulable":
            return str(c.get("message", ""))
        return None

    message = wait_for(f"{left} waits", waiting_message, logs=sched)
    assert "host port TCP/8080" in message, message
    time.sleep(1.0)
    assert len(bound_nodes(kai_cluster.pods(namespace))) == 2
