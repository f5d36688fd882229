"""Volcano's API read natively, against a real API server with Volcano's CRDs installed.

The scheduler runs in-process (the real :class:`scheduler.runner.Scheduler`) with the
ServiceAccount and ClusterRole it ships with (``manifests/``), serving two scheduler names.
The test plays Volcano's job controller: it creates a Job's PodGroup and, only once the
scheduler has moved it to ``Inqueue``, its pods - exactly the contract Volcano's
controller-manager follows (tests/e2e/test_volcano_jobs.py runs the real one).
The tests of a PodGroup or Queue made again under its name run the scheduler's cycles
themselves, one at a time (see there).

Volcano's CRDs are vendored in ``testdata/volcano`` (volcano.sh/volcano v1.10.0, Apache-2.0).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from scheduler.cache import Cache
from scheduler.commit import LiveBackend
from scheduler.commit.status import StatusPublisher
from scheduler.commit.volcano import VolcanoStatus
from scheduler.config import SchedulerConfig, ServiceSettings
from scheduler.cycle import run_cycle
from scheduler.k8s.client import ClientSettings, make_api_client
from scheduler.k8s.resources import (
    VOLCANO_KINDS,
    VOLCANO_PODGROUP,
    VOLCANO_QUEUE,
    WATCHED_KINDS,
    ResourceKind,
)
from scheduler.k8s.watch import Watcher, WatchSettings
from scheduler.k8s.writer import Writer
from scheduler.runner import Scheduler
from scheduler.solver import PlacementSettings
from testenv.controlplane import ControlPlane
from tests.e2e.scheduler_process import KaiCluster, kai_cluster
from tests.integration.support import kubectl

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]
__all__ = ["kai_cluster"]  # a fixture this module uses

TESTDATA = Path(__file__).resolve().parent / "testdata" / "volcano"
#: Names only this module's scheduler serves (no other test's pods are touched).
KAI_NAME = "kai-scheduler-volcano-it"
VOLCANO_NAME = "volcano-it"
GPU = "nvidia.com/gpu"
FAST = WatchSettings(watch_timeout=5, backoff_base=0.05, backoff_max=0.2)


def install_volcano_crds(cp: ControlPlane) -> None:
    """Volcano's PodGroup and Queue CRDs, Established (idempotent)."""
    cp.kubectl("apply", "-f", str(TESTDATA))
    cp.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s",
        "crd/queues.scheduling.volcano.sh", "crd/podgroups.scheduling.volcano.sh",
        timeout=75,
    )  # fmt: skip


async def get_json(cp: ControlPlane, *args: str) -> Any:
    out = await asyncio.to_thread(cp.kubectl, "get", *args, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 and out.stdout else None


def podgroup(name: str, *, min_member: int, gpus: int, queue: str) -> dict[str, Any]:
    """A PodGroup as Volcano's job controller writes it (phase Pending)."""
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {
            "minMember": min_member,
            "minTaskMember": {"worker": min_member},
            "minResources": {GPU: str(gpus), "cpu": f"{100 * min_member}m", "count/pods": "2"},
            "queue": queue,
        },
        "status": {"phase": "Pending"},
    }


