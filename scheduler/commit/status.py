"""Telling users why: pod conditions and Events, PodGroup status, Queue status, problems.

- A pod that waits gets ``PodScheduled=False, reason=Unschedulable`` (what Cluster Autoscaler
  and Karpenter look for) and a rate-limited ``FailedScheduling`` Event whose message is the
  gang's real cause from :class:`GangOutcome.reason`.
- A bound pod gets a ``Scheduled`` Event (the API server sets ``PodScheduled=True`` itself).
- A PodGroup gets its phase, member counts and a condition with the same reason; a gang
  held on its nodes while pods evicted for it terminate is ``Pending`` with the condition
  reason ``WaitingForEvictions`` saying for which pods it waits.
- A Queue gets ``allocated``, ``requested`` and ``fairShare`` per resource in the CRD's units.
- An object the cache could not read (:class:`scheduler.cache.problems.Problem`) gets a
  Warning Event naming the field and the fix.
- Volcano's PodGroups and Queues (and queues that are no KAI Queue object) get Volcano's
  status instead, from :attr:`StatusPublisher.volcano` (:mod:`scheduler.commit.volcano`,
  which also enqueues Volcano PodGroups); without it every gang and queue is written as
  KAI's.

Writes happen only when something changed since the last write by this replica, so a steady
cluster costs no API calls.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import structlog

from scheduler.cache.problems import Problem
from scheduler.cluster.gang import Gang
from scheduler.cluster.node import GPU_MEMORY_LABEL
from scheduler.cluster.pod import Pod, PodPhase
from scheduler.cluster.queue import QUEUE_RESOURCES
from scheduler.cluster.snapshot import Snapshot
from scheduler.commit.evict import eviction_message
from scheduler.commit.staleness import gang_progress
from scheduler.commit.transaction import GangCommit
from scheduler.explain.codes import SCHEDULING_GATED
from scheduler.fairness import FairShareReport
from scheduler.k8s.errors import KubeError, NotFound
from scheduler.k8s.resources import PODGROUP, QUEUE
from scheduler.k8s.writer import ObjectRef, Writer, now_rfc3339
from scheduler.metrics import queue_units
from scheduler.solver.placement import EvictAction, Eviction, GangOutcome, PodAssignment

if TYPE_CHECKING:
    from scheduler.commit.volcano import VolcanoStatus

__all__ = [
    "StatusPublisher",
    "crd_quantity",
    "node_label_problems",
    "pod_ref",
    "queue_status_body",
]

log = structlog.get_logger("scheduler.commit.status")


def crd_quantity(resource: str, amount: int) -> int | str:
    """Scheduler units to the CRD's (gpu devices, cpu millicores, memory MB), int when whole."""
    value = queue_units(resource, amount)
    if float(value).is_integer():
        return int(value)
    return f"{value:.3f}".rstrip("0").rstrip(".")


def queue_status_body(report: FairShareReport, name: str) -> dict[str, Any]:
    """The ``status`` of Queue ``name`` from this cycle's fair-share report."""
    q = report.queues[name]
    finding = next((f for f in report.findings if f.queue == name), None)
    # A tree problem (unknown parent, cycle) can only be seen across objects, so the API server
    # cannot reject it: the queue says so itself, and its gangs wait until it is fixed.
    condition = (
        {"type": "Valid", "status": "True", "reason": "Valid", "message": ""}
        if finding is None
        else {
            "type": "Valid",
            "status": "False",
            "reason": "InvalidQueueTree",
            "message": f"{finding.field}: {finding.message}",
        }
    )
    return {
        "allocated": {r: crd_quantity(r, q.allocated.get(r, 0)) for r in QUEUE_RESOURCES},
        "allocatedNonPreemptible": {
            r: crd_quantity(r, q.allocated_non_preemptible.get(r, 0)) for r in QUEUE_RESOURCES
        },
        "requested": {r: crd_quantity(r, q.requested.get(r, 0)) for r in QUEUE_RESOURCES},
        "fairShare": {r: crd_quantity(r, q.fair_share.get(r, 0)) for r in QUEUE_RESOURCES},
        "childQueues": list(getattr(q, "children", ()) or ()),
        "conditions": [condition],
    }


#: Queue condition reason per eviction action.
_CONDITION_REASONS: dict[EvictAction, str] = {
    "reclaim": "Reclaim",
    "preempt": "Preempt",
    "consolidate": "Consolidate",
    "shrink": "Shrink",
}


def pod_ref(pod: Pod) -> ObjectRef:
    """The Event target for a pod."""
    return ObjectRef("Pod", "v1", pod.name, pod.namespace, pod.uid)


