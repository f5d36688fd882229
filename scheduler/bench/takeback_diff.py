"""``python -m scheduler.bench takeback-diff``: taking back, ours versus NVIDIA KAI-Scheduler.

Each :class:`Scenario` is data: kwok GPU nodes, queues with quotas, a first wave of workloads
that fill the cluster and run (``setup``, step by step), then a second wave that can only run
if something is taken back. The same scenario runs under one scheduler at a time on one control
plane (ours, then KAI-Scheduler v0.12.0 as scheduler + binder + podgrouper, see
:mod:`scheduler.bench.e2e_peers`), each run with a fresh namespace, fresh queues and fresh
nodes, all removed afterwards. After the second wave the run waits until nothing changes for
``settle`` seconds (no pod created, bound, started or terminating; every controller caught up)
and records, per gang: how many pods run and wait, how many were evicted, the eviction actions
(from Events and the ``DisruptionTarget`` condition) and an outcome:

- ``running``: as many pods run as it wants, none was evicted;
- ``pending``: nothing runs and nothing was evicted (a second-wave gang that was not admitted);
- ``evicted``: pods were evicted and fewer than ``minMember`` run again;
- ``shrunk``: pods were evicted and at least ``minMember``, but not all, run;
- ``moved``: pods were evicted and all run again (consolidation: the controller recreated them
  and they were placed elsewhere).

Workloads are ReplicaSets, so an evicted pod comes back pending, as with any controller.
Gangs are KAI PodGroups (``scheduling.run.ai/v2alpha2``) created by the bench and named by the
pods' ``pod-group-name`` annotation, with the queue in the PodGroup and the label
``kai.scheduler/queue`` on the pods, so both schedulers read the same objects. KAI's podgrouper
would replace the PodGroup of an owned pod with its own (one per ReplicaSet, ``minMember: 1``),
so it is started with ``--pod-label-selector`` and groups only the pods labelled
``kai-diff/grouper=kai-podgrouper``: the gangs of one that a scenario leaves to it (ours reads
those pods as implicit gangs of one).

Prints one JSON document (per scenario and gang: expected, ours, KAI, match) on stdout and a
table on stderr. KAI is built on demand by ``testenv/build_peers.sh kai`` (cached).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from scheduler.bench import e2e_peers as peers
from scheduler.bench.e2e_cluster import (
    PODGROUPS,
    Api,
    ApiError,
    create_namespace,
    delete_namespace,
)
from testenv import ControlPlane, make_gpu_nodes

__all__ = [
    "OUTCOMES",
    "SCENARIOS",
    "Difference",
    "QueueSpec",
    "Scenario",
    "Step",
    "Workload",
    "add_parser",
    "compare",
    "document",
    "prepare_plane",
    "run",
    "run_diff",
]

REPO = peers.REPO
SCHEDULERS = ("ours", "kai")
GPU = "nvidia.com/gpu"
QUEUE_LABEL = "kai.scheduler/queue"
LABEL_RUN = "kai-diff/run"
LABEL_GANG = "kai-diff/gang"
LABEL_GROUPER = "kai-diff/grouper"
PODGROUPER = "kai-podgrouper"
NAMESPACE_PREFIX = "tdiff-"
QUEUES = "/apis/scheduling.run.ai/v2/queues"
REPLICASETS = "/apis/apps/v1/namespaces/{ns}/replicasets"
BUDGETS = "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"
OUTCOMES = ("running", "pending", "evicted", "shrunk", "moved")

#: Event reasons of our evictions (scheduler/commit/evict.py) -> action.
_OURS_REASONS = {
    "Preempted": "preempt",
    "Reclaimed": "reclaim",
    "Consolidated": "consolidate",
    "Shrunk": "shrink",
}
#: KAI's ``evictor-action-type`` annotation of its ``Evict`` Event on the PodGroup -> action.
_KAI_ACTIONS = {
    "preempt": "preempt",
    "reclaim": "reclaim",
    "consolidation": "consolidate",
    "stalegangeviction": "stale-gang",
}


# ------------------------------------------------------------------------------ scenarios


@dataclass(frozen=True)
class QueueSpec:
    """A queue of the scenario (its real name gets a per-run prefix). CPU and memory are
    unlimited (quota and limit -1); ``limit`` is always written out (KAI reads an omitted
    limit as 0, ours as -1: see docs/api.md)."""

    name: str
    gpu_quota: float
    parent: str | None = None
    gpu_limit: float = -1
    over_quota_weight: float = 1


@dataclass(frozen=True)
class Workload:
    """One gang: a ReplicaSet of ``replicas`` pods of ``gpus`` whole GPUs each."""

    name: str
    queue: str
    priority_class: str
    replicas: int
    gpus: int
    #: PodGroup ``minMember`` (default: ``replicas``); below ``replicas`` the gang is elastic.
    min_member: int | None = None
    #: PodGroup ``spec.preemptibility`` (``preemptible`` | ``non-preemptible``), else by priority.
    preemptibility: str | None = None
    #: Pin every pod to the scenario's node with this index (nodeSelector on the host name).
    node: int | None = None
    #: ``podgroup``: the bench creates the PodGroup; ``kai-podgrouper``: a gang of one whose
    #: PodGroup KAI's podgrouper makes (ours: an implicit gang of one).
    grouping: str = "podgroup"
    #: A PodDisruptionBudget over the gang's pods with this ``minAvailable``.
    budget_min_available: int | None = None

    @property
    def minimum(self) -> int:
        """The gang's ``minMember``."""
        return self.replicas if self.min_member is None else self.min_member


@dataclass(frozen=True)
class Step:
    """One step of the first wave: create workloads and wait until they all run, or remove
    workloads (helpers that shaped the layout) and wait until their pods are gone."""

    create: tuple[Workload, ...] = ()
    remove: tuple[str, ...] = ()


@dataclass(frozen=True)
class Difference:
    """A deliberate, documented difference: KAI's outcome per gang where it differs from
    ``Scenario.expect``, and why (docs/taking-back.md, "Differences from KAI-Scheduler")."""

    kai: Mapping[str, str]
    reason: str


