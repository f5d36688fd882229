"""Volcano's PodGroup lifecycle and Queue status, written in place of volcano-scheduler.

Volcano's job controller creates no pod until the Job's PodGroup leaves ``Pending``: that
step (volcano-scheduler's ``enqueue`` action) is the scheduler's. After each cycle, with the
status writes, this module

1. **enqueues**: every Volcano PodGroup in phase ``Pending`` (or none yet) is moved to
   ``Inqueue`` when its ``spec.minResources`` fit (the rule below); pending PodGroups are taken
   in order of priority (higher first), then age, then name, and each admitted one reserves
   its minResources for the next. One that does not fit stays ``Pending`` with the condition
   ``Unschedulable=True`` whose reason and message say why (``QueueCapability``: the queue's
   capability, naming the queue, the resource and the amounts; ``ClusterCapacity``;
   ``QueueClosed``; a missing, invalid or non-leaf queue), and a Warning Event on the
   PodGroup. A PodGroup without minResources is always enqueued (Volcano: best effort).
2. **follows** an enqueued PodGroup as Volcano reports it: ``Running`` once ``minMember`` of
   its pods are bound or finished (``Completed`` when all of those succeeded), ``Unknown``
   while some run but the gang cannot be placed, back to ``Pending`` when a running gang
   falls below ``minMember`` (then enqueued again); ``Inqueue`` otherwise. ``running``,
   ``succeeded`` and ``failed`` count the pods. The condition ``Scheduled=True`` marks a gang
   with minMember placed; ``Unschedulable=True`` (reason ``NotEnoughResources``, Volcano's)
   one that waits, with the placement's own reason. Conditions of other types are kept.
3. **reports** each Volcano Queue's ``status.allocated`` (what its pods and its children's
   hold), as volcano-scheduler does. ``state`` and the PodGroup counts stay the job of
   Volcano's queue controller.
4. **creates** Volcano's ``default`` Queue (weight 1, reclaimable) when Volcano's Queue API is
   installed and no queue of that name exists: volcano-scheduler does so at start, and
   Volcano's job controller refuses Jobs whose queue does not exist.

The enqueue rule (Volcano's ``proportion`` and ``overcommit`` plugins, in queue units: GPU,
CPU, memory), for each resource the PodGroup's minResources asks for:

- for its queue and every ancestor with a capability (limit) for it:
  ``allocated + reserved + minResources <= capability``, where ``allocated`` is what the
  queue's bound pods hold and ``reserved`` is, for each PodGroup already ``Inqueue``, the part
  of its minResources its bound pods do not hold yet;
- for the cluster: ``used + reserved + minResources <= 1.2 x allocatable`` of the schedulable
  nodes (Volcano's default overcommit factor), ``used`` counting every bound pod.

A Volcano PodGroup whose pods all belong to another scheduler (volcano-scheduler still
running beside this one while a cluster moves over) is left to that scheduler; one without
pods yet is enqueued here (a Job's pods only exist after that).

Writes only happen when something changed (compared with the object and with the last write)
and go through the leader-checked :class:`~scheduler.k8s.writer.Writer`. Volcano v1.10's
PodGroup CRD has no status subresource, so the PodGroup is merge-patched as a whole (only
``status``); should a later CRD add the subresource (the API's discovery lists
``podgroups/status``), that is used instead.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

import structlog

from scheduler.cache import Cache
from scheduler.cache.volcano import (
    DEFAULT_QUEUE,
    k8s_quantity,
    k8s_resource_list,
    min_resources,
    queue_state,
    resource_name,
)
from scheduler.cluster.gang import Gang
from scheduler.cluster.pod import Pod, PodPhase
from scheduler.cluster.queue import QUEUE_RESOURCES, UNLIMITED, pod_queue_usage
from scheduler.cluster.queuespec import SpecError
from scheduler.cluster.snapshot import Snapshot
from scheduler.fairness import FairShareReport
from scheduler.fairness.findings import queue_problem
from scheduler.fairness.share import cluster_capacity
from scheduler.k8s.client import JSON_CONTENT, MERGE_PATCH
from scheduler.k8s.errors import Conflict, Forbidden, KubeError, NotFound
from scheduler.k8s.resources import VOLCANO_PODGROUP, VOLCANO_QUEUE
from scheduler.k8s.writer import ObjectRef, Writer, now_rfc3339
from scheduler.solver.placement import GangOutcome

__all__ = [
    "OVERCOMMIT_FACTOR",
    "PodCounts",
    "PodGroupStatus",
    "VolcanoStatus",
    "podgroup_statuses",
]

log = structlog.get_logger("scheduler.commit.volcano")

#: Volcano's ``overcommit`` plugin default: the cluster may enqueue up to 1.2x its capacity.
OVERCOMMIT_FACTOR = 1.2
PENDING, INQUEUE, RUNNING, UNKNOWN, COMPLETED = (
    "Pending",
    "Inqueue",
    "Running",
    "Unknown",
    "Completed",
)
#: Condition types this module owns; others on the PodGroup are left as they are.
UNSCHEDULABLE, SCHEDULED = "Unschedulable", "Scheduled"
#: Volcano's reason for a gang that waits for resources.
NOT_ENOUGH_RESOURCES = "NotEnoughResources"
QUEUE_CAPABILITY = "QueueCapability"
CLUSTER_CAPACITY = "ClusterCapacity"
QUEUE_CLOSED = "QueueClosed"
#: Seconds between attempts to create the ``default`` queue after a failure.
_CREATE_RETRY = 60.0


class PodCounts(NamedTuple):
    """A PodGroup's ``status.running``, ``succeeded`` and ``failed``."""

    running: int = 0
    succeeded: int = 0
    failed: int = 0


