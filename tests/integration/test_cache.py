"""The cache fed by a real API server: problems for bad input, assume -> bind -> confirm, the
GPU grant surviving a restart, and forget after a failed bind."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from scheduler.cache import Cache
from scheduler.k8s.client import ClientSettings, make_api_client, request_json
from scheduler.k8s.errors import Conflict
from scheduler.k8s.resources import POD
from scheduler.k8s.watch import Watcher, WatchSettings
from scheduler.k8s.writer import Writer
from testenv.controlplane import ControlPlane
from tests.integration.support import SCHED, eventually, install_crds, kubectl

pytestmark = pytest.mark.e2e

FAST = WatchSettings(watch_timeout=5, backoff_base=0.1, backoff_max=0.5, read_grace=5)


@pytest.fixture(scope="module")
def crds(control_plane: ControlPlane) -> None:
    """Our CRDs installed and Established."""
    install_crds(control_plane)


def pod_manifest(name: str, annotations: dict[str, str] | None = None, gpus: int = 0) -> str:
    requests: dict[str, str] = {"cpu": "1"}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {
                "schedulerName": SCHED,
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.invalid/fake:1",
                        # Extended resources need limit == request.
                        "resources": {"requests": requests, "limits": dict(requests)},
                    }
                ],
            },
        }
    )


@contextlib.asynccontextmanager
async def live_cache(cp: ControlPlane) -> AsyncIterator[tuple[Cache, Any]]:
    """A cache kept current by a running watcher (synced on entry), and the API client."""
    api = await make_api_client(ClientSettings(kube_config=str(cp.kubeconfig)))
    cache = Cache(SCHED, "default-queue")
    watcher = Watcher(api, cache, settings=FAST)
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.wait_for(watcher.synced.wait(), 30)
        yield cache, api
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await api.close()


def binding(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


async def test_bad_input_becomes_problems_and_the_rest_is_scheduled(
    control_plane: ControlPlane, crds: None, namespace: str
) -> None:
    cp = control_plane
    async with live_cache(cp) as (cache, _):
        # A bad quantity cannot pass API validation; a bad GPU share annotation can.
        bad = pod_manifest("bad-fraction", {"gpu-fraction": "1.5"})
        orphan = pod_manifest("orphan", {"pod-group-name": "no-such-group"})
        for manifest in (bad, orphan, pod_manifest("good")):
            await kubectl(cp, "apply", "-n", namespace, "-f", "-", input=manifest)

        def problems() -> dict[str, Any]:
            found = {p.name: p for p in cache.problems() if p.namespace == namespace}
            return found if len(found) == 2 else {}

        found = await eventually("two problems", problems)
        assert found["bad-fraction"].field == "metadata.annotations[gpu-fraction]"
        assert "1.5" in found["bad-fraction"].message
        assert found["orphan"].reason == "PodGroupNotFound"
        raw = cache.raw("Pod", namespace, "bad-fraction")
        assert raw is not None and found["bad-fraction"].uid == raw["metadata"]["uid"]
        # "good" was created last: the watch may deliver it after the two problems.
        await eventually("the good pod", lambda: cache.raw("Pod", namespace, "good") is not None)
        mine = [p.name for p in cache.snapshot().pods if p.namespace == namespace]
        assert mine == ["good"]


async def test_assume_bind_confirm_and_grant_survives_restart(
    control_plane: ControlPlane, crds: None, namespace: str, make_gpu_nodes: Any
) -> None:
    cp = control_plane
    (node,) = await asyncio.to_thread(make_gpu_nodes, 1, gpus=2)
    async with live_cache(cp) as (cache, api):
        cache.pending_changed.clear()
        await kubectl(
            cp, "apply", "-n", namespace, "-f", "-",
            input=pod_manifest("half", {"gpu-fraction": "0.5"}),
        )  # fmt: skip
        raw = await eventually("the pod", lambda: cache.raw("Pod", namespace, "half"))
        assert cache.pending_changed.is_set()  # new pending work wakes the cycle
        uid = raw["metadata"]["uid"]

        cache.assume(uid, node, {1: 500})
        snap = cache.snapshot()
        assert snap.node_states()[node].gpu_free == (1000, 500)
        assert not {p.name: p for p in snap.pods}["half"].pending

        # The grant travels in the Binding, as the scheduler's writer sends it.
        outcome = await Writer(api).bind(namespace, "half", uid, node, {1: 500})
        assert outcome.bound, outcome.error
        await eventually("the watch confirming the bind", lambda: cache.assumed() == {})
        bound = {p.name: p for p in cache.snapshot().pods}["half"]
        assert bound.node_name == node and bound.gpu_grant == ((1, 500),)
    async with live_cache(cp) as (fresh, _):
        states = fresh.snapshot().node_states()
        assert states[node].gpu_free == (1000, 500)


async def test_failed_bind_is_forgotten(
    control_plane: ControlPlane, crds: None, namespace: str, make_gpu_nodes: Any
) -> None:
    cp = control_plane
    first, second = await asyncio.to_thread(make_gpu_nodes, 2, gpus=1)
    async with live_cache(cp) as (cache, api):
        await kubectl(cp, "apply", "-n", namespace, "-f", "-", input=pod_manifest("p", gpus=1))
        raw = await eventually("the pod", lambda: cache.raw("Pod", namespace, "p"))
        path = POD.object_path(namespace, "p", "binding")
        # Someone else binds it first; our assumed bind to the other node then conflicts.
        await request_json(api, "POST", path, body=binding("p", first))
        cache.assume(raw["metadata"]["uid"], second, {0: 1000})
        with pytest.raises(Conflict):
            await request_json(api, "POST", path, body=binding("p", second))
        cache.forget(raw["metadata"]["uid"])

        def on_first() -> bool:
            pods = {p.name: p for p in cache.snapshot().pods if p.namespace == namespace}
            return "p" in pods and pods["p"].node_name == first

        await eventually("the pod on the node that won", on_first)
        states = cache.snapshot().node_states()
        assert states[second].gpu_free == (1000,)
        assert states[first].gpu_free == (0,)
        assert cache.assumed() == {}
