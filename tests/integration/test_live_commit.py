"""The live commit path against a real API server when the watch is slow or absent.

The cache is fed by one list and then only by what each test hands it, which is exactly what
a stalled watch looks like to the scheduler: binds go out, the API server applies them, and
the cache hears nothing back. A scheduler that let its assumptions lapse after a fixed time
would then see the bound pod as pending again, place it a second time and grant its device to
another pod; these tests advance the cache's clock far past any such limit and check that the
devices on the API server and in the cache stay single-booked.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from scheduler.cache import Cache
from scheduler.cache.grants import GPU_GRANT_ANNOTATION
from scheduler.commit import LiveBackend
from scheduler.cycle import run_cycle
from scheduler.k8s.resources import ResourceKind
from scheduler.k8s.watch import Watcher, WatchSettings
from scheduler.k8s.writer import Writer
from scheduler.solver import PlacementSettings
from testenv.controlplane import ControlPlane
from tests.integration.support import kubectl

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

#: Nobody else schedules these pods: only the cycles run by the tests bind them.
SCHED = "kai-scheduler-live-commit"
SETTINGS = PlacementSettings()


class Clock:
    """The cache's wall clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def gpu_pod(name: str, gpus: int = 1) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "schedulerName": SCHED,
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.invalid/fake:1",
                        "resources": {
                            "requests": {"cpu": "1", "nvidia.com/gpu": str(gpus)},
                            "limits": {"cpu": "1", "nvidia.com/gpu": str(gpus)},
                        },
                    }
                ],
            },
        }
    )


async def list_once(api: ApiClient, cache: Cache) -> None:
    """One list of every kind into the cache, and no watch after it (a stalled watch)."""
    await Watcher(api, cache).run(iterations=1)


async def get_pod(api: ApiClient, namespace: str, name: str) -> dict[str, Any]:
    pod = await Writer(api).get_pod(namespace, name)
    assert pod is not None
    return pod