@dataclass(frozen=True)
class PodGroupStatus:
    """What one Volcano PodGroup's status should say."""

    phase: str
    counts: PodCounts = field(default_factory=PodCounts)
    #: (type, reason, message) of the one condition this module sets (status ``True``), or
    #: None: neither ``Unschedulable`` nor ``Scheduled`` applies.
    condition: tuple[str, str, str] | None = None
    #: A Warning Event to send on the PodGroup (rate-limited by the writer).
    event: str = ""


def _phase(raw: Mapping[str, Any]) -> str:
    return str((raw.get("status") or {}).get("phase") or "")


class _Enqueue:
    """The enqueue rule over one snapshot (see the module docstring)."""

    def __init__(
        self,
        snapshot: Snapshot,
        report: FairShareReport,
        podgroups: Mapping[str, Mapping[str, Any]],
        volcano_queues: Mapping[str, Mapping[str, Any]],
        overcommit: float,
    ) -> None:
        self.snapshot = snapshot
        self.report = report
        self.volcano_queues = volcano_queues
        self.overcommit = overcommit
        self.tree = snapshot.queue_tree
        self.reserved_total = dict.fromkeys(QUEUE_RESOURCES, 0)
        self.reserved: dict[str, dict[str, int]] = {}
        for key, raw in podgroups.items():
            gang = snapshot.gang_by_key.get(key)
            if gang is None or _phase(raw) != INQUEUE:
                continue
            try:
                need = min_resources(raw)
            except SpecError:
                continue
            held = dict.fromkeys(QUEUE_RESOURCES, 0)
            for p in _bound(snapshot.pods_by_gang.get(key, ())):
                for r, v in pod_queue_usage(p).items():
                    held[r] += v
            self._reserve(gang.queue, {r: max(0, v - held.get(r, 0)) for r, v in need.items()})

    @cached_property
    def capacity(self) -> dict[str, int]:
        """What the cluster may enqueue in all: allocatable x the overcommit factor."""
        total = cluster_capacity(self.snapshot)
        return {r: int(v * self.overcommit) for r, v in total.items()}

    @cached_property
    def used(self) -> dict[str, int]:
        """What bound pods (of every scheduler) hold on schedulable nodes."""
        schedulable = {n.name for n in self.snapshot.nodes if n.schedulable}
        used = dict.fromkeys(QUEUE_RESOURCES, 0)
        for p in self.snapshot.pods:
            if p.node_name in schedulable and p.active:
                for r, v in pod_queue_usage(p).items():
                    used[r] += v
        return used

    def _chain(self, queue: str) -> list[str]:
        return self.tree.ancestors(queue) if queue in self.tree else [queue]

    def _reserve(self, queue: str, amount: Mapping[str, int]) -> None:
        for q in self._chain(queue):
            into = self.reserved.setdefault(q, dict.fromkeys(QUEUE_RESOURCES, 0))
            for r, v in amount.items():
                into[r] += v
        for r, v in amount.items():
            self.reserved_total[r] += v

    def admit(self, gang: Gang, raw: Mapping[str, Any]) -> tuple[str, str] | None:
        """None when ``gang`` is enqueued now (its minResources are reserved), else
        (reason, message)."""
        problem = queue_problem(self.tree, gang.queue)
        if problem is not None:
            return problem
        state = queue_state(self.volcano_queues.get(gang.queue))
        if state not in ("Open", ""):
            return (
                QUEUE_CLOSED,
                f"queue {gang.queue} is {state}: it takes no new PodGroups until it is Open",
            )
        try:
            need = {r: v for r, v in min_resources(raw).items() if v > 0}
        except SpecError as e:
            return ("InvalidSpec", f"{e.field}: {e.message}")
        for q in self._chain(gang.queue):
            status = self.report.queues.get(q)
            if status is None:
                continue
            reserved = self.reserved.get(q, {})
            for r, v in need.items():
                limit = status.limit.get(r, UNLIMITED)
                if limit == UNLIMITED:
                    continue
                held, booked = status.allocated.get(r, 0), reserved.get(r, 0)
                if held + booked + v > limit:
                    word = "capability" if q in self.volcano_queues else "limit"
                    return (
                        QUEUE_CAPABILITY,
                        f"queue {q} {word}: {resource_name(r)} {k8s_quantity(r, limit)}, "
                        f"of which {k8s_quantity(r, held)} in use and "
                        f"{k8s_quantity(r, booked)} reserved by enqueued PodGroups; "
                        f"minResources {resource_name(r)} {k8s_quantity(r, v)} does not fit, "
                        "so the PodGroup stays Pending (no pods are created) until it does",
                    )
        for r, v in need.items():
            free = self.capacity[r] - self.used[r] - self.reserved_total[r]
            if v > free:
                return (
                    CLUSTER_CAPACITY,
                    f"the cluster cannot take minResources {resource_name(r)} "
                    f"{k8s_quantity(r, v)}: {k8s_quantity(r, max(0, free))} left of "
                    f"{k8s_quantity(r, self.capacity[r])} ({OVERCOMMIT_FACTOR:g}x allocatable) "
                    f"after {k8s_quantity(r, self.used[r])} in use and "
                    f"{k8s_quantity(r, self.reserved_total[r])} reserved by enqueued "
                    "PodGroups; the PodGroup stays Pending until it fits",
                )
        self._reserve(gang.queue, need)
        return None