@dataclass(frozen=True)
class Scenario:
    """A cluster, queues, a first wave that runs, a second wave, the expected outcome."""

    name: str
    summary: str
    nodes: int
    gpus_per_node: int
    queues: tuple[QueueSpec, ...]
    setup: tuple[Step, ...]
    wave2: tuple[Workload, ...]
    #: Gang -> outcome, as docs/taking-back.md says ours behaves (every reported gang).
    expect: Mapping[str, str]
    #: Gang -> eviction action (ours' vocabulary) for the gangs that lose pods.
    expect_actions: Mapping[str, str] = field(default_factory=dict)
    difference: Difference | None = None

    def workloads(self) -> list[Workload]:
        """Every workload, first wave then second."""
        return [w for s in self.setup for w in s.create] + list(self.wave2)

    def reported(self) -> list[Workload]:
        """The workloads whose outcome is reported (helpers removed in setup are not)."""
        removed = {n for s in self.setup for n in s.remove}
        return [w for w in self.workloads() if w.name not in removed]


def _two_teams(quota_a: float = 8, quota_b: float = 8) -> tuple[QueueSpec, ...]:
    return (
        QueueSpec("dept", quota_a + quota_b),
        QueueSpec("team-a", quota_a, parent="dept"),
        QueueSpec("team-b", quota_b, parent="dept"),
    )


def _one_team(name: str, quota: float = 16) -> tuple[QueueSpec, ...]:
    return (QueueSpec("dept", quota), QueueSpec(name, quota, parent="dept"))


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        name="reclaim",
        summary="team-a borrowed team-b's quota (16 of 16 GPUs, quota 8 each); team-b submits 8 "
        "GPUs: team-a's lower-priority gang is reclaimed, both queues end at their fair share",
        nodes=2,
        gpus_per_node=8,
        queues=_two_teams(),
        setup=(
            Step(
                create=(
                    Workload("a-train", "team-a", "train", replicas=2, gpus=4),
                    Workload("a-build", "team-a", "build-preemptible", replicas=2, gpus=4),
                )
            ),
        ),
        wave2=(Workload("b-train", "team-b", "train", replicas=2, gpus=4),),
        expect={"a-train": "evicted", "a-build": "running", "b-train": "running"},
        expect_actions={"a-train": "reclaim"},
    ),
    Scenario(
        name="preempt",
        summary="one queue (quota 16) runs a train and a build-preemptible gang; an inference "
        "gang (non-preemptible, within quota) arrives: only the strictly lowest priority goes",
        nodes=2,
        gpus_per_node=8,
        queues=_one_team("team-p"),
        setup=(
            Step(
                create=(
                    Workload("p-train", "team-p", "train", replicas=2, gpus=4),
                    Workload("p-buildp", "team-p", "build-preemptible", replicas=2, gpus=4),
                )
            ),
        ),
        wave2=(Workload("p-infer", "team-p", "inference", replicas=2, gpus=4),),
        expect={"p-train": "evicted", "p-buildp": "running", "p-infer": "running"},
        expect_actions={"p-train": "preempt"},
    ),
    Scenario(
        name="consolidate",
        summary="2+2 GPUs free on two nodes, a 4-GPU pod arrives: a preemptible 2-GPU pod moves "
        "to the other node (its ReplicaSet recreates it there); pinned non-preemptible pods stay",
        nodes=2,
        gpus_per_node=8,
        queues=_one_team("team-c"),
        setup=(
            Step(
                create=(
                    Workload("c-fixed0", "team-c", "build", replicas=1, gpus=6, node=0),
                    Workload("c-fixed1", "team-c", "build", replicas=1, gpus=4, node=1),
                    # Fills node 0 so that c-mover can only land on node 1; removed below.
                    Workload("c-filler", "team-c", "build", replicas=1, gpus=2, node=0),
                )
            ),
            Step(
                create=(
                    Workload("c-mover", "team-c", "train", replicas=1, gpus=2, grouping=PODGROUPER),
                )
            ),
            Step(remove=("c-filler",)),
        ),
        wave2=(Workload("c-new", "team-c", "train", replicas=1, gpus=4, grouping=PODGROUPER),),
        expect={
            "c-fixed0": "running",
            "c-fixed1": "running",
            "c-mover": "moved",
            "c-new": "running",
        },
        expect_actions={"c-mover": "consolidate"},
    ),
    Scenario(
        name="elastic",
        summary="team-a runs a rigid gang (8 GPUs) and an elastic one (4x2 GPUs, minMember 2) on "
        "team-b's quota; team-b submits 4 GPUs: the elastic gang shrinks, the rigid one stays",
        nodes=2,
        gpus_per_node=8,
        queues=_two_teams(),
        setup=(
            Step(
                create=(
                    Workload("a-rigid", "team-a", "train", replicas=2, gpus=4),
                    Workload("a-elastic", "team-a", "train", replicas=4, gpus=2, min_member=2),
                )
            ),
        ),
        wave2=(Workload("b-train", "team-b", "train", replicas=2, gpus=2),),
        expect={"a-rigid": "running", "a-elastic": "shrunk", "b-train": "running"},
        expect_actions={"a-elastic": "shrink"},
    ),
    Scenario(
        name="budget",
        summary="as reclaim, but a PodDisruptionBudget (minAvailable 2) covers the "
        "lower-priority gang: ours reclaims the other gang; KAI ignores budgets",
        nodes=2,
        gpus_per_node=8,
        queues=_two_teams(),
        setup=(
            Step(
                create=(
                    Workload(
                        "a-train", "team-a", "train", replicas=2, gpus=4, budget_min_available=2
                    ),
                    Workload("a-build", "team-a", "build-preemptible", replicas=2, gpus=4),
                )
            ),
        ),
        wave2=(Workload("b-train", "team-b", "train", replicas=2, gpus=4),),
        expect={"a-train": "running", "a-build": "evicted", "b-train": "running"},
        expect_actions={"a-build": "reclaim", "a-train": "reclaim"},
        difference=Difference(
            kai={"a-train": "evicted", "a-build": "running"},
            reason="KAI-Scheduler deletes its victims (no Eviction API) and does not read "
            "PodDisruptionBudgets, so it takes the lowest-priority gang although its budget "
            "allows no disruption; ours evicts through the Eviction API and plans within each "
            "budget's disruptionsAllowed (docs/taking-back.md)",
        ),
    ),
    Scenario(
        name="protected",
        summary="a non-preemptible train gang (spec.preemptibility) and a preemptible one run; "
        "a higher-priority 16-GPU gang could only run by evicting both: nothing is evicted",
        nodes=2,
        gpus_per_node=8,
        queues=_one_team("team-n"),
        setup=(
            Step(
                create=(
                    Workload(
                        "n-protected",
                        "team-n",
                        "train",
                        replicas=2,
                        gpus=4,
                        preemptibility="non-preemptible",
                    ),
                    Workload("n-train", "team-n", "train", replicas=2, gpus=4),
                )
            ),
        ),
        wave2=(
            Workload(
                "n-urgent",
                "team-n",
                "inference",
                replicas=2,
                gpus=8,
                preemptibility="preemptible",
            ),
        ),
        expect={"n-protected": "running", "n-train": "running", "n-urgent": "pending"},
    ),
)


