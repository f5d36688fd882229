"""An in-memory cluster that implements :class:`scheduler.cycle.Backend`.

The simulator runs the very same :func:`scheduler.cycle.run_cycle` as the live scheduler; only
this backend differs. It holds nodes, queues, pods and gangs; ``commit`` binds each placed gang
as a unit (never part of one) and records why the others wait, with the reasons the solver
gives; :meth:`SimulatedCluster.advance` moves the clock and finishes pods whose run time is up.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import structlog

from scheduler.cluster.gang import Gang
from scheduler.cluster.node import Node
from scheduler.cluster.pod import Pod, PodPhase
from scheduler.cluster.queue import Queue, pod_queue_usage
from scheduler.cluster.snapshot import Snapshot
from scheduler.cycle import CommitResult
from scheduler.fairness import FairShareReport
from scheduler.solver.placement import Placement, PodAssignment

__all__ = ["GangRecord", "PodRecord", "SimulatedCluster"]

log = structlog.get_logger("scheduler.simulate")


@dataclass
class PodRecord:
    """One pod's life in the simulation."""

    pod: Pod
    arrived_at: float
    #: Seconds the pod runs once bound; None = until the simulation ends.
    duration: float | None = None
    bound_at: float | None = None
    finished_at: float | None = None

    @property
    def finishes_at(self) -> float | None:
        """When a running pod completes (None if unbound or endless)."""
        if self.bound_at is None or self.duration is None or self.finished_at is not None:
            return None
        return self.bound_at + self.duration


@dataclass
class GangRecord:
    """One gang's story: when it arrived, when it was placed, why it waited."""

    gang: Gang
    arrived_at: float
    pod_uids: list[str] = field(default_factory=list)
    placed_at: float | None = None
    #: The first reason the scheduler gave while the gang waited (why it did not start at once).
    first_reason: tuple[str, str] | None = None
    #: The latest reason; cleared when the gang is placed.
    last_reason: tuple[str, str] | None = None
    #: Cycles in which the gang was considered but not placed.
    waited_cycles: int = 0
    #: Cycles in which the backend could not bind a placed gang (rolled back).
    failed_binds: int = 0