async def test_a_stalled_watch_never_double_books_a_device(
    control_plane: ControlPlane, api: ApiClient, namespace: str, make_gpu_nodes: Any
) -> None:
    cp = control_plane
    (node,) = await asyncio.to_thread(make_gpu_nodes, 1, gpus=1, name_prefix=f"{namespace}-n")
    await kubectl(cp, "apply", "-n", namespace, "-f", "-", input=gpu_pod("first"))
    clock = Clock()
    cache = Cache(SCHED, "default-queue", clock, assume_ttl=30.0)
    await list_once(api, cache)
    backend = LiveBackend(cache, Writer(api))

    report = await run_cycle(backend, SETTINGS, 1)
    assert report.commit.dispatched_pods == 1, report.placement.outcomes
    await backend.flush()
    first = await get_pod(api, namespace, "first")
    for _ in range(100):  # kwok marks it Running: a write of its own, before we compare
        if first.get("status", {}).get("phase") == "Running":
            break
        await asyncio.sleep(0.1)
        first = await get_pod(api, namespace, "first")
    assert first["spec"]["nodeName"] == node
    # The grant was written by the bind itself.
    assert json.loads(first["metadata"]["annotations"][GPU_GRANT_ANNOTATION]) == {"0": 1000}

    # A second pod arrives (the cache learns of it), but the watch never reports the bind.
    await kubectl(cp, "apply", "-n", namespace, "-f", "-", input=gpu_pod("second"))
    cache.apply("Pod", "ADDED", await get_pod(api, namespace, "second"))
    for cycle in range(2, 6):
        clock.now += 3600.0  # far past any fixed assumption lifetime
        report = await run_cycle(backend, SETTINGS, cycle)
        await backend.flush()
        assert report.commit.dispatched_pods == 0, f"cycle {cycle} placed something again"
        states = report.snapshot.node_states()
        assert states[node].gpu_free == (0,)

    # The read-back confirmed the bind without the watch; the API agrees with the cache.
    assert cache.assumed() == {}
    first_after = await get_pod(api, namespace, "first")
    assert first_after["spec"]["nodeName"] == node
    assert first_after["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    second = await get_pod(api, namespace, "second")
    assert not second["spec"].get("nodeName")

    # The slow watch finally delivers the pre-bind ADDED event of "first": older, ignored.
    stale = dict(first)
    stale["metadata"] = {**first["metadata"], "resourceVersion": "1"}
    stale["spec"] = {**first["spec"], "nodeName": None}
    cache.apply("Pod", "MODIFIED", stale)
    assert cache.snapshot().node_states()[node].gpu_free == (0,)


async def test_a_refused_bind_frees_its_device_at_once(
    control_plane: ControlPlane, api: ApiClient, namespace: str, make_gpu_nodes: Any
) -> None:
    cp = control_plane
    (node,) = await asyncio.to_thread(make_gpu_nodes, 1, gpus=1, name_prefix=f"{namespace}-n")
    await kubectl(cp, "apply", "-n", namespace, "-f", "-", input=gpu_pod("p"))
    cache = Cache(SCHED, "default-queue", Clock())
    await list_once(api, cache)
    # The pod is deleted before the cycle binds it: the bind is refused for good (404).
    await kubectl(cp, "delete", "pod", "p", "-n", namespace, "--grace-period=0", "--force")
    backend = LiveBackend(cache, Writer(api))
    report = await run_cycle(backend, SETTINGS, 1)
    assert report.commit.dispatched_pods == 1
    await backend.flush()
    assert cache.assumed() == {}
    assert cache.snapshot().node_states()[node].gpu_free == (1000,)


async def test_scheduling_goes_on_when_a_crd_is_not_installed(
    control_plane: ControlPlane, api: ApiClient, namespace: str
) -> None:
    # A made-up custom kind stands for a CRD that is not installed (deleting our real CRDs
    # would disturb the other tests sharing this control plane).
    missing = ResourceKind("Widget", "example.invalid", "v1", "widgets", namespaced=True)
    cache = Cache(SCHED, "default-queue")
    watcher = Watcher(
        api,
        cache,
        ("Pod", "Node", missing),
        settings=WatchSettings(watch_timeout=5, backoff_base=0.05, backoff_max=0.2),
    )
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.wait_for(watcher.synced.wait(), 30)
        assert watcher.absent == {"Widget"}
        assert watcher.listed == {"Pod", "Node", "Widget"}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class RecordingWriter(Writer):
    """A real writer that notes how many pods the cache had assumed when its first bind went out."""

    def __init__(self, api: ApiClient, cache: Cache) -> None:
        super().__init__(api)
        self.cache = cache
        self.assumed_at_first_bind: int | None = None

    async def bind(self, *args: Any, **kwargs: Any) -> Any:
        if self.assumed_at_first_bind is None:
            self.assumed_at_first_bind = len(self.cache.assumed())
        return await super().bind(*args, **kwargs)


async def test_binds_go_out_while_a_big_placement_is_still_being_assumed(
    control_plane: ControlPlane, api: ApiClient, namespace: str, make_gpu_nodes: Any
) -> None:
    """The commit lets dispatched binds run while it assumes the rest (every 20 ms by default;
    here after every gang), so a cycle that placed thousands of gangs does not hold its first
    bind back until all are assumed. All are assumed by the time the commit returns."""
    cp = control_plane
    sched = f"{SCHED}-burst"  # only this test's pods are pending for it
    await asyncio.to_thread(make_gpu_nodes, 1, gpus=8, name_prefix=f"{namespace}-n")
    count = 30
    items = []
    for i in range(count):
        pod = json.loads(gpu_pod(f"p{i}", gpus=0))
        pod["spec"]["schedulerName"] = sched
        items.append(pod)
    await kubectl(
        cp, "apply", "-n", namespace, "-f", "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
    )  # fmt: skip
    cache = Cache(sched, "default-queue")
    await list_once(api, cache)
    writer = RecordingWriter(api, cache)
    backend = LiveBackend(cache, writer, yield_every=0.0)
    report = await run_cycle(backend, SETTINGS, 1)
    assert report.commit.dispatched_pods == count, report.placement.outcomes
    # Every pod was assumed before the commit returned...
    assert len(cache.assumed()) == count
    await backend.flush()
    # ...but the first bind did not wait for the last assumption.
    assert writer.assumed_at_first_bind is not None
    assert writer.assumed_at_first_bind < count
    for i in range(count):
        assert (await get_pod(api, namespace, f"p{i}"))["spec"].get("nodeName"), f"p{i} unbound"