def scenario_named(name: str) -> Scenario:
    """The scenario called ``name``."""
    for s in SCENARIOS:
        if s.name == name:
            return s
    raise KeyError(f"no scenario {name!r}; known: {', '.join(s.name for s in SCENARIOS)}")


# ------------------------------------------------------------------------------ manifests


@dataclass(frozen=True)
class RunNames:
    """The real names of one run's objects."""

    rid: str
    namespace: str
    nodes: tuple[str, ...]

    def queue(self, logical: str) -> str:
        """The real name of a scenario queue."""
        return f"td-{self.rid}-{logical}"

    def logical_node(self, node: str | None) -> str | None:
        """``n0``, ``n1``, ... for this run's nodes."""
        if node in self.nodes:
            return f"n{self.nodes.index(node)}"
        return node


def queue_manifest(q: QueueSpec, names: RunNames) -> dict[str, Any]:
    """A ``scheduling.run.ai/v2`` Queue."""

    def res(quota: float, limit: float, weight: float) -> dict[str, float]:
        return {"quota": quota, "limit": limit, "overQuotaWeight": weight}

    spec: dict[str, Any] = {
        "resources": {
            "gpu": res(q.gpu_quota, q.gpu_limit, q.over_quota_weight),
            "cpu": res(-1, -1, 1),
            "memory": res(-1, -1, 1),
        }
    }
    if q.parent:
        spec["parentQueue"] = names.queue(q.parent)
    return {
        "apiVersion": "scheduling.run.ai/v2",
        "kind": "Queue",
        "metadata": {"name": names.queue(q.name), "labels": {LABEL_RUN: names.rid}},
        "spec": spec,
    }


def podgroup_manifest(w: Workload, names: RunNames) -> dict[str, Any]:
    """The PodGroup of a ``podgroup``-grouped workload."""
    spec: dict[str, Any] = {
        "minMember": w.minimum,
        "queue": names.queue(w.queue),
        "priorityClassName": w.priority_class,
    }
    if w.preemptibility:
        spec["preemptibility"] = w.preemptibility
    return {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {
            "name": w.name,
            "labels": {LABEL_RUN: names.rid, QUEUE_LABEL: names.queue(w.queue)},
        },
        "spec": spec,
    }


def budget_manifest(w: Workload, names: RunNames) -> dict[str, Any]:
    """The PodDisruptionBudget of a workload with ``budget_min_available``."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": w.name, "labels": {LABEL_RUN: names.rid}},
        "spec": {
            "minAvailable": w.budget_min_available,
            "selector": {"matchLabels": {LABEL_RUN: names.rid, LABEL_GANG: w.name}},
        },
    }


def replicaset_manifest(w: Workload, names: RunNames, scheduler_name: str) -> dict[str, Any]:
    """The ReplicaSet running the workload's pods (it recreates evicted ones, pending)."""
    selector = {LABEL_RUN: names.rid, LABEL_GANG: w.name}
    labels = {**selector, QUEUE_LABEL: names.queue(w.queue)}
    annotations: dict[str, str] = {}
    if w.grouping == PODGROUPER:
        if w.replicas != 1 or w.min_member not in (None, 1) or w.preemptibility:
            raise ValueError(f"{w.name}: a {PODGROUPER} workload is a plain gang of one")
        labels[LABEL_GROUPER] = PODGROUPER
    else:
        annotations["pod-group-name"] = w.name
    node_selector = {LABEL_RUN: names.rid}
    if w.node is not None:
        node_selector["kubernetes.io/hostname"] = names.nodes[w.node]
    resources = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {GPU: str(w.gpus)}}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": w.name, "labels": dict(selector)},
        "spec": {
            "replicas": w.replicas,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": {
                    "schedulerName": scheduler_name,
                    "priorityClassName": w.priority_class,
                    "terminationGracePeriodSeconds": 0,
                    "nodeSelector": node_selector,
                    "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
                    "containers": [
                        {"name": "main", "image": "registry.invalid/fake:1", "resources": resources}
                    ],
                },
            },
        },
    }


# ------------------------------------------------------------------------------ observing


@dataclass
class PodSeen:
    """What the watch saw of one pod."""

    uid: str
    name: str
    gang: str
    node: str | None = None
    phase: str = ""
    terminating: bool = False
    gone: bool = False
    #: Monotonic time it was first seen terminating or deleted.
    ended_at: float | None = None
    #: Every distinct ``DisruptionTarget=True`` condition seen on it, "reason: message", in
    #: order (the Eviction API replaces a scheduler's own with ``EvictionByEvictionAPI``).
    disruptions: list[str] = field(default_factory=list)

    @property
    def live(self) -> bool:
        """Neither terminating nor deleted."""
        return not (self.terminating or self.gone)

    @property
    def running(self) -> bool:
        """Live, bound and Running."""
        return self.live and bool(self.node) and self.phase == "Running"


