"""The scheduler's writes against the real API server with its own ServiceAccount: binds
(never twice, never to a recreated pod), conditions, Events (rate limited), eviction, status."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from scheduler.cache.grants import GPU_GRANT_ANNOTATION
from scheduler.k8s.client import ClientSettings, make_api_client
from scheduler.k8s.writer import EventLimiter, ObjectRef, Writer
from tests.e2e.scheduler_process import (
    KaiCluster,
    kai_cluster,
    kubectl_json,
    pod_manifest,
    podgroup_manifest,
)

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]
__all__ = ["kai_cluster"]  # fixture used by this module


@pytest.fixture
async def writer(kai_cluster: KaiCluster) -> AsyncIterator[Writer]:
    api: ApiClient = await make_api_client(ClientSettings(kube_config=str(kai_cluster.kubeconfig)))
    try:
        yield Writer(api, instance="test", limiter=EventLimiter(interval=60.0))
    finally:
        await api.close()


def _pod(cluster: KaiCluster, namespace: str, name: str) -> dict[str, Any]:
    return dict(kubectl_json(cluster.cp, "get", "pod", name, "-n", namespace))


def _unmanaged(name: str) -> dict[str, Any]:
    # Nobody else schedules this pod: only our explicit calls bind it.
    return pod_manifest(name, scheduler_name="nobody")


async def test_bind_once_then_conflicts_are_understood(
    kai_cluster: KaiCluster, writer: Writer, namespace: str, make_gpu_nodes: Any
) -> None:
    a, b = make_gpu_nodes(2, gpus=2)
    kai_cluster.create(_unmanaged("p"), namespace=namespace)
    pod = _pod(kai_cluster, namespace, "p")
    uid = pod["metadata"]["uid"]
    first = await writer.bind(namespace, "p", uid, a, {1: 1000})
    assert first.bound, first.error
    again = await writer.bind(namespace, "p", uid, a, {1: 1000})  # a lost answer, retried
    assert again.bound and again.observed is not None
    # Same node, other devices: not our earlier bind, so not a success; what the pod holds
    # comes back so the cache can count the devices it really has.
    moved = await writer.bind(namespace, "p", uid, a, {0: 1000})
    assert not moved.bound and moved.observed is not None
    assert moved.observed["metadata"]["annotations"][GPU_GRANT_ANNOTATION] == '{"1":1000}'
    other = await writer.bind(namespace, "p", uid, b)  # never a second node
    assert not other.bound and a in other.error and not other.uncertain
    got = _pod(kai_cluster, namespace, "p")
    assert got["spec"]["nodeName"] == a
    assert json.loads(got["metadata"]["annotations"][GPU_GRANT_ANNOTATION]) == {"1": 1000}


async def test_bind_refuses_a_recreated_pod_with_the_same_name(
    kai_cluster: KaiCluster, writer: Writer, namespace: str, make_gpu_nodes: Any
) -> None:
    (node,) = make_gpu_nodes(1, gpus=1)
    kai_cluster.create(_unmanaged("p"), namespace=namespace)
    old_uid = _pod(kai_cluster, namespace, "p")["metadata"]["uid"]
    kai_cluster.cp.kubectl("delete", "pod", "p", "-n", namespace, "--grace-period=0", "--force")
    kai_cluster.create(_unmanaged("p"), namespace=namespace)
    result = await writer.bind(namespace, "p", old_uid, node)
    assert not result.bound
    assert not _pod(kai_cluster, namespace, "p")["spec"].get("nodeName")


async def test_condition_and_rate_limited_events(
    kai_cluster: KaiCluster, writer: Writer, namespace: str
) -> None:
    kai_cluster.create(_unmanaged("p"), namespace=namespace)
    pod = _pod(kai_cluster, namespace, "p")
    await writer.set_unschedulable(namespace, "p", "queue team-a is at its gpu limit (8/8)")
    conditions = _pod(kai_cluster, namespace, "p")["status"]["conditions"]
    assert [(c["type"], c["status"], c["reason"], c["message"]) for c in conditions] == [
        ("PodScheduled", "False", "Unschedulable", "queue team-a is at its gpu limit (8/8)")
    ]
    ref = ObjectRef("Pod", "v1", "p", namespace, pod["metadata"]["uid"])
    assert await writer.event(ref, "FailedScheduling", "reason one", warning=True)
    assert not await writer.event(ref, "FailedScheduling", "reason one", warning=True)
    assert await writer.event(ref, "FailedScheduling", "reason two", warning=True)
    events = [e for e in kai_cluster.events(namespace) if e["reason"] == "FailedScheduling"]
    assert sorted(e["message"] for e in events) == ["reason one", "reason two"]
    assert all(e["type"] == "Warning" and e["involvedObject"]["uid"] == ref.uid for e in events)


async def test_the_grant_travels_with_the_bind_and_only_the_leader_writes(
    kai_cluster: KaiCluster, writer: Writer, namespace: str, make_gpu_nodes: Any
) -> None:
    (node,) = make_gpu_nodes(1, gpus=2)
    for name in ("p", "q"):
        kai_cluster.create(_unmanaged(name), namespace=namespace)
    follower = Writer(writer.api, instance="test", may_write=lambda: False)
    uid = _pod(kai_cluster, namespace, "p")["metadata"]["uid"]
    refused = await follower.bind(namespace, "p", uid, node, {0: 500})
    assert not refused.bound and "not the leader" in refused.error
    assert not await follower.event(ObjectRef("Pod", "v1", "p", namespace, uid), "X", "y")
    untouched = _pod(kai_cluster, namespace, "p")
    assert not untouched["spec"].get("nodeName")
    assert GPU_GRANT_ANNOTATION not in (untouched["metadata"].get("annotations") or {})
    done = await writer.bind(namespace, "p", uid, node, {1: 1000, 0: 500})
    assert done.bound, done.error
    bound = _pod(kai_cluster, namespace, "p")
    assert bound["spec"]["nodeName"] == node
    assert json.loads(bound["metadata"]["annotations"][GPU_GRANT_ANNOTATION]) == {
        "0": 500,
        "1": 1000,
    }


async def test_evict_and_crd_status(
    kai_cluster: KaiCluster, writer: Writer, namespace: str, make_gpu_nodes: Any
) -> None:
    (node,) = make_gpu_nodes(1, gpus=1)
    kai_cluster.create(
        _unmanaged("p"),
        podgroup_manifest("pg", 1, queue=None),
        namespace=namespace,
    )
    uid = _pod(kai_cluster, namespace, "p")["metadata"]["uid"]
    assert (await writer.bind(namespace, "p", uid, node)).bound
    assert await writer.evict(namespace, "p", uid)
    path = "jsonpath={.metadata.deletionTimestamp}"
    gone = kai_cluster.cp.kubectl("get", "pod", "p", "-n", namespace, "-o", path, check=False)
    assert gone.returncode != 0 or gone.stdout.strip(), "evicted pod neither gone nor deleting"
    assert await writer.evict(namespace, "missing", "")  # already gone counts as evicted
    await writer.patch_podgroup_status(namespace, "pg", {"phase": "Running", "running": 1})
    pg = kubectl_json(kai_cluster.cp, "get", "podgroup", "pg", "-n", namespace)
    assert pg["status"]["phase"] == "Running" and pg["status"]["running"] == 1
    await writer.patch_queue_status(
        "default-queue", {"allocated": {"gpu": 0, "cpu": 0, "memory": 0}}
    )
    queue = kubectl_json(kai_cluster.cp, "get", "queue", "default-queue")
    assert queue["status"]["allocated"]["gpu"] == 0