def worker(name: str, group: str, node_label: str) -> dict[str, Any]:
    """A pod as Volcano's job controller creates it, for our second scheduler name."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": {"scheduling.k8s.io/group-name": group, "volcano.sh/task-spec": "w"},
        },
        "spec": {
            "schedulerName": VOLCANO_NAME,
            "nodeSelector": {"volcano-it": node_label},
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
            "containers": [
                {
                    "name": "w",
                    "image": "registry.invalid/trainer:1",
                    "resources": {"requests": {"cpu": "100m"}, "limits": {GPU: "1"}},
                }
            ],
        },
    }


def _condition(pg: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next(
        (c for c in (pg.get("status") or {}).get("conditions") or [] if c.get("type") == kind),
        None,
    )


@pytest.fixture
async def running_scheduler(kai_cluster: KaiCluster) -> AsyncIterator[Scheduler]:
    """The real scheduler in this process, as the shipped ServiceAccount."""
    install_volcano_crds(kai_cluster.cp)
    config = SchedulerConfig(
        scheduler_name=KAI_NAME,
        scheduler_names=(KAI_NAME, VOLCANO_NAME),
        cycle_period=0.3,
        event_interval=5.0,
        placement=PlacementSettings(time_limit_seconds=0.3, workers=1),
    )
    scheduler = Scheduler(
        config,
        ClientSettings(kube_config=str(kai_cluster.kubeconfig)),
        ServiceSettings(metrics_address="127.0.0.1:0", identity="volcano-it"),
    )
    task = asyncio.create_task(scheduler.serve())
    try:
        yield scheduler
    finally:
        scheduler.stop.set()
        assert await asyncio.wait_for(task, 30) == 0


async def test_queue_capability_keeps_3_gpu_job_pending_and_2_gpu_job_runs(
    running_scheduler: Scheduler,
    kai_cluster: KaiCluster,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    cp = kai_cluster.cp
    label = namespace[-6:]
    await asyncio.to_thread(make_gpu_nodes, 1, gpus=4, labels={"volcano-it": label})
    queue = f"ml-team-{label}"
    await kubectl(
        cp, "apply", "-f", "-",
        input=json.dumps({
            "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
            "metadata": {"name": queue},
            "spec": {"capability": {GPU: 2}, "reclaimable": False, "weight": 1},
        }),
    )  # fmt: skip
    try:
        await kubectl(
            cp, "apply", "-n", namespace, "-f", "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [
                podgroup("big", min_member=3, gpus=3, queue=queue),
                podgroup("small", min_member=2, gpus=2, queue=queue),
            ]}),
        )  # fmt: skip

        async def phase(name: str) -> str:
            pg = await get_json(cp, "podgroups.scheduling.volcano.sh", name, "-n", namespace)
            return str(((pg or {}).get("status") or {}).get("phase") or "")

        # The 2-GPU job is enqueued; only then does the "job controller" make its pods.
        await eventually_async("small Inqueue", lambda: phase("small"), "Inqueue", 30)
        items = [worker(f"small-{i}", "small", label) for i in range(2)]
        await kubectl(
            cp, "apply", "-n", namespace, "-f", "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
        )  # fmt: skip

        async def bound() -> int:
            pods = await get_json(cp, "pods", "-n", namespace)
            return sum(1 for p in (pods or {}).get("items", []) if p["spec"].get("nodeName"))

        await eventually_async("both workers bound", bound, 2, 30)
        await eventually_async("small Running", lambda: phase("small"), "Running", 30)
        small = await get_json(cp, "podgroups.scheduling.volcano.sh", "small", "-n", namespace)
        scheduled = _condition(small, "Scheduled")
        assert scheduled is not None and scheduled["status"] == "True", small["status"]
        assert _condition(small, "Unschedulable") is None

        # The 3-GPU job never fits the queue's capability: Pending, saying so.
        big = await get_json(cp, "podgroups.scheduling.volcano.sh", "big", "-n", namespace)
        assert big["status"]["phase"] == "Pending", big["status"]
        waiting = _condition(big, "Unschedulable")
        assert waiting is not None and waiting["status"] == "True", big["status"]
        assert waiting["reason"] == "QueueCapability"
        assert f"queue {queue} capability: {GPU} 2" in waiting["message"]
        events = await get_json(
            cp, "events", "-n", namespace, "--field-selector", "involvedObject.name=big"
        )
        assert any(
            e["reason"] == "Unschedulable" and "capability" in e["message"] for e in events["items"]
        ), events["items"]

        # The queue reports what it holds, in Kubernetes units, as volcano-scheduler does.
        async def allocated() -> str:
            q = await get_json(cp, "queues.scheduling.volcano.sh", queue)
            return str((((q or {}).get("status") or {}).get("allocated") or {}).get(GPU))

        await eventually_async("queue allocated", allocated, "2", 30)
        # Volcano's default queue exists, as with volcano-scheduler.
        assert await get_json(cp, "queues.scheduling.volcano.sh", "default") is not None
    finally:
        await kubectl(cp, "delete", "queues.scheduling.volcano.sh", queue, "--wait=false")


async def eventually_async(what: str, check: Any, want: Any, timeout: float) -> None:
    """Poll the coroutine function ``check`` until it returns ``want``."""
    last: Any = None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        last = await check()
        if last == want:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value {last!r}")


async def test_without_volcano_crds_nothing_fails(
    control_plane: ControlPlane, api: ApiClient, namespace: str, make_gpu_nodes: Any
) -> None:
    """Volcano's kinds answer 404 (here: a version no CRD serves, so the test does not depend
    on whether another test installed Volcano's CRDs): the watch syncs without them, plain
    pods are bound, no Volcano queue appears, the Volcano status step writes nothing, and a
    pod naming a missing PodGroup by Volcano's annotation waits with a reason."""
    missing = (
        ResourceKind(
            "Queue", "scheduling.volcano.sh", "v0missing", "queues", False, name="VolcanoQueue"
        ),
        ResourceKind(
            "PodGroup", "scheduling.volcano.sh", "v0missing", "podgroups", True,
            name="VolcanoPodGroup",
        ),
    )  # fmt: skip
    label = namespace[-6:]
    (node,) = await asyncio.to_thread(make_gpu_nodes, 1, gpus=2, labels={"volcano-it": label})
    pods = [worker("plain", "", label), worker("grouped", "job", label)]
    del pods[0]["metadata"]["annotations"]["scheduling.k8s.io/group-name"]
    await kubectl(
        control_plane, "apply", "-n", namespace, "-f", "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}),
    )  # fmt: skip
    cache = Cache([KAI_NAME, VOLCANO_NAME], "default-queue")
    watcher = Watcher(api, cache, (*WATCHED_KINDS, *missing), settings=FAST)
    task = asyncio.create_task(watcher.run())
    writer = Writer(api)
    backend = LiveBackend(cache, writer)
    backend.status = StatusPublisher(writer, volcano=VolcanoStatus(cache, writer))
    try:
        await asyncio.wait_for(watcher.synced.wait(), 30)
        assert watcher.absent == {"VolcanoQueue", "VolcanoPodGroup"}
        report = await run_cycle(backend, PlacementSettings(time_limit_seconds=0.3), 1)
        await backend.flush()
        assert {q.name for q in report.snapshot.queues} & {"root", "default"} == set()
        placed = {o.gang for o in report.placement.outcomes.values() if o.placed}
        assert f"{namespace}/plain" in placed
        problems = [p for p in cache.problems() if p.name == "grouped"]
        assert [p.reason for p in problems] == ["PodGroupNotFound"]
        assert "'job' does not exist" in problems[0].message

        async def plain_node() -> str:
            pod = await writer.get_pod(namespace, "plain")
            return str(((pod or {}).get("spec") or {}).get("nodeName") or "")

        await eventually_async("plain bound", plain_node, node, 30)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# --- The same name, another object ----------------------------------------------------------