def node_label_problems(snapshot: Snapshot, known: Iterable[Problem] = ()) -> list[Problem]:
    """Nodes whose GPU memory label cannot be read (so GPU-memory pods cannot use them).

    The cache keeps such nodes (their GPUs still count) and drops the label silently; an
    admin should hear about it on the Node itself.
    """
    seen = {(p.kind, p.name, p.field) for p in known}
    field = f"metadata.labels[{GPU_MEMORY_LABEL}]"
    out = []
    for node in snapshot.nodes:
        raw = node.label_map.get(GPU_MEMORY_LABEL)
        if raw is None or node.gpu_memory_mib is not None or ("Node", node.name, field) in seen:
            continue
        out.append(
            Problem(
                "Node",
                "",
                node.name,
                field,
                f"{raw!r} is not a positive whole number of MiB; fix the label (e.g. 81920) or "
                "remove it - until then pods that ask for GPU memory cannot use this node",
                api_version="v1",
                reason="InvalidLabel",
            )
        )
    return out


def _pod_message(snapshot: Snapshot, key: str, outcome: GangOutcome) -> str:
    """The reason a member pod shows; names its PodGroup so users find the gang."""
    message = outcome.reason or "waiting for resources"
    gang = snapshot.gang_by_key.get(key)
    if gang is not None and not gang.implicit and gang.name not in message:
        message = f"PodGroup {gang.key}: {message}"
    return message


def _podgroup_body(
    gang: Gang, pods: list[Pod], outcome: GangOutcome | None, waiting: str | None = None
) -> dict[str, Any]:
    if any(p.nominated for p in pods):
        # Held on a node is not placed yet: count it as pending.
        pods = [dataclasses.replace(p, node_name=None, nominated=False) if p.nominated else p
                for p in pods]  # fmt: skip
    bound, counted = gang_progress(gang, pods)
    running = sum(1 for p in bound if p.phase == PodPhase.RUNNING)
    body: dict[str, Any] = {
        "running": running,
        "pending": sum(
            1 for p in pods if p.pending or p.gated or (p.bound and p.phase == PodPhase.PENDING)
        ),
        "succeeded": sum(1 for p in pods if p.phase == PodPhase.SUCCEEDED),
        "failed": sum(1 for p in pods if p.phase == PodPhase.FAILED),
    }
    if pods and not any(p.active for p in pods):
        # Every member finished: the gang is done, whatever the scheduler did before.
        body["phase"] = "Failed" if body["failed"] else "Succeeded"
        condition = {
            "type": "Unschedulable",
            "status": "False",
            "reason": body["phase"],
            "message": f"{body['succeeded']} succeeded, {body['failed']} failed",
        }
        body["schedulingConditions"] = []
    elif waiting is not None:
        body["phase"] = "Pending"
        condition = {
            "type": "Unschedulable",
            "status": "False",
            "reason": "WaitingForEvictions",
            "message": waiting,
        }
        body["schedulingConditions"] = []
    elif counted >= gang.min_member:
        body["phase"] = "Running"
        condition = {
            "type": "Unschedulable",
            "status": "False",
            "reason": "Scheduled",
            "message": f"{counted}/{gang.min_member} pods placed",
        }
        body["schedulingConditions"] = []
    elif outcome is not None and not outcome.placed and outcome.reason_code == SCHEDULING_GATED:
        # Waiting for someone (Kueue, an operator) to lift the gates is not a failure.
        body["phase"] = "Pending"
        condition = {
            "type": "Unschedulable",
            "status": "False",
            "reason": SCHEDULING_GATED,
            "message": outcome.reason,
        }
        body["schedulingConditions"] = []
    elif outcome is not None and not outcome.placed:
        body["phase"] = "Unschedulable"
        reason = outcome.reason_code or "Unschedulable"
        message = outcome.reason or "the gang cannot be placed now"
        condition = {
            "type": "Unschedulable",
            "status": "True",
            "reason": reason,
            "message": message,
        }
        body["schedulingConditions"] = [
            {
                "type": "UnschedulableOnNodePool",
                "nodePool": "default",
                "status": "True",
                "reason": reason,
                "message": message,
                "reasons": [{"reason": reason, "message": message}],
            }
        ]
    else:
        body["phase"] = "Pending"
        condition = {
            "type": "Unschedulable",
            "status": "False",
            "reason": "Pending",
            "message": f"{counted}/{gang.min_member} pods placed",
        }
        body["schedulingConditions"] = []
    body["conditions"] = [condition]
    return body