class PodWatch:
    """Follows the pods of one namespace (list, then watch; resumes when the stream ends)."""

    def __init__(self, api: Api, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.pods: dict[str, PodSeen] = {}
        self.changed_at = time.monotonic()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """List, then follow in a background task."""
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        listing = await self.api.call("GET", path)
        for pod in listing.get("items", []):
            self._observe("ADDED", pod)
        version = str(listing["metadata"]["resourceVersion"])
        self._task = asyncio.create_task(self._follow(path, version), name="takeback-pod-watch")

    async def _follow(self, path: str, version: str) -> None:
        while True:
            async for event in self.api.watch(path, version):
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    raise ApiError("WATCH", path, int(obj.get("code", 0)), json.dumps(obj))
                version = str(obj.get("metadata", {}).get("resourceVersion", version))
                if event.get("type") != "BOOKMARK":
                    self._observe(str(event.get("type")), obj)

    def _observe(self, kind: str, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid"))
        seen = self.pods.get(uid)
        if seen is None:
            gang = str((meta.get("labels") or {}).get(LABEL_GANG, ""))
            seen = self.pods[uid] = PodSeen(uid, str(meta.get("name")), gang)
        status = pod.get("status") or {}
        seen.node = (pod.get("spec") or {}).get("nodeName") or seen.node
        seen.phase = str(status.get("phase", seen.phase))
        seen.terminating = seen.terminating or bool(meta.get("deletionTimestamp"))
        seen.gone = seen.gone or kind == "DELETED"
        for cond in status.get("conditions") or []:
            if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
                text = f"{cond.get('reason')}: {str(cond.get('message', ''))[:160]}"
                if text not in seen.disruptions:
                    seen.disruptions.append(text)
        if not seen.live and seen.ended_at is None:
            seen.ended_at = time.monotonic()
        self.changed_at = time.monotonic()
        self._changed.set()

    def of_gang(self, gang: str) -> list[PodSeen]:
        """Every pod of ``gang`` seen so far."""
        return [p for p in self.pods.values() if p.gang == gang]

    def signature(self) -> tuple[tuple[str, str, str, bool], ...]:
        """What must not change for the outcome to count as stable."""
        return tuple(
            sorted((p.uid, p.node or "", p.phase, p.live) for p in self.pods.values() if not p.gone)
        )

    async def until(self, done: Callable[[], bool], timeout: float, poll: float = 0.25) -> bool:
        """Wait until ``done()``; False on timeout. Re-raises if the watch failed."""
        deadline = time.monotonic() + timeout
        while not done():
            if self._task is not None and self._task.done():
                self._task.result()
                raise RuntimeError("the pod watch ended unexpectedly")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(poll, remaining))
        return True

    async def stop(self) -> None:
        """Cancel the watch."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


# ------------------------------------------------------------------------------ one run


class SchedulerDied(RuntimeError):
    """A process of the scheduler under test exited during a run."""


@dataclass
class RunContext:
    """What one scenario run needs from its surroundings."""

    cp: ControlPlane
    scheduler: str
    scheduler_name: str
    #: Raises :class:`SchedulerDied` when a process of the scheduler has exited.
    check_alive: Callable[[], None] = lambda: None
    settle: float = 6.0
    step_timeout: float = 120.0
    wave_timeout: float = 90.0


def _log(message: str) -> None:
    print(f"[takeback-diff {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def _kubectl(cp: ControlPlane, *args: str, **kwargs: Any) -> Any:
    return await asyncio.to_thread(cp.kubectl, *args, **kwargs)


async def _create_workloads(
    api: Api, ctx: RunContext, names: RunNames, workloads: Sequence[Workload]
) -> None:
    ns = names.namespace
    for w in workloads:  # PodGroups first: no pod ever names a missing one
        if w.grouping != PODGROUPER:
            await api.call("POST", PODGROUPS.format(ns=ns), podgroup_manifest(w, names))
    for w in workloads:
        if w.budget_min_available is not None:
            await api.call("POST", BUDGETS.format(ns=ns), budget_manifest(w, names))
    for w in workloads:
        manifest = replicaset_manifest(w, names, ctx.scheduler_name)
        await api.call("POST", REPLICASETS.format(ns=ns), manifest)


def _all_running(watch: PodWatch, workloads: Sequence[Workload]) -> bool:
    return all(sum(p.running for p in watch.of_gang(w.name)) >= w.replicas for w in workloads)


async def _wait_steps(
    api: Api, ctx: RunContext, names: RunNames, scenario: Scenario, watch: PodWatch
) -> list[str]:
    """Run the first wave; the removed helpers' names."""
    removed: list[str] = []
    for i, step in enumerate(scenario.setup):
        if step.create:
            await _create_workloads(api, ctx, names, step.create)

            def ready(step: Step = step) -> bool:
                ctx.check_alive()
                return _all_running(watch, step.create)

            if not await watch.until(ready, ctx.step_timeout):
                state = {w.name: _counts(watch, w) for w in step.create}
                raise TimeoutError(
                    f"setup step {i + 1}: not all running after {ctx.step_timeout}s: {state}"
                )
        for name in step.remove:
            removed.append(name)
            await api.call(
                "DELETE",
                f"{REPLICASETS.format(ns=names.namespace)}/{name}",
                {"propagationPolicy": "Background"},
            )

        def gone(step: Step = step) -> bool:
            return not any(p.live for n in step.remove for p in watch.of_gang(n))

        if step.remove and not await watch.until(gone, ctx.step_timeout):
            raise TimeoutError(f"setup step {i + 1}: {step.remove} not gone")
    await _wait_budgets(api, names, scenario, ctx.step_timeout)
    return removed


async def _wait_budgets(api: Api, names: RunNames, scenario: Scenario, timeout: float) -> None:
    """Wait until the disruption controller has counted every first-wave budget's pods, so
    the second wave meets budgets with their real ``disruptionsAllowed``."""
    deadline = time.monotonic() + timeout
    for w in (w for s in scenario.setup for w in s.create if w.budget_min_available is not None):
        path = f"{BUDGETS.format(ns=names.namespace)}/{w.name}"
        while True:
            pdb = await api.call("GET", path)
            status = pdb.get("status") or {}
            if (
                status.get("observedGeneration") == pdb["metadata"].get("generation")
                and status.get("currentHealthy", 0) >= w.replicas
            ):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"budget {w.name} not counted after {timeout}s: {status}")
            await asyncio.sleep(0.2)