class SimulatedCluster:
    """In-memory cluster state behind the :class:`scheduler.cycle.Backend` protocol."""

    def __init__(self, nodes: Sequence[Node], queues: Sequence[Queue]) -> None:
        self.nodes: tuple[Node, ...] = tuple(nodes)
        self.queues: tuple[Queue, ...] = tuple(queues)
        self.now: float = 0.0
        self.pods: dict[str, PodRecord] = {}
        #: Pods still pending or running (finished ones leave): what every step scans.
        self._live: dict[str, PodRecord] = {}
        self.gangs: dict[str, GangRecord] = {}
        self._node_names = {n.name for n in self.nodes}
        #: True when something changed since the last cycle (arrival, completion, bind).
        self.dirty = True

    # --- feeding the cluster -----------------------------------------------------------------

    def add_pods(
        self,
        pods: Iterable[Pod],
        gangs: Iterable[Gang],
        *,
        duration: float | None = None,
    ) -> None:
        """Create pods (and their gangs, if new) at the current time."""
        for gang in gangs:
            if gang.key not in self.gangs:
                self.gangs[gang.key] = GangRecord(gang, self.now)
        for pod in pods:
            if pod.uid in self.pods:
                raise ValueError(f"pod {pod.key} was added twice")
            record = self.gangs.get(pod.gang)
            if record is None:
                raise ValueError(f"pod {pod.key} names gang {pod.gang!r} that was never added")
            # A PodGroup's queue wins over the pod's label, as in the live cache.
            queue = record.gang.queue or pod.queue
            pod_record = PodRecord(replace(pod, queue=queue), self.now, duration)
            self.pods[pod.uid] = pod_record
            if pod_record.pod.active:
                self._live[pod.uid] = pod_record
            record.pod_uids.append(pod.uid)
        self.dirty = True

    def advance(self, now: float) -> list[PodRecord]:
        """Move the clock to ``now`` and complete every pod whose run time is up."""
        if now < self.now:
            raise ValueError(f"time cannot go back from {self.now} to {now}")
        self.now = now
        done = []
        for record in self._live.values():
            end = record.finishes_at
            if end is not None and end <= now:
                record.finished_at = end
                record.pod = replace(record.pod, phase=PodPhase.SUCCEEDED)
                done.append(record)
        for record in done:
            del self._live[record.pod.uid]
        if done:
            self.dirty = True
        return done

    def fail_pod(self, uid: str) -> None:
        """End a pending pod as Failed (a replay drops pods that did not fit)."""
        record = self._live.pop(uid, None)
        if record is not None:
            record.pod = replace(record.pod, phase=PodPhase.FAILED)
            record.finished_at = self.now
            self.dirty = True

    def next_completion(self) -> float | None:
        """The earliest time a running pod completes (None when none will)."""
        ends = [r.finishes_at for r in self._live.values() if r.finishes_at is not None]
        return min(ends) if ends else None

    def last_completion(self) -> float | None:
        """The latest time a running pod completes (None when none will)."""
        ends = [r.finishes_at for r in self._live.values() if r.finishes_at is not None]
        return max(ends) if ends else None

    # --- views ------------------------------------------------------------------------------

    def active_pods(self) -> list[Pod]:
        """Pods that exist and hold (or wait for) capacity."""
        return [r.pod for r in self._live.values()]

    def pending_gangs(self) -> list[str]:
        """Keys of gangs with at least one pending pod."""
        keys = {r.pod.gang for r in self._live.values() if r.pod.pending}
        return sorted(keys)

    def snapshot_now(self) -> Snapshot:
        """The cluster as a cycle sees it: active pods and the gangs they belong to."""
        pods = tuple(self.active_pods())
        live = {p.gang for p in pods}
        gangs = tuple(r.gang for key, r in self.gangs.items() if key in live)
        return Snapshot(nodes=self.nodes, pods=pods, gangs=gangs, queues=self.queues, now=self.now)

    def queue_gpu(self) -> dict[str, tuple[int, int]]:
        """Per queue: GPU thousandths (allocated, requested by pods still waiting)."""
        out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for pod in self.active_pods():
            gpu = pod_queue_usage(pod)["gpu"]
            out[pod.queue][0 if pod.bound else 1] += gpu
        return {q: (v[0], v[1]) for q, v in out.items()}

    # --- Backend protocol ---------------------------------------------------------------------

    async def snapshot(self) -> Snapshot:
        """An immutable view of the cluster for this cycle."""
        self.dirty = False
        return self.snapshot_now()

    async def commit(
        self, snapshot: Snapshot, placement: Placement, report: FairShareReport
    ) -> CommitResult:
        """Bind every placed gang as a unit; remember why the other gangs wait."""
        by_gang: dict[str, dict[str, PodAssignment]] = defaultdict(dict)
        for a in placement.assignments:
            by_gang[a.gang][a.pod_uid] = a
        for outcome in placement.outcomes.values():
            for a in outcome.pods:
                by_gang[outcome.gang].setdefault(a.pod_uid, a)
        bound_gangs: list[str] = []
        failed_gangs: list[str] = []
        bound_pods = failed_pods = 0
        for key, outcome in placement.outcomes.items():
            record = self.gangs.get(key)
            if record is None:
                log.warning("unknown_gang_in_placement", gang=key)
                continue
            assignments = list(by_gang.pop(key, {}).values())
            if not outcome.placed:
                record.last_reason = (outcome.reason_code, outcome.reason)
                record.first_reason = record.first_reason or record.last_reason
                record.waited_cycles += 1
                continue
            if not assignments:
                continue
            problem = self._bind_problem(assignments)
            if problem:
                # Nothing of the gang is bound: all or nothing, like the live commit.
                log.warning("gang_bind_failed", gang=key, reason=problem)
                record.failed_binds += 1
                record.last_reason = ("BindFailed", problem)
                failed_gangs.append(key)
                failed_pods += len(assignments)
                continue
            for a in assignments:
                pod_record = self.pods[a.pod_uid]
                pod_record.pod = replace(
                    pod_record.pod,
                    node_name=a.node,
                    gpu_grant=a.gpu_grant,
                    phase=PodPhase.RUNNING,
                )
                pod_record.bound_at = self.now
            if record.placed_at is None:
                record.placed_at = self.now
            record.last_reason = None
            bound_gangs.append(key)
            bound_pods += len(assignments)
            log.debug("gang_bound", gang=key, queue=record.gang.queue, pods=len(assignments))
        for key in by_gang:
            # The solver must give an outcome for every gang it places pods of.
            log.warning("assignments_without_outcome", gang=key)
        if bound_pods:
            self.dirty = True
        return CommitResult(
            bound_gangs=tuple(bound_gangs),
            failed_gangs=tuple(failed_gangs),
            bound_pods=bound_pods,
            failed_pods=failed_pods,
        )

    def _bind_problem(self, assignments: Sequence[PodAssignment]) -> str:
        for a in assignments:
            record = self.pods.get(a.pod_uid)
            if record is None:
                return f"pod {a.pod_key} does not exist"
            if not record.pod.pending:
                return f"pod {a.pod_key} is not pending any more"
            if a.node not in self._node_names:
                return f"node {a.node} does not exist"
        return ""
