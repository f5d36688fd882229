"""What each Volcano PodGroup's status should say after a cycle: volcano-scheduler's
``enqueue`` action and the phases Volcano reports, decided here and written by
:class:`~scheduler.commit.volcano.VolcanoStatus` (:func:`podgroup_statuses`).

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
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

from scheduler.cache.volcano import k8s_quantity, min_resources, queue_state, resource_name
from scheduler.cluster.gang import Gang
from scheduler.cluster.pod import Pod, PodPhase
from scheduler.cluster.queue import QUEUE_RESOURCES, UNLIMITED, pod_queue_usage
from scheduler.cluster.queuespec import SpecError
from scheduler.cluster.snapshot import Snapshot
from scheduler.fairness import FairShareReport
from scheduler.fairness.findings import queue_problem
from scheduler.fairness.share import cluster_capacity
from scheduler.solver.placement import GangOutcome

__all__ = [
    "OVERCOMMIT_FACTOR",
    "SCHEDULED",
    "UNSCHEDULABLE",
    "PodCounts",
    "PodGroupStatus",
    "podgroup_phase",
    "podgroup_statuses",
]

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


def podgroup_phase(raw: Mapping[str, Any]) -> str:
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
            if gang is None or podgroup_phase(raw) != INQUEUE:
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
        current = podgroup_phase(raw)
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
