"""GPU sharing's writes against a real API server (scheduler.commit.gpusharing).

A cache kept current by a running watcher, the real bind path (a cycle on a LiveBackend with
GPU sharing), and kwok running the pods: the reservation pod that holds a shared device is
created once before the sharers bind, each sharer's device ConfigMap is written and owned by
it, and the collection recreates a reservation pod deleted under live sharers and deletes an
unused one only on its second unused pass.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from scheduler.cache import Cache
from scheduler.cluster.gpusharing import (
    RESERVATION_LABEL,
    SCALING_LABEL,
    VISIBLE_DEVICES_KEY,
    Reservation,
)
from scheduler.cluster.pod import Pod
from scheduler.commit import LiveBackend
from scheduler.commit.gpusharing import RESTORE_PASSES, SCALE_FOR, GpuSharing
from scheduler.cycle import run_cycle
from scheduler.k8s.resources import CONFIG_MAP
from scheduler.k8s.writer import Writer
from scheduler.solver import PlacementSettings
from scheduler.solver.placement import PodAssignment
from testenv.controlplane import ControlPlane
from tests.integration.support import eventually, kubectl, watched

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

#: Nobody else schedules these pods: only the cycles run by the test bind them.
SCHED = "kai-scheduler-gpu-sharing"


def share_pod(name: str, fraction: str = "0.5") -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "annotations": {"gpu-fraction": fraction}},
            "spec": {
                "schedulerName": SCHED,
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.invalid/fake:1",
                        "resources": {"requests": {"cpu": "100m"}},
                    }
                ],
            },
        }
    )


def ours(cache: Cache, namespace: str) -> list[Pod]:
    """The cache's pods of this test (the control plane is shared with other modules)."""
    return [p for p in cache.snapshot().pods if p.namespace == namespace]


def held(cache: Cache, namespace: str) -> list[Reservation]:
    """Reservation pods of this test the watch shows (each test keeps its own namespace)."""
    return [r for r in cache.reservations() if r.namespace == namespace]