def _counts(watch: PodWatch, w: Workload) -> dict[str, int]:
    pods = watch.of_gang(w.name)
    live = [p for p in pods if p.live]
    return {
        "running": sum(p.running for p in live),
        "pending": sum(not p.node for p in live),
        "live": len(live),
    }


async def _wait_stable(ctx: RunContext, scenario: Scenario, watch: PodWatch) -> tuple[bool, float]:
    """Wait until nothing changed for ``settle`` seconds with no pod terminating and every
    ReplicaSet caught up; (stable, seconds from now to the last change)."""
    began = time.monotonic()
    workloads = scenario.reported()
    last: Any = None
    since = began

    def quiet() -> bool:
        nonlocal last, since
        ctx.check_alive()
        now = time.monotonic()
        sig = watch.signature()
        busy = any(p.terminating and not p.gone for p in watch.pods.values()) or any(
            _counts(watch, w)["live"] != w.replicas for w in workloads
        )
        if sig != last or busy:
            last, since = sig, now
            return False
        return now - since >= ctx.settle

    stable = await watch.until(quiet, ctx.wave_timeout)
    return stable, round(since - began, 2)


async def _events(api: Api, namespace: str) -> list[dict[str, Any]]:
    out = await api.call("GET", f"/api/v1/namespaces/{namespace}/events")
    return list(out.get("items", []))


async def _podgroup_gangs(api: Api, namespace: str) -> dict[str, str]:
    """PodGroup name -> gang (KAI's podgrouper names its PodGroups after the ReplicaSet)."""
    out = await api.call("GET", PODGROUPS.format(ns=namespace), allow=(404,))
    gangs: dict[str, str] = {}
    for pg in out.get("items", []):
        meta = pg["metadata"]
        owners = [o["name"] for o in meta.get("ownerReferences") or [] if o["kind"] == "ReplicaSet"]
        gangs[meta["name"]] = owners[0] if owners else meta["name"]
    return gangs


def _eviction_evidence(
    events: Sequence[Mapping[str, Any]], pod_gangs: Mapping[str, str], pg_gangs: Mapping[str, str]
) -> dict[str, dict[str, Any]]:
    """Per gang: eviction actions and messages from ours' and KAI's Events."""
    out: dict[str, dict[str, Any]] = {}
    for ev in events:
        obj = ev.get("involvedObject") or {}
        reason = str(ev.get("reason", ""))
        annotations = (ev.get("metadata") or {}).get("annotations") or {}
        if reason in _OURS_REASONS:
            action = _OURS_REASONS[reason]
        elif reason == "Evict" and "evictor-action-type" in annotations:
            kind = str(annotations["evictor-action-type"])
            action = _KAI_ACTIONS.get(kind, kind)
        else:
            continue
        if obj.get("kind") == "Pod":
            gang = pod_gangs.get(str(obj.get("name")), "")
        else:
            gang = pg_gangs.get(str(obj.get("name")), str(obj.get("name")))
        entry = out.setdefault(gang, {"actions": set(), "messages": []})
        entry["actions"].add(action)
        message = f"{obj.get('kind')} {reason}: {ev.get('message', '')}"[:240]
        if message not in entry["messages"] and len(entry["messages"]) < 3:
            entry["messages"].append(message)
    return out


def outcome_of(running: int, evicted: int, replicas: int, minimum: int) -> str:
    """The outcome vocabulary of the module docstring."""
    if evicted == 0:
        if running >= replicas:
            return "running"
        return "pending" if running == 0 else f"partial({running}/{replicas})"
    if running >= replicas:
        return "moved"
    return "shrunk" if running >= minimum else "evicted"


async def _cleanup(api: Api, ctx: RunContext, names: RunNames, kai_crds: bool) -> None:
    ns = names.namespace
    # ReplicaSets first, so nothing recreates the pods deleted next.
    await api.call(
        "DELETE", REPLICASETS.format(ns=ns), {"propagationPolicy": "Background"}, allow=(404,)
    )
    await delete_namespace(api, ns, kai_crds=kai_crds, timeout=120)
    await api.call("DELETE", QUEUES, params={"labelSelector": f"{LABEL_RUN}={names.rid}"})
    if names.nodes:
        await _kubectl(ctx.cp, "delete", "--ignore-not-found", *(f"node/{n}" for n in names.nodes))