def _stamped(body: dict[str, Any]) -> dict[str, Any]:
    now = now_rfc3339()
    out = dict(body)
    out["conditions"] = [{**c, "lastTransitionTime": now} for c in body["conditions"]]
    out["schedulingConditions"] = [
        {**c, "lastTransitionTime": now} for c in body["schedulingConditions"]
    ]
    return out


class StatusPublisher:
    """Writes what users see; remembers what it wrote to skip unchanged writes."""

    def __init__(
        self, writer: Writer, *, concurrency: int = 16, volcano: VolcanoStatus | None = None
    ) -> None:
        self.writer = writer
        #: Writes the Volcano side (set by the runner when it watches Volcano's API).
        self.volcano = volcano
        self._slots = asyncio.Semaphore(concurrency)
        self._pod_message: dict[str, str] = {}
        self._podgroup: dict[str, dict[str, Any]] = {}
        self._queue: dict[str, dict[str, Any]] = {}
        #: Queue -> condition type -> the latest eviction condition (see :meth:`evicted`).
        self._taken: dict[str, dict[str, dict[str, Any]]] = {}

    async def _limited(self, call: Awaitable[Any], what: str) -> None:
        async with self._slots:
            try:
                await call
            except NotFound:
                pass  # the object went away meanwhile; nothing to tell
            except KubeError as e:
                log.warning("status_write_failed", object=what, error=e.message)

    async def publish(
        self,
        snapshot: Snapshot,
        outcomes: Mapping[str, GangOutcome],
        commits: Mapping[str, GangCommit],
        report: FairShareReport,
        problems: Iterable[Problem],
        cycle: int = 0,
        *,
        waiting: Mapping[str, str] | None = None,
    ) -> None:
        """Write every change of this cycle (errors are logged, never raised). ``waiting``:
        gang key -> what a nominated gang waits for."""
        calls: list[Awaitable[None]] = []
        volcano_gangs: frozenset[str] = frozenset()
        volcano_queues: frozenset[str] = frozenset()
        if self.volcano is not None:
            volcano_gangs, volcano_queues = self.volcano.owned(snapshot)
            calls.append(self.volcano.publish(snapshot, outcomes, report))
        calls += self._pods(snapshot, outcomes, commits)
        calls += self._podgroups(snapshot, outcomes, waiting or {}, volcano_gangs)
        calls += self._queues(snapshot, report, volcano_queues)
        reported = list(problems)
        reported += node_label_problems(snapshot, reported)
        calls += [self._problem(p) for p in reported]
        if calls:
            await asyncio.gather(*calls)

    def _pods(
        self,
        snapshot: Snapshot,
        outcomes: Mapping[str, GangOutcome],
        commits: Mapping[str, GangCommit],
    ) -> list[Awaitable[None]]:
        calls: list[Awaitable[None]] = []
        by_key = {p.key: p for p in snapshot.pods}
        for commit in commits.values():
            calls += self._scheduled(commit.bound)
            for a, error in commit.failed:
                pod = by_key.get(a.pod_key)
                if pod is not None and error:
                    calls.append(self._wait_reason(pod, f"binding to {a.node} failed: {error}"))
        for key, outcome in outcomes.items():
            if outcome.placed:
                continue
            message = _pod_message(snapshot, key, outcome)
            # A gang waiting for a gate to be lifted would not fit better on a new node: no
            # Unschedulable condition, which autoscalers act on; the Event still says why.
            condition = outcome.reason_code != SCHEDULING_GATED
            for pod in snapshot.pods_by_gang.get(key, ()):
                if pod.pending:
                    calls.append(self._wait_reason(pod, message, condition=condition))
        pending_uids = {p.uid for p in snapshot.pods if p.pending}
        for uid in [u for u in self._pod_message if u not in pending_uids]:
            del self._pod_message[uid]
        return calls

    def _scheduled(self, bound: Iterable[PodAssignment]) -> list[Awaitable[None]]:
        calls: list[Awaitable[None]] = []
        for a in bound:
            namespace, _, name = a.pod_key.partition("/")
            self._pod_message.pop(a.pod_uid, None)
            ref = ObjectRef("Pod", "v1", name, namespace, a.pod_uid)
            message = f"Successfully assigned {a.pod_key} to {a.node}"
            calls.append(self._limited(self.writer.event(ref, "Scheduled", message), a.pod_key))
        return calls

    async def scheduled(self, bound: Iterable[PodAssignment]) -> None:
        """Tell the pods of a gang whose binds just finished that they are scheduled (the
        binds stream, so this comes as they land, not with the next cycle's status pass)."""
        calls = self._scheduled(bound)
        if calls:
            await asyncio.gather(*calls)

    async def _wait_reason(self, pod: Pod, message: str, *, condition: bool = True) -> None:
        if condition and self._pod_message.get(pod.uid) != message:
            self._pod_message[pod.uid] = message
            await self._limited(
                self.writer.set_unschedulable(pod.namespace, pod.name, message), pod.key
            )
        await self._limited(
            self.writer.event(pod_ref(pod), "FailedScheduling", message, warning=True), pod.key
        )

    def _podgroups(
        self,
        snapshot: Snapshot,
        outcomes: Mapping[str, GangOutcome],
        waiting: Mapping[str, str],
        skip: frozenset[str] = frozenset(),
    ) -> list[Awaitable[None]]:
        calls: list[Awaitable[None]] = []
        live = {g.key for g in snapshot.gangs}
        self._podgroup = {k: v for k, v in self._podgroup.items() if k in live}
        for gang in snapshot.gangs:
            if gang.implicit or gang.key in skip:
                continue
            pods = snapshot.pods_by_gang.get(gang.key, [])
            body = _podgroup_body(gang, pods, outcomes.get(gang.key), waiting.get(gang.key))
            if self._podgroup.get(gang.key) == body:
                continue
            self._podgroup[gang.key] = body
            calls.append(
                self._limited(
                    self.writer.patch_podgroup_status(gang.namespace, gang.name, _stamped(body)),
                    f"{PODGROUP.kind}/{gang.key}",
                )
            )
            if body["phase"] == "Unschedulable":
                ref = ObjectRef(PODGROUP.kind, PODGROUP.api_version, gang.name, gang.namespace)
                message = body["conditions"][0]["message"]
                calls.append(
                    self._limited(
                        self.writer.event(ref, "Unschedulable", message, warning=True), gang.key
                    )
                )
        return calls

    def evicted(
        self, done: Sequence[Eviction], for_queue: str | None, when: str | None = None
    ) -> None:
        """Pods of one victim gang were evicted for a gang of ``for_queue``: the victim's
        queue gets condition ``LastEviction`` and the taker's ``LastTakeBack`` (reason: the
        action), written with the next status pass. Both stay until a newer one replaces
        them (kept by this replica only: a new leader starts without them)."""
        if not done:
            return
        first = done[0]
        when = when or now_rfc3339()
        reason = _CONDITION_REASONS[first.action]
        pods = f"{len(done)} pod{'s' if len(done) != 1 else ''}"
        why = eviction_message(first)
        self._taken.setdefault(first.queue, {})["LastEviction"] = {
            "type": "LastEviction",
            "status": "True",
            "reason": reason,
            "message": f"{pods} of gang {first.gang} evicted for gang {first.for_gang}"
            + (f" (queue {for_queue})" if for_queue else "")
            + f": {why}",
            "lastTransitionTime": when,
        }
        if not for_queue:
            return
        self._taken.setdefault(for_queue, {})["LastTakeBack"] = {
            "type": "LastTakeBack",
            "status": "True",
            "reason": reason,
            "message": f"gang {first.for_gang} took the place of {pods} of gang {first.gang} "
            f"(queue {first.queue}): {why}",
            "lastTransitionTime": when,
        }

    def _queues(
        self, snapshot: Snapshot, report: FairShareReport, skip: frozenset[str] = frozenset()
    ) -> list[Awaitable[None]]:
        calls: list[Awaitable[None]] = []
        live = {q.name for q in snapshot.queues}
        self._queue = {k: v for k, v in self._queue.items() if k in live}
        self._taken = {k: v for k, v in self._taken.items() if k in live}
        for queue in snapshot.queues:
            if queue.name not in report.queues or queue.name in skip:
                continue
            body = queue_status_body(report, queue.name)
            taken = self._taken.get(queue.name)
            if taken:
                body["conditions"] += [taken[t] for t in sorted(taken)]
            if self._queue.get(queue.name) == body:
                continue
            self._queue[queue.name] = body
            calls.append(
                self._limited(
                    self.writer.patch_queue_status(queue.name, body), f"{QUEUE.kind}/{queue.name}"
                )
            )
        return calls

    async def _problem(self, problem: Problem) -> None:
        ref = ObjectRef(
            problem.kind, problem.api_version or "v1", problem.name, problem.namespace, problem.uid
        )
        await self._limited(
            self.writer.event(
                ref, problem.reason or "InvalidSpec", problem.describe(), warning=True
            ),
            f"{problem.kind}/{problem.key}",
        )