async def reservation_pods(cp: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    out = await kubectl(cp, "get", "pods", "-n", namespace, "-l", RESERVATION_LABEL, "-o", "json")
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


async def test_reservation_held_filled_and_collected(
    control_plane: ControlPlane, api: ApiClient, namespace: str, make_gpu_nodes: Any
) -> None:
    cp = control_plane
    (node,) = await asyncio.to_thread(make_gpu_nodes, 1, gpus=1)
    for name in ("a", "b"):
        await kubectl(cp, "apply", "-n", namespace, "-f", "-", input=share_pod(name))
    writer = Writer(api)
    async with watched(api, SCHED) as cache:
        await eventually("both sharers in the cache", lambda: len(ours(cache, namespace)) >= 2)
        # Reservation pods in the test's namespace keep tests apart (any namespace works).
        sharing = GpuSharing(cache, writer, namespace=namespace)
        backend = LiveBackend(cache, writer, sharing=sharing)
        report = await run_cycle(backend, PlacementSettings(), 1)
        assert report.commit.dispatched_pods == 2, report.placement.outcomes
        await backend.flush()

        # One reservation pod holds the one device, bound to the node by nodeName.
        (reservation,) = await reservation_pods(cp, namespace)
        assert reservation["spec"]["nodeName"] == node
        (container,) = reservation["spec"]["containers"]
        assert container["resources"]["requests"] == {"nvidia.com/gpu": "1"}
        uid = reservation["metadata"]["uid"]

        # Each sharer's ConfigMap names the device and goes with the pod.
        for name in ("a", "b"):
            pod = await writer.get_pod(namespace, name)
            assert pod is not None and pod["spec"]["nodeName"] == node
            config_map = await writer.get_object(CONFIG_MAP, namespace, f"{name}-gpu-share")
            assert config_map is not None, name
            assert config_map["data"][VISIBLE_DEVICES_KEY] == "0"
            (owner,) = config_map["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["uid"]) == ("Pod", pod["metadata"]["uid"])

        # Holding the same device again creates nothing, whether or not the watch has
        # delivered the reservation pod yet.
        assignment = PodAssignment(pod["metadata"]["uid"], f"{namespace}/b", "g", node)
        pods = {p.key: p for p in cache.snapshot().pods}
        assert await sharing.hold([assignment], pods) is None
        await eventually("the watch shows the reservation", lambda: held(cache, namespace))
        assert await sharing.hold([assignment], pods) is None
        assert [r["metadata"]["uid"] for r in await reservation_pods(cp, namespace)] == [uid]

        # Used: never collected.
        assert await sharing.collect() == (0, 0)
        assert await sharing.collect() == (0, 0)

        # Deleted under live sharers: recreated.
        await kubectl(cp, "delete", "pod", "-n", namespace, reservation["metadata"]["name"])
        await eventually("the cache lost the reservation", lambda: not held(cache, namespace))
        assert await sharing.collect() == (0, 1)
        (again,) = await reservation_pods(cp, namespace)
        assert again["metadata"]["uid"] != uid and again["spec"]["nodeName"] == node
        await eventually("the watch shows it again", lambda: held(cache, namespace))

        # Both sharers gone: deleted on the second unused pass, not the first.
        await kubectl(cp, "delete", "pod", "-n", namespace, "a", "b", "--wait=false")
        await eventually(
            "the sharers are gone from the cache",
            lambda: (node, 0) not in cache.shared_devices_in_use(),
        )
        assert await sharing.collect() == (0, 0)
        assert len(await reservation_pods(cp, namespace)) == 1
        assert await sharing.collect() == (1, 0)

        async def reservation_gone() -> bool:
            return not await reservation_pods(cp, namespace)

        for _ in range(100):
            if await reservation_gone():
                break
            await asyncio.sleep(0.1)
        assert await reservation_gone()


async def test_sharers_are_evicted_when_their_device_cannot_be_held_again(
    control_plane: ControlPlane, api: ApiClient, namespace: str, make_gpu_nodes: Any
) -> None:
    cp = control_plane
    (node,) = await asyncio.to_thread(make_gpu_nodes, 1, gpus=1)
    for name in ("a", "b"):
        await kubectl(cp, "apply", "-n", namespace, "-f", "-", input=share_pod(name))
    writer = Writer(api)
    async with watched(api, SCHED) as cache:
        await eventually("both sharers in the cache", lambda: len(ours(cache, namespace)) >= 2)
        backend = LiveBackend(cache, writer, sharing=GpuSharing(cache, writer, namespace=namespace))
        report = await run_cycle(backend, PlacementSettings(), 1)
        assert report.commit.dispatched_pods == 2, report.placement.outcomes
        await backend.flush()
        await eventually("the watch shows the reservation", lambda: held(cache, namespace))

        # The reservation pod is deleted, and recreating it is refused on every pass (here:
        # its namespace does not exist).
        (reservation,) = await reservation_pods(cp, namespace)
        await kubectl(cp, "delete", "pod", "-n", namespace, reservation["metadata"]["name"])
        await eventually("the cache lost the reservation", lambda: not held(cache, namespace))
        broken = GpuSharing(cache, writer, namespace=f"{namespace}-missing")
        for _ in range(RESTORE_PASSES):
            assert await broken.collect() == (0, 0)
            assert await writer.get_pod(namespace, "a") is not None
        await broken.collect()

        def evicted() -> bool:
            return (node, 0) not in cache.shared_devices_in_use()

        await eventually("both sharers evicted", evicted)
        for name in ("a", "b"):
            pod = await writer.get_pod(namespace, name)
            assert pod is None or pod["metadata"].get("deletionTimestamp"), name


async def test_unplaceable_sharing_demand_shows_as_scaling_pods(
    control_plane: ControlPlane, api: ApiClient, namespace: str, make_gpu_nodes: Any
) -> None:
    cp = control_plane
    tag = {"kai-scaling-test": namespace[-6:]}
    await asyncio.to_thread(make_gpu_nodes, 1, gpus=1, labels=tag)

    def pinned(name: str) -> str:
        pod = json.loads(share_pod(name))
        pod["spec"]["nodeSelector"] = tag
        return json.dumps(pod)

    for name in ("a", "b", "c"):
        await kubectl(cp, "apply", "-n", namespace, "-f", "-", input=pinned(name))
    writer = Writer(api)
    async with watched(api, SCHED) as cache:
        await eventually("the pods in the cache", lambda: len(ours(cache, namespace)) >= 3)
        sharing = GpuSharing(cache, writer, namespace=namespace, scaling=True, scheduler_name=SCHED)
        backend = LiveBackend(cache, writer, sharing=sharing)
        report = await run_cycle(backend, PlacementSettings(), 1)
        await backend.flush()
        assert report.commit.dispatched_pods == 2, report.placement.outcomes
        waiting = [o for o in report.placement.outcomes.values() if not o.placed]
        assert len(waiting) == 1 and waiting[0].reason_code in SCALE_FOR, waiting

        # The half GPU nobody has room for: one whole-GPU scaling pod, pending, marked
        # unschedulable, where the pod may run; the scheduler never places it.
        await sharing.collect()
        scaling = [
            p
            for p in json.loads(
                await kubectl(cp, "get", "pods", "-n", namespace, "-l", SCALING_LABEL, "-o", "json")
            )["items"]
        ]
        assert len(scaling) == 1, scaling
        (pod,) = scaling
        assert pod["spec"]["nodeSelector"] == tag and not pod["spec"].get("nodeName")
        assert pod["spec"]["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "1"}
        (condition,) = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
        assert (condition["status"], condition["reason"]) == ("False", "Unschedulable")
        await eventually(
            "the watch shows it",
            lambda: [s for s in cache.scaling_pods() if s.namespace == namespace],
        )
        report = await run_cycle(backend, PlacementSettings(), 2)
        await backend.flush()
        assert report.commit.dispatched_pods == 0
        await sharing.collect()
        assert [s.name for s in cache.scaling_pods() if s.namespace == namespace] == [
            pod["metadata"]["name"]
        ]

        # A node joins (as the autoscaler would add): c is placed, the scaling pod goes.
        (added,) = await asyncio.to_thread(make_gpu_nodes, 1, gpus=1, labels=tag)
        await eventually(
            "the new node in the cache, Ready with its GPU (kwok reports both after creation)",
            lambda: any(
                n.name == added and n.ready and n.gpu_count for n in cache.snapshot().nodes
            ),
        )
        # The live loop runs a cycle on every change; the node's first versions (before
        # kwok and the controllers finish with it) may not take c yet, a later cycle does.
        for number in range(3, 23):
            report = await run_cycle(backend, PlacementSettings(), number)
            await backend.flush()
            if report.commit.dispatched_pods:
                break
            await asyncio.sleep(0.5)
        assert report.commit.dispatched_pods == 1, report.placement.outcomes
        await sharing.collect()
        left = json.loads(
            await kubectl(cp, "get", "pods", "-n", namespace, "-l", SCALING_LABEL, "-o", "json")
        )["items"]
        assert all(p["metadata"].get("deletionTimestamp") for p in left), left