def _bound(pods: Any) -> list[Pod]:
    """Pods holding a place (nominated ones are not placed yet)."""
    return [p for p in pods if p.node_name and p.active and not p.nominated]


def podgroup_statuses(
    snapshot: Snapshot,
    report: FairShareReport,
    podgroups: Mapping[str, Mapping[str, Any]],
    volcano_queues: Mapping[str, Mapping[str, Any]],
    outcomes: Mapping[str, GangOutcome],
    *,
    overcommit: float = OVERCOMMIT_FACTOR,
    foreign: Collection[str] = (),
) -> dict[str, PodGroupStatus]:
    """The status every Volcano PodGroup (``podgroups``: ``namespace/name`` -> object) should
    have after this cycle; PodGroups without a gang in ``snapshot`` (invalid ones) are left
    out. ``volcano_queues`` are the Volcano Queue objects by name (their ``state``).

    ``foreign`` names PodGroups that pods of other schedulers join: one with such pods and
    none of ours is that scheduler's (e.g. volcano-scheduler still running beside this one
    during a move) and is left out too. A PodGroup without any pod yet is enqueued here."""
    out: dict[str, PodGroupStatus] = {}
    enqueue = _Enqueue(snapshot, report, podgroups, volcano_queues, overcommit)
    waiting: list[tuple[Gang, Mapping[str, Any], PodCounts]] = []
    for key, raw in podgroups.items():
        gang = snapshot.gang_by_key.get(key)
        if gang is None:
            continue
        pods = snapshot.pods_by_gang.get(key, [])
        if not pods and key in foreign:
            continue
        bound = _bound(pods)
        running = sum(1 for p in bound if p.phase == PodPhase.RUNNING)
        succeeded = sum(1 for p in pods if p.phase == PodPhase.SUCCEEDED)
        failed = sum(1 for p in pods if p.phase == PodPhase.FAILED)
        allocated = len(bound) + succeeded
        counts = PodCounts(running, succeeded, failed)
        current = _phase(raw)
        if allocated >= gang.min_member and current != COMPLETED:
            done = succeeded == allocated
            message = f"{allocated}/{gang.min_member} pods placed"
            out[key] = PodGroupStatus(
                COMPLETED if done else RUNNING,
                counts,
                condition=(SCHEDULED, "tasks in gang are ready to be scheduled", message),
            )
            continue
        if current == COMPLETED:
            out[key] = PodGroupStatus(COMPLETED, counts)
            continue
        if current in ("", PENDING):
            waiting.append((gang, raw, counts))
            continue
        outcome = outcomes.get(key)
        stuck = outcome is not None and not outcome.placed and any(p.pending for p in pods)
        condition = None
        event = ""
        if stuck and outcome is not None:
            unplaced = sum(1 for p in pods if p.pending)
            reason = outcome.reason or "the gang cannot be placed now"
            event = f"{unplaced}/{len(pods)} tasks in gang unschedulable: {reason}"
            condition = (UNSCHEDULABLE, NOT_ENOUGH_RESOURCES, event)
        if running and stuck:
            phase = UNKNOWN
        elif current == INQUEUE:
            phase = INQUEUE
        else:
            phase = PENDING  # fell below minMember: enqueued again next time
        out[key] = PodGroupStatus(phase, counts, condition=condition, event=event)
    waiting.sort(key=lambda w: (-w[0].priority, w[0].creation_time, w[0].key))
    for gang, raw, counts in waiting:
        refused = enqueue.admit(gang, raw)
        if refused is None:
            out[gang.key] = PodGroupStatus(INQUEUE, counts)
        else:
            reason, message = refused
            out[gang.key] = PodGroupStatus(
                PENDING, counts, condition=(UNSCHEDULABLE, reason, message), event=message
            )
    return out


