"""The scheduler as a process on the real control plane: Deployments, gangs, queue limits.

The scheduler runs with the shipped ServiceAccount + ClusterRole (see ``kai_cluster``).
Every test uses a fresh namespace and fresh nodes labelled with a per-test tag that its pods
select, so leftovers of other tests can never take or offer capacity.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

from tests.e2e.scheduler_process import (
    KaiCluster,
    StartScheduler,
    bound_nodes,
    kai_cluster,
    kubectl_json,
    pod_manifest,
    podgroup_manifest,
    run_tag,
    start_scheduler,
    wait_for,
)

pytestmark = pytest.mark.e2e
__all__ = ["kai_cluster", "start_scheduler"]  # fixtures used by this module


def _condition(pod: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return None


def _unschedulable_messages(pods: list[dict[str, Any]]) -> dict[str, str]:
    out = {}
    for p in pods:
        c = _condition(p, "PodScheduled")
        if c and c.get("status") == "False" and c.get("reason") == "Unschedulable":
            out[p["metadata"]["name"]] = str(c.get("message", ""))
    return out


def test_deployment_of_five_gpu_pods_runs(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    tag = run_tag()
    nodes = make_gpu_nodes(2, gpus=4, labels=tag)
    sched = start_scheduler()
    template = pod_manifest("x", gpus=1, node_selector=tag, labels={"app": "five"})
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "five"},
        "spec": {
            "replicas": 5,
            "selector": {"matchLabels": {"app": "five"}},
            "template": {
                "metadata": template["metadata"] | {"name": None},
                "spec": template["spec"],
            },
        },
    }
    del deployment["spec"]["template"]["metadata"]["name"]
    kai_cluster.create(deployment, namespace=namespace)

    def running() -> list[dict[str, Any]] | None:
        pods = kai_cluster.pods(namespace)
        ok = [p for p in pods if p["status"].get("phase") == "Running"]
        return pods if len(ok) == 5 and len(pods) == 5 else None

    pods = wait_for("5 Running pods", running, timeout=60, logs=sched)
    assert set(bound_nodes(pods).values()) <= set(nodes)
    # GPUs fit: at most 4 single-GPU pods per 4-GPU node, and each has a device grant.
    per_node: dict[str, int] = {}
    for node in bound_nodes(pods).values():
        per_node[node] = per_node.get(node, 0) + 1
    assert max(per_node.values()) <= 4
    for p in pods:
        grant = p["metadata"].get("annotations", {}).get("kai.scheduler/gpu-grant")
        assert grant is not None and sum(json.loads(grant).values()) == 1000

    def scheduled_events() -> set[str] | None:
        got = {
            e["involvedObject"]["name"]
            for e in kai_cluster.events(namespace)
            if e["reason"] == "Scheduled"
        }
        return got if len(got) >= len(bound_nodes(pods)) else None

    # Events go out as binds land, so the last may trail the pods by a moment.
    scheduled = wait_for("Scheduled events", scheduled_events, timeout=10, logs=sched)
    assert scheduled == set(bound_nodes(pods))
    assert sched.running()


def test_gang_waits_for_room_then_binds_whole(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    tag = run_tag()
    make_gpu_nodes(2, gpus=4, labels=tag)
    sched = start_scheduler()
    # Take 2 of the 8 GPUs so only 6 are free: 4 pods x 2 GPUs cannot all fit.
    kai_cluster.create(pod_manifest("blocker", gpus=2, node_selector=tag), namespace=namespace)
    wait_for("blocker bound", lambda: bound_nodes(kai_cluster.pods(namespace)), logs=sched)
    podgroup = podgroup_manifest("train", 4)
    members = [
        pod_manifest(
            f"train-{i}", gpus=2, node_selector=tag, annotations={"pod-group-name": "train"}
        )
        for i in range(4)
    ]
    kai_cluster.create(podgroup, *members, namespace=namespace)

    def all_waiting() -> dict[str, str] | None:
        pods = [p for p in kai_cluster.pods(namespace) if p["metadata"]["name"] != "blocker"]
        msgs = _unschedulable_messages(pods)
        return msgs if len(msgs) == 4 else None

    messages = wait_for("PodScheduled=False on the 4 members", all_waiting, logs=sched)
    gang_pods = [p for p in kai_cluster.pods(namespace) if p["metadata"]["name"] != "blocker"]
    assert not bound_nodes(gang_pods), "no member may be bound while the gang cannot fit"
    assert all("train" in m for m in messages.values()), messages
    # A few more cycles: still nothing bound.

    time.sleep(1.5)
    gang_pods = [p for p in kai_cluster.pods(namespace) if p["metadata"]["name"] != "blocker"]
    assert not bound_nodes(gang_pods)
    pg = kai_cluster.cp.kubectl(
        "get", "podgroup", "train", "-n", namespace, "-o", "jsonpath={.status.phase}"
    ).stdout
    assert pg == "Unschedulable"

    kai_cluster.cp.kubectl(
        "delete", "pod", "blocker", "-n", namespace, "--grace-period=0", "--force"
    )

    def all_bound() -> dict[str, str] | None:
        b = bound_nodes(kai_cluster.pods(namespace))
        return b if len(b) == 4 else None

    bound = wait_for("all 4 members bound", all_bound, timeout=30, logs=sched)
    assert set(bound) == {f"train-{i}" for i in range(4)}
    wait_for(
        "PodGroup Running",
        lambda: (
            kai_cluster.cp.kubectl(
                "get", "podgroup", "train", "-n", namespace, "-o", "jsonpath={.status.phase}"
            ).stdout
            == "Running"
        ),
        logs=sched,
    )


def test_queue_gpu_limit_caps_binds(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    tag = run_tag()
    make_gpu_nodes(1, gpus=8, labels=tag)
    queue = f"team-{uuid.uuid4().hex[:6]}"
    kai_cluster.apply(
        {
            "apiVersion": "scheduling.run.ai/v2",
            "kind": "Queue",
            "metadata": {"name": queue},
            "spec": {"resources": {"gpu": {"quota": 2, "limit": 4}}},
        }
    )
    try:
        sched = start_scheduler()
        pods = [
            pod_manifest(f"p-{i}", gpus=1, node_selector=tag, labels={"kai.scheduler/queue": queue})
            for i in range(6)
        ]
        kai_cluster.create(*pods, namespace=namespace)

        def settled() -> tuple[dict[str, str], dict[str, str]] | None:
            current = kai_cluster.pods(namespace)
            bound, waiting = bound_nodes(current), _unschedulable_messages(current)
            return (bound, waiting) if len(bound) == 4 and len(waiting) == 2 else None

        _, waiting = wait_for("4 bound and 2 waiting", settled, logs=sched)
        assert all("limit" in m and queue in m for m in waiting.values()), waiting

        time.sleep(1.5)  # more cycles never bind past the limit
        assert len(bound_nodes(kai_cluster.pods(namespace))) == 4
        status = kai_cluster.cp.kubectl(
            "get", "queue", queue, "-o", "jsonpath={.status.allocated.gpu}"
        ).stdout
        assert status == "4"
        queue_status = kubectl_json(kai_cluster.cp, "get", "queue", queue)["status"]
        assert queue_status["requested"]["gpu"] == 6
        assert float(queue_status["fairShare"]["gpu"]) <= 4  # never past the limit
    finally:
        kai_cluster.cp.kubectl("delete", "queue", queue, "--ignore-not-found")