async def run_scenario(ctx: RunContext, scenario: Scenario) -> dict[str, Any]:
    """One scenario under the running scheduler; its result (gang -> counts and outcome)."""
    rid = uuid.uuid4().hex[:6]
    namespace = f"{NAMESPACE_PREFIX}{scenario.name}-{ctx.scheduler}-{rid}"
    result: dict[str, Any] = {
        "scenario": scenario.name,
        "scheduler": ctx.scheduler,
        "namespace": namespace,
        "stable": False,
        "error": None,
    }
    began = time.monotonic()
    prefix = f"td-{rid}-n"
    # make_gpu_nodes names them so; known up front, so a failed creation is cleaned up too.
    names = RunNames(rid, namespace, tuple(f"{prefix}-{i}" for i in range(scenario.nodes)))
    async with Api(ctx.cp.server, ctx.cp.admin_token, ctx.cp.ca_file, connections=8) as api:
        watch: PodWatch | None = None
        try:
            nodes = await asyncio.to_thread(
                make_gpu_nodes,
                ctx.cp,
                scenario.nodes,
                gpus=scenario.gpus_per_node,
                labels={LABEL_RUN: rid},
                name_prefix=prefix,
            )
            if tuple(nodes) != names.nodes:
                raise RuntimeError(f"unexpected node names {nodes}, wanted {names.nodes}")
            await create_namespace(api, namespace)
            for q in scenario.queues:  # parents first (the tuple lists them first)
                await api.call("POST", QUEUES, queue_manifest(q, names))
            watch = PodWatch(api, namespace)
            await watch.start()
            removed = await _wait_steps(api, ctx, names, scenario, watch)
            result["setup_seconds"] = round(time.monotonic() - began, 2)
            wave2_at = time.monotonic()
            await _create_workloads(api, ctx, names, scenario.wave2)
            stable, last_change = await _wait_stable(ctx, scenario, watch)
            result["stable"] = stable
            result["seconds_to_last_change"] = last_change
            events = await _events(api, namespace)
            pg_gangs = await _podgroup_gangs(api, namespace)
            pod_gangs = {p.name: p.gang for p in watch.pods.values()}
            evidence = _eviction_evidence(events, pod_gangs, pg_gangs)
            result["gangs"] = _gang_results(scenario, watch, names, wave2_at, evidence)
            result["setup_evictions"] = sorted(
                p.name
                for p in watch.pods.values()
                if p.ended_at is not None and p.ended_at < wave2_at and p.gang not in removed
            )
        except Exception as e:  # recorded; the comparison shows the run as incomplete
            result["error"] = f"{type(e).__name__}: {e}"
            _log(f"{ctx.scheduler}/{scenario.name}: {result['error']}")
        finally:
            if watch is not None:
                await watch.stop()
            try:
                await _cleanup(api, ctx, names, kai_crds=ctx.scheduler == "kai")
            except (ApiError, TimeoutError, aiohttp.ClientError, RuntimeError) as e:
                result["cleanup_error"] = f"{type(e).__name__}: {e}"
    result["seconds"] = round(time.monotonic() - began, 2)
    return result


def _gang_results(
    scenario: Scenario,
    watch: PodWatch,
    names: RunNames,
    wave2_at: float,
    evidence: Mapping[str, Mapping[str, Any]],
) -> dict[str, dict[str, Any]]:
    first_wave = {w.name for s in scenario.setup for w in s.create}
    out: dict[str, dict[str, Any]] = {}
    for w in scenario.reported():
        pods = watch.of_gang(w.name)
        counts = _counts(watch, w)
        evicted = [p for p in pods if p.ended_at is not None and p.ended_at >= wave2_at]
        nodes: dict[str, int] = {}
        for p in pods:
            if p.running:
                key = names.logical_node(p.node) or "?"
                nodes[key] = nodes.get(key, 0) + 1
        conditions: list[str] = []
        for p in evicted:
            conditions += [c for c in p.disruptions if c not in conditions]
        ev = evidence.get(w.name, {})
        out[w.name] = {
            "wave": 1 if w.name in first_wave else 2,
            "queue": w.queue,
            "priority_class": w.priority_class,
            "replicas": w.replicas,
            "min_member": w.minimum,
            "running": counts["running"],
            "pending": counts["pending"],
            "evicted_pods": len(evicted),
            "outcome": outcome_of(counts["running"], len(evicted), w.replicas, w.minimum),
            "nodes": dict(sorted(nodes.items())),
            "actions": sorted(ev.get("actions", ())),
            "disruption_conditions": conditions[:4],
            "disruption_reasons": sorted({c.split(":", 1)[0] for c in conditions}),
            "event_messages": list(ev.get("messages", [])),
        }
    return out


# ------------------------------------------------------------------------------ comparing


def _action_matches(expected: str | None, actions: Sequence[str], scheduler: str) -> bool:
    """Whether the recorded actions say what ``expected`` (ours' vocabulary) says. KAI has no
    action of its own for a shrink: it removes the pods beyond ``minMember`` in the action
    that needed the room (reclaim or preempt)."""
    if expected is None:
        return not actions
    if scheduler == "kai" and expected == "shrink":
        return bool(actions) and set(actions) <= {"reclaim", "preempt"}
    return list(actions) == [expected]