#
# Volcano's job controller restarts a Job (RestartJob) by deleting its PodGroup and creating
# it again under the same name. The scheduler remembers what it wrote per name; a cycle that
# sees the name gone forgets it, but one need not run in between, and then the new object must
# still be told its status. The runner's loop runs on its period and cannot be held still
# from outside (tests/integration/test_no_mocks.py: no patching), so these tests wire the
# scheduler's parts as scheduler.runner does and run its cycles themselves, one at a time.

PODGROUPS = "podgroups.scheduling.volcano.sh"
QUEUES = "queues.scheduling.volcano.sh"


class Cycles:
    """The scheduler's watch, cache, backend and Volcano status step on the shipped
    ServiceAccount's client, cycled by the test."""

    def __init__(self, api: ApiClient) -> None:
        self.cache = Cache([KAI_NAME, VOLCANO_NAME], "default-queue")
        self.watcher = Watcher(api, self.cache, (*WATCHED_KINDS, *VOLCANO_KINDS), settings=FAST)
        writer = Writer(api, component=KAI_NAME)
        self.backend = LiveBackend(self.cache, writer)
        self.backend.status.volcano = VolcanoStatus(self.cache, writer)
        self.count = 0

    async def until(self, what: str, check: Any, want: Any, cycles: int = 10) -> None:
        """Run cycles, each with its writes done, until the coroutine function ``check``
        returns ``want``."""
        last: Any = None
        for _ in range(cycles):
            self.count += 1
            await run_cycle(self.backend, PlacementSettings(time_limit_seconds=0.3), self.count)
            await self.backend.flush()
            last = await check()
            if last == want:
                return
            await asyncio.sleep(0.2)  # the watch brings the writes in, as between cycles
        raise AssertionError(f"not {what} after {cycles} cycles; last value {last!r}")

    async def sees(self, kind: str, namespace: str, name: str, uid: str) -> None:
        """Until the cache holds the object ``uid`` under ``name`` (no cycle runs meanwhile)."""

        async def cached() -> str:
            raw = self.cache.raw(kind, namespace, name) or {}
            return str((raw.get("metadata") or {}).get("uid") or "")

        await eventually_async(f"{kind} {name} {uid} in the cache", cached, uid, 30)