def _conditions(raw: Mapping[str, Any], status: PodGroupStatus, now: str) -> list[dict[str, Any]]:
    """The PodGroup's conditions with ours replaced (times kept for unchanged ones)."""
    old = list((raw.get("status") or {}).get("conditions") or [])
    kept = [c for c in old if c.get("type") not in (UNSCHEDULABLE, SCHEDULED)]
    if status.condition is None:
        return kept
    kind, reason, message = status.condition
    mine = {"type": kind, "status": "True", "reason": reason, "message": message}
    before = next((c for c in old if c.get("type") == kind), None)
    same = before is not None and all(before.get(k) == v for k, v in mine.items())
    stamp = before.get("lastTransitionTime") if same and before is not None else None
    return [*kept, {**mine, "lastTransitionTime": stamp or now}]


def _comparable(status: Mapping[str, Any]) -> tuple[Any, ...]:
    conditions = sorted(
        (str(c.get("type")), str(c.get("status")), str(c.get("reason")), str(c.get("message")))
        for c in status.get("conditions") or []
    )
    return (
        status.get("phase") or "",
        int(status.get("running") or 0),
        int(status.get("succeeded") or 0),
        int(status.get("failed") or 0),
        tuple(conditions),
    )


class VolcanoStatus:
    """Writes the Volcano side of each cycle (see the module docstring)."""

    def __init__(
        self,
        cache: Cache,
        writer: Writer,
        *,
        overcommit: float = OVERCOMMIT_FACTOR,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cache = cache
        self.writer = writer
        self.overcommit = overcommit
        self._clock = clock
        #: ``namespace/name`` -> (uid, status) last written: a PodGroup deleted and made again
        #: under the same name (Volcano's job controller does so on every Job restart) is
        #: another object and is written afresh, even when it should get the same status.
        self._written: dict[str, tuple[str, tuple[Any, ...]]] = {}
        #: Queue name -> (uid, status.allocated) last written (uid: as for ``_written``).
        self._queue_written: dict[str, tuple[str, dict[str, str]]] = {}
        #: Whether PodGroups have a status subresource (None: not asked yet).
        self._status_subresource: bool | None = None
        self._create_after = 0.0

    def owned(self, snapshot: Snapshot) -> tuple[frozenset[str], frozenset[str]]:
        """Gang keys and queue names whose status is written here, not as KAI's: Volcano's
        PodGroups and every queue of the snapshot that is not a KAI Queue object (Volcano's,
        Volcano's ``root``/``default`` without objects, implicit ones)."""
        gangs = frozenset(self.cache.volcano_podgroups())
        kai = self.cache.kai_queue_names()
        return gangs, frozenset(q.name for q in snapshot.queues if q.name not in kai)

    async def publish(
        self,
        snapshot: Snapshot,
        outcomes: Mapping[str, GangOutcome],
        report: FairShareReport,
    ) -> None:
        """Enqueue, PodGroup and Queue status, the ``default`` queue (errors are logged)."""
        try:
            await self._publish(snapshot, outcomes, report)
        except Exception:
            log.exception("volcano_status_failed")

    async def _publish(
        self,
        snapshot: Snapshot,
        outcomes: Mapping[str, GangOutcome],
        report: FairShareReport,
    ) -> None:
        podgroups = self.cache.volcano_podgroups()
        queues = self.cache.volcano_queues()
        calls: list[Awaitable[None]] = []
        if self.cache.volcano_queue_api():
            calls.append(self._ensure_default_queue(queues))
            calls += self._queue_status(queues, report)
        if podgroups:
            statuses = podgroup_statuses(
                snapshot,
                report,
                podgroups,
                queues,
                outcomes,
                overcommit=self.overcommit,
                foreign=self.cache.foreign_podgroups(),
            )
            self._written = {k: v for k, v in self._written.items() if k in podgroups}
            now = now_rfc3339()
            for key, status in statuses.items():
                calls += self._podgroup(podgroups[key], status, now)
        else:
            self._written.clear()
        if calls:
            await asyncio.gather(*calls)

    # --- PodGroups -----------------------------------------------------------------------

    def _podgroup(
        self, raw: Mapping[str, Any], status: PodGroupStatus, now: str
    ) -> list[Awaitable[None]]:
        meta = raw.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        key = f"{namespace}/{name}"
        body = {
            "phase": status.phase,
            "running": status.counts.running,
            "succeeded": status.counts.succeeded,
            "failed": status.counts.failed,
            "conditions": _conditions(raw, status, now),
        }
        calls: list[Awaitable[None]] = []
        wanted = _comparable(body)
        mark = (str(meta.get("uid") or ""), wanted)
        if wanted != _comparable(raw.get("status") or {}) and self._written.get(key) != mark:
            self._written[key] = mark
            if _phase(raw) != status.phase:
                log.info(
                    "volcano_podgroup_phase",
                    podgroup=key,
                    phase=status.phase,
                    was=_phase(raw) or "none",
                    reason=status.condition[1] if status.condition else "",
                )
            calls.append(self._patch_podgroup(namespace, name, body))
        if status.event:
            ref = ObjectRef(
                VOLCANO_PODGROUP.kind,
                VOLCANO_PODGROUP.api_version,
                name,
                namespace,
                str(meta.get("uid") or ""),
            )
            calls.append(self._event(ref, status.event))
        return calls

    async def _event(self, ref: ObjectRef, message: str) -> None:
        await self.writer.event(ref, "Unschedulable", message, warning=True)

    async def _patch_podgroup(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        if self._status_subresource is None:
            self._status_subresource = await self._has_status_subresource()
        sub = "status" if self._status_subresource else ""
        path = VOLCANO_PODGROUP.object_path(namespace, name, sub)
        try:
            await _send(self.writer, "PATCH", path, {"status": status})
        except NotFound:
            self._written.pop(f"{namespace}/{name}", None)  # gone meanwhile
        except KubeError as e:
            self._written.pop(f"{namespace}/{name}", None)  # try again next time
            log.warning(
                "volcano_podgroup_status_failed", podgroup=f"{namespace}/{name}", error=e.message
            )

    async def _has_status_subresource(self) -> bool:
        """Whether the PodGroup CRD serves ``podgroups/status`` (API discovery)."""
        try:
            found = await self.writer._request("GET", VOLCANO_PODGROUP.base, write=False)
        except KubeError as e:
            log.warning("volcano_discovery_failed", error=e.message)
            return False
        names = {r.get("name") for r in (found or {}).get("resources") or []}
        return f"{VOLCANO_PODGROUP.plural}/status" in names

    # --- Queues --------------------------------------------------------------------------

    def _queue_status(
        self, queues: Mapping[str, Mapping[str, Any]], report: FairShareReport
    ) -> list[Awaitable[None]]:
        calls: list[Awaitable[None]] = []
        self._queue_written = {k: v for k, v in self._queue_written.items() if k in queues}
        for name, raw in queues.items():
            status = report.queues.get(name)
            if status is None:
                continue
            allocated = k8s_resource_list(status.allocated)
            current = (raw.get("status") or {}).get("allocated") or {}
            mark = (str((raw.get("metadata") or {}).get("uid") or ""), allocated)
            if allocated == current or self._queue_written.get(name) == mark:
                continue
            self._queue_written[name] = mark
            calls.append(self._patch_queue(name, allocated))
        return calls

    async def _patch_queue(self, name: str, allocated: dict[str, str]) -> None:
        path = VOLCANO_QUEUE.object_path(None, name, "status")
        try:
            await _send(self.writer, "PATCH", path, {"status": {"allocated": allocated}})
        except NotFound:
            self._queue_written.pop(name, None)
        except KubeError as e:
            self._queue_written.pop(name, None)
            log.warning("volcano_queue_status_failed", queue=name, error=e.message)

    async def _ensure_default_queue(self, queues: Mapping[str, Any]) -> None:
        """Create Volcano's ``default`` Queue as volcano-scheduler would (see docstring)."""
        if DEFAULT_QUEUE in queues or DEFAULT_QUEUE in self.cache.kai_queue_names():
            return
        if self.cache.raw(VOLCANO_QUEUE.key, "", DEFAULT_QUEUE) is not None:
            return
        if self._clock() < self._create_after:
            return
        self._create_after = self._clock() + _CREATE_RETRY
        body = {
            "apiVersion": VOLCANO_QUEUE.api_version,
            "kind": VOLCANO_QUEUE.kind,
            "metadata": {"name": DEFAULT_QUEUE},
            "spec": {"weight": 1, "reclaimable": True},
        }
        try:
            await _send(self.writer, "POST", VOLCANO_QUEUE.list_path(), body)
        except Conflict:
            return  # someone else made it
        except Forbidden as e:
            log.error(
                "volcano_default_queue_forbidden",
                error=e.message,
                fix="grant create on queues.scheduling.volcano.sh (manifests/20-rbac.yaml), "
                "or create the Volcano Queue 'default'",
            )
            return
        except KubeError as e:
            log.warning("volcano_default_queue_failed", error=e.message)
            return
        log.info("volcano_default_queue_created", queue=DEFAULT_QUEUE)


async def _send(writer: Writer, method: str, path: str, body: Mapping[str, Any]) -> Any:
    """One leader-checked write with the writer's retries (the Writer has no Volcano-shaped
    methods; these are its own request and retry steps)."""
    content_type = MERGE_PATCH if method == "PATCH" else JSON_CONTENT
    return await writer._retry(
        lambda: writer._request(method, path, body=dict(body), content_type=content_type)
    )