def compare(scenario: Scenario, runs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The comparison of one scenario's runs: a row per gang and a verdict.

    Verdicts: ``same`` (ours and KAI agree and match the expectation), ``deliberate``
    (they differ exactly as ``scenario.difference`` documents), ``DIFFERENT`` (anything
    else, including a run that deviates from the documented behaviour), ``incomplete``
    (a run failed or never became stable)."""
    kai_expect = dict(scenario.expect)
    if scenario.difference is not None:
        kai_expect.update(scenario.difference.kai)
    expect_of = {"ours": dict(scenario.expect), "kai": kai_expect}
    rows = []
    for w in scenario.reported():
        row: dict[str, Any] = {"gang": w.name, "expected": scenario.expect[w.name]}
        for name, run in runs.items():
            gang = (run.get("gangs") or {}).get(w.name)
            row[name] = gang["outcome"] if gang else None
            row[f"{name}_running"] = gang["running"] if gang else None
            row[f"{name}_actions"] = gang["actions"] if gang else None
        if "ours" in runs and "kai" in runs:
            row["match"] = (row["ours"], row["ours_running"]) == (row["kai"], row["kai_running"])
        rows.append(row)
    as_expected: dict[str, bool] = {}
    actions_as_expected: dict[str, bool] = {}
    for name, run in runs.items():
        gangs = run.get("gangs") or {}
        as_expected[name] = bool(gangs) and all(
            gangs[g]["outcome"] == o for g, o in expect_of[name].items()
        )
        actions_as_expected[name] = bool(gangs) and all(
            _action_matches(scenario.expect_actions.get(g), gangs[g]["actions"], name)
            for g in gangs
            if gangs[g]["evicted_pods"]
        )
    incomplete = [
        n
        for n, r in runs.items()
        if r.get("error") or not r.get("stable") or r.get("setup_evictions")
    ]
    if incomplete:
        verdict = "incomplete"
    elif (
        set(runs) == {"ours", "kai"} and all(r["match"] for r in rows) and all(as_expected.values())
    ):
        verdict = "same"
    elif scenario.difference is not None and all(as_expected.values()):
        verdict = "deliberate"
    elif set(runs) != {"ours", "kai"} and all(as_expected.values()):
        verdict = "as-expected"
    else:
        verdict = "DIFFERENT"
    return {
        "scenario": scenario.name,
        "summary": scenario.summary,
        "verdict": verdict,
        "incomplete_runs": incomplete,
        "as_expected": as_expected,
        "actions_as_expected": actions_as_expected,
        "deliberate_difference": (
            None
            if scenario.difference is None
            else {"kai": dict(scenario.difference.kai), "reason": scenario.difference.reason}
        ),
        "gangs": rows,
        "runs": dict(runs),
    }


def table(comparisons: Sequence[Mapping[str, Any]]) -> str:
    """A short human table (stderr)."""
    lines = [f"{'scenario':<12} {'gang':<12} {'expected':<9} {'ours':<20} {'kai':<20} match"]
    for c in comparisons:
        for row in c["gangs"]:

            def cell(name: str, row: Mapping[str, Any] = row) -> str:
                if name not in row:
                    return "-"
                acts = ",".join(row.get(f"{name}_actions") or [])
                return f"{row[name]}" + (f" [{acts}]" if acts else "")

            match = row.get("match")
            lines.append(
                f"{c['scenario']:<12} {row['gang']:<12} {row['expected']:<9} "
                f"{cell('ours'):<20} {cell('kai'):<20} {'' if match is None else match}"
            )
        settled = ", ".join(
            f"{name} {run.get('seconds_to_last_change')}s"
            for name, run in c["runs"].items()
            if run.get("seconds_to_last_change") is not None
        )
        lines.append(f"{'':<12} -> {c['verdict']} (last change after the second wave: {settled})")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ series


def prepare_plane(cp: ControlPlane) -> None:
    """Our CRDs, the default queues and the PriorityClasses both schedulers use."""
    _apply_our_crds(cp)
    cp.kubectl("apply", "-f", str(REPO / "manifests" / "defaults"))
    cp.kubectl("apply", "-f", str(REPO / "manifests" / "60-priorityclasses.yaml"))


def _apply_our_crds(cp: ControlPlane) -> None:
    # Server-side with force: KAI's CRDs (applied the same way) may own the fields now.
    cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"), timeout=120)
    cp.kubectl(
        "wait", "--for", "condition=Established", "--timeout=60s",
        "crd/queues.scheduling.run.ai", "crd/podgroups.scheduling.run.ai",
    )  # fmt: skip


def _apply_kai_crds(cp: ControlPlane, path: Path, timeout: float = 60.0) -> None:
    """Apply KAI's CRDs and wait until each is Established. ``kubectl wait`` fails outright
    on a CRD created a moment ago (no ``status.conditions`` yet), which is the case for KAI's
    BindRequest on a plane that had only ours, so poll instead."""
    cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path / "crds"), timeout=120)
    deadline = time.monotonic() + timeout
    while True:
        crds = json.loads(cp.kubectl("get", "-f", str(path / "crds"), "-o", "json").stdout)
        pending = [
            c["metadata"]["name"]
            for c in crds.get("items", [])
            if not any(
                cond.get("type") == "Established" and cond.get("status") == "True"
                for cond in (c.get("status") or {}).get("conditions") or []
            )
        ]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"KAI CRDs not Established after {timeout}s: {pending}")
        time.sleep(0.3)


def kai_dir() -> Path:
    """KAI's binaries, CRDs and RBAC, built (or found in the cache) by build_peers.sh."""
    script = REPO / "testenv" / "build_peers.sh"
    _log(f"building/checking KAI-Scheduler with {script} ...")
    subprocess.run([str(script), "kai"], check=True, stdout=sys.stderr, cwd=REPO)
    return (REPO / ".cache" / "peer-bin" / "kai").resolve()


def _with_args(
    contender: peers.Contender,
    extra: Mapping[str, Sequence[str]],
    env: Mapping[str, str] | None = None,
) -> peers.Contender:
    """The contender with more arguments for the commands whose name ends with a key of
    ``extra`` (``-scheduler``, ``-podgrouper``, or the whole name) and more environment."""
    commands = []
    for cmd in contender.commands:
        more = [a for suffix, args in extra.items() if cmd.name.endswith(suffix) for a in args]
        commands.append(
            dataclasses.replace(cmd, argv=[*cmd.argv, *more], env={**cmd.env, **(env or {})})
        )
    return dataclasses.replace(contender, commands=tuple(commands))


def contender_for(
    cp: ControlPlane,
    name: str,
    work: Path,
    *,
    cycle: str,
    kai_path: Path | None = None,
    ours_log_level: str = "info",
) -> peers.Contender:
    """Prepare ``name`` (``ours`` or ``kai``) on the control plane, with its own CRDs."""
    if name == "ours":
        _apply_our_crds(cp)
        c = peers.ours(cp, work, {"cyclePeriod": cycle}, ours_log_level)
        # The scheduler under test is this tree's, whatever the caller's working directory.
        return _with_args(c, {}, env={"PYTHONPATH": str(REPO)})
    if name == "kai":
        path = kai_path or kai_dir()
        _apply_kai_crds(cp, path)
        kubeconfigs = peers.prepare_kai(cp, path)
        c = peers.kai(path, kubeconfigs, unthrottled=False)
        return _with_args(
            c,
            {
                # DisruptionTarget on victims, as ours does; the same cycle period.
                "-scheduler": [
                    "--update-pod-eviction-condition=true",
                    f"--schedule-period={cycle}",
                ],
                # Only the gangs of one the scenarios leave to it (see the module docstring).
                "-podgrouper": [f"--pod-label-selector={LABEL_GROUPER}={PODGROUPER}"],
            },
        )
    raise ValueError(f"unknown scheduler {name!r}; use {', '.join(SCHEDULERS)}")


def _sweep(cp: ControlPlane) -> None:
    """Remove what an interrupted earlier run may have left: its namespaces' pods, its queues
    and its nodes (so the fair shares of the next run are not skewed by them)."""
    out = cp.kubectl("get", "namespaces", "-o", "name").stdout.split()
    for ns in (n.split("/", 1)[1] for n in out):
        if ns.startswith(NAMESPACE_PREFIX):
            cp.kubectl("delete", "replicasets", "--all", "-n", ns, "--wait=false", check=False)
            cp.kubectl(
                "delete", "pods", "--all", "-n", ns, "--grace-period=0", "--force", check=False
            )
            cp.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    cp.kubectl("delete", "queues", "-l", LABEL_RUN, "--ignore-not-found", check=False)
    cp.kubectl("delete", "nodes", "-l", LABEL_RUN, "--ignore-not-found", check=False)


def run_diff(
    cp: ControlPlane,
    scenarios: Sequence[Scenario],
    schedulers: Sequence[str],
    log_dir: Path,
    *,
    settle: float = 6.0,
    cycle: str = "1s",
    wave_timeout: float = 90.0,
    kai_path: Path | None = None,
    ours_log_level: str = "info",
) -> list[dict[str, Any]]:
    """Every scenario under each scheduler in turn (one process set per scheduler, started
    before its first scenario); the comparison per scenario."""
    log_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, Any]] = {s.name: {} for s in scenarios}
    for name in schedulers:
        _sweep(cp)
        contender = contender_for(
            cp, name, log_dir, cycle=cycle, kai_path=kai_path, ours_log_level=ours_log_level
        )
        comps = contender.spawn(log_dir)

        def check_alive(comps: Sequence[Any] = comps) -> None:
            dead = {c.name: c.exit_code() for c in comps if not c.running()}
            if dead:
                raise SchedulerDied(f"exited: {dead}; logs in {log_dir}")

        ctx = RunContext(
            cp,
            name,
            contender.scheduler_name,
            check_alive=check_alive,
            settle=settle,
            wave_timeout=wave_timeout,
        )
        try:
            for scenario in scenarios:
                _log(f"{name}: scenario {scenario.name}")
                result = asyncio.run(run_scenario(ctx, scenario))
                result["logs"] = [str(c.log_path) for c in comps]
                runs[scenario.name][name] = result
                _log(
                    f"{name}: {scenario.name} done in {result['seconds']}s: "
                    + (
                        result["error"]
                        or ", ".join(f"{g}={r['outcome']}" for g, r in result["gangs"].items())
                    )
                )
        finally:
            for c in comps:
                c.stop()
    return [compare(s, runs[s.name]) for s in scenarios]