@pytest.fixture
async def cycles(kai_cluster: KaiCluster) -> AsyncIterator[Cycles]:
    install_volcano_crds(kai_cluster.cp)
    api = await make_api_client(ClientSettings(kube_config=str(kai_cluster.kubeconfig)))
    parts = Cycles(api)
    task = asyncio.create_task(parts.watcher.run())
    try:
        await asyncio.wait_for(parts.watcher.synced.wait(), 30)
        yield parts
    finally:
        await parts.backend.flush()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()


def volcano_queue(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": {"reclaimable": False, "weight": 1},
    }


async def made_again(cp: ControlPlane, obj: dict[str, Any], *namespace: str) -> dict[str, Any]:
    """Delete ``obj`` (waiting until it is gone) and create it again under its name, without
    status, as Volcano's controllers make their objects; the new object."""
    kind = PODGROUPS if obj["kind"] == "PodGroup" else QUEUES
    name = obj["metadata"]["name"]
    old = await get_json(cp, kind, name, *namespace)
    await kubectl(cp, "delete", kind, name, *namespace)
    fresh = {k: v for k, v in obj.items() if k != "status"}
    await kubectl(cp, "create", *namespace, "-f", "-", input=json.dumps(fresh))
    new = await get_json(cp, kind, name, *namespace)
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    assert not new.get("status"), new["status"]
    return dict(new)


async def test_podgroup_made_again_under_its_name_is_enqueued_again(
    cycles: Cycles, kai_cluster: KaiCluster, namespace: str, make_gpu_nodes: Any
) -> None:
    cp = kai_cluster.cp
    label = namespace[-6:]
    # Room to spare: enqueueing weighs the whole cluster, where PodGroups of the tests before
    # may still be Inqueue while their namespaces go.
    await asyncio.to_thread(make_gpu_nodes, 1, gpus=8, labels={"volcano-it": label})
    queue = volcano_queue(f"restart-{label}")
    await kubectl(cp, "create", "-f", "-", input=json.dumps(queue))
    try:
        group = podgroup("job", min_member=2, gpus=2, queue=queue["metadata"]["name"])
        await kubectl(cp, "create", "-n", namespace, "-f", "-", input=json.dumps(group))

        async def phase() -> str:
            pg = await get_json(cp, PODGROUPS, "job", "-n", namespace)
            return str(((pg or {}).get("status") or {}).get("phase") or "")

        await cycles.until("job Inqueue", phase, "Inqueue")
        # The Job restarts before it has pods: its PodGroup goes and comes back, with no
        # cycle in between.
        new = await made_again(cp, group, "-n", namespace)
        await cycles.sees(VOLCANO_PODGROUP.key, namespace, "job", new["metadata"]["uid"])
        await cycles.until("the new job Inqueue", phase, "Inqueue", cycles=3)
    finally:
        await kubectl(cp, "delete", QUEUES, queue["metadata"]["name"], "--wait=false")


async def test_queue_made_again_under_its_name_is_told_its_allocation_again(
    cycles: Cycles, kai_cluster: KaiCluster, namespace: str, make_gpu_nodes: Any
) -> None:
    cp = kai_cluster.cp
    label = namespace[-6:]
    await asyncio.to_thread(make_gpu_nodes, 1, gpus=8, labels={"volcano-it": label})
    queue = volcano_queue(f"again-{label}")
    name = queue["metadata"]["name"]
    await kubectl(cp, "create", "-f", "-", input=json.dumps(queue))
    try:
        group = podgroup("job", min_member=2, gpus=2, queue=name)
        await kubectl(cp, "create", "-n", namespace, "-f", "-", input=json.dumps(group))

        async def phase() -> str:
            pg = await get_json(cp, PODGROUPS, "job", "-n", namespace)
            return str(((pg or {}).get("status") or {}).get("phase") or "")

        async def allocated() -> str:
            q = await get_json(cp, QUEUES, name)
            return str((((q or {}).get("status") or {}).get("allocated") or {}).get(GPU))

        await cycles.until("job Inqueue", phase, "Inqueue")
        items = [worker(f"job-{i}", "job", label) for i in range(2)]
        await kubectl(
            cp, "create", "-n", namespace, "-f", "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
        )  # fmt: skip
        await cycles.until("queue allocated", allocated, "2")
        # The queue goes and comes back while what it holds stays the same.
        new = await made_again(cp, queue)
        await cycles.sees(VOLCANO_QUEUE.key, "", name, new["metadata"]["uid"])
        await cycles.until("the new queue allocated", allocated, "2", cycles=3)
    finally:
        await kubectl(cp, "delete", QUEUES, name, "--wait=false")