def document(comparisons: Sequence[Mapping[str, Any]], **params: Any) -> dict[str, Any]:
    """The command's JSON output."""
    versions = dict(
        line.split("=", 1)
        for line in (REPO / "testenv" / "versions.env").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    verdicts = [c["verdict"] for c in comparisons]
    return {
        "bench": "takeback-diff",
        "versions": versions,
        "scheduler_revision": peers.scheduler_revision(),
        **params,
        "scenarios": list(comparisons),
        "verdicts": {c["scenario"]: c["verdict"] for c in comparisons},
        "consistent": all(v in ("same", "deliberate", "as-expected") for v in verdicts),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }


# ------------------------------------------------------------------------------ CLI


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``takeback-diff`` subcommand."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "takeback-diff",
        help="reclaim/preempt/consolidate/shrink scenarios on a real control plane: ours vs KAI",
    )
    p.add_argument(
        "--scenario",
        action="append",
        choices=[s.name for s in SCENARIOS],
        help="run only this scenario (repeatable); default: all",
    )
    p.add_argument(
        "--scheduler", default="ours,kai", help="ours, kai, or both as a list (run in that order)"
    )
    p.add_argument(
        "--settle", type=float, default=6.0, help="seconds without change that count as stable"
    )
    p.add_argument("--cycle", default="1s", help="cycle period of both schedulers (their default)")
    p.add_argument("--timeout", type=float, default=90.0, help="seconds for the second wave")
    p.add_argument("--ours-log-level", default="info", choices=("debug", "info", "warning"))
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    return p


def run(args: argparse.Namespace) -> int:
    """Run the comparison, print the JSON; 0 when every scenario is consistent."""
    names = [s.strip() for s in args.scheduler.split(",") if s.strip()]
    if not names or any(n not in SCHEDULERS for n in names):
        raise SystemExit(f"--scheduler {args.scheduler!r}: use ours, kai or ours,kai")
    scenarios = [scenario_named(n) for n in args.scenario] if args.scenario else list(SCENARIOS)
    path = kai_dir() if "kai" in names else None  # build before any clock matters
    began = time.monotonic()
    with ControlPlane() as cp:
        _log(f"control plane up in {cp.startup_seconds:.1f}s; logs in {cp.log_dir}")
        prepare_plane(cp)
        comparisons = run_diff(
            cp,
            scenarios,
            names,
            cp.log_dir / "takeback-diff",
            settle=args.settle,
            cycle=args.cycle,
            wave_timeout=args.timeout,
            kai_path=path,
            ours_log_level=args.ours_log_level,
        )
    doc = document(
        comparisons,
        schedulers=names,
        settle_seconds=args.settle,
        cycle=args.cycle,
        seconds=round(time.monotonic() - began, 1),
        log_dir=str(cp.log_dir),
    )
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    print(table(comparisons), file=sys.stderr)
    return 0 if doc["consistent"] else 1
