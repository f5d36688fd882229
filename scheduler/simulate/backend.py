"""An in-memory cluster that implements :class:`scheduler.cycle.Backend`.

The simulator runs the very same :func:`scheduler.cycle.run_cycle` as the live scheduler; only
this backend differs. It holds nodes, queues, pods and gangs; ``commit`` binds each placed gang
as a unit (never part of one) and records why the others wait, with the reasons the solver
gives; :meth:`SimulatedCluster.advance` moves the clock and finishes pods whose run time is up.

Taking back (a placement's ``evictions`` and ``waits_for``), as the live commit does it:

- a victim pod is marked deleting and keeps its resources for its termination grace period
  (``termination_grace``, default 0 s), then leaves as Failed (reason Evicted);
- when it leaves, its job creates a replacement: a new pending pod (new uid and name, same
  gang, same run time from scratch), so the gang can be scheduled again later. A victim gang
  whose every running pod was evicted *restarts* (Volcano's ``PodEvicted -> RestartJob``):
  it is waiting again. A ``shrink`` eviction only brings the evicted extra pods back;
- a pod that the same placement evicts *and* assigns elsewhere (consolidation) is replaced
  at once, and the replacement takes the assignment;
- the assignments of a gang in ``waits_for`` are a *nomination*: its pods show their node
  and ``nominated=True`` (holding the space) until every victim they wait for is gone, then
  they are bound.

Bound pods get ``start_time`` = the simulated bind time.

ResourceClaims (scenarios with DRA objects): the claims live in
:class:`~scheduler.simulate.claims.SimulatedClaims`; a bound (or nominated) pod's grants are
written into them, so later cycles see those devices taken, and a pod that ends frees them.
A gang whose grants no longer fit the claims is not bound (``BindFailed``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import structlog

from scheduler.cache.restoring import RestoringGangs
from scheduler.cluster.gang import Gang
from scheduler.cluster.node import Node
from scheduler.cluster.pod import Pod, PodPhase
from scheduler.cluster.queue import Queue, pod_queue_usage
from scheduler.cluster.snapshot import Snapshot
from scheduler.cycle import CommitResult
from scheduler.fairness import FairShareReport
from scheduler.simulate.records import EvictionRecord, GangRecord, Nomination, PodRecord
from scheduler.simulate.workload import ClaimRef
from scheduler.solver.placement import Eviction, Placement, PodAssignment

if TYPE_CHECKING:  # the DRA types pull in the CEL library: only scenarios with claims need it
    from scheduler.cluster.dra import ResourceClaim
    from scheduler.cluster.draview import DraView
    from scheduler.simulate.claims import SimulatedClaims

__all__ = [
    "EVICTED",
    "NOMINATED",
    "EvictionRecord",
    "GangRecord",
    "Nomination",
    "PodRecord",
    "SimulatedCluster",
]

log = structlog.get_logger("scheduler.simulate")

#: Reason code of a gang that waits again because its pods were evicted.
EVICTED = "Evicted"
#: Reason code of a gang whose placement is held until the pods evicted for it are gone.
NOMINATED = "Nominated"


class SimulatedCluster:
    """In-memory cluster state behind the :class:`scheduler.cycle.Backend` protocol."""

    def __init__(
        self,
        nodes: Sequence[Node],
        queues: Sequence[Queue],
        *,
        termination_grace: float = 0.0,
        dra: DraView | None = None,
        claim_templates: Iterable[ResourceClaim] = (),
    ) -> None:
        if termination_grace < 0:
            raise ValueError(f"termination grace {termination_grace} must be >= 0")
        self.nodes: tuple[Node, ...] = tuple(nodes)
        self.queues: tuple[Queue, ...] = tuple(queues)
        self.termination_grace = termination_grace
        self.now: float = 0.0
        self.pods: dict[str, PodRecord] = {}
        #: Pods still pending or running (finished ones leave): what every step scans.
        self._live: dict[str, PodRecord] = {}
        self.gangs: dict[str, GangRecord] = {}
        self._node_names = {n.name for n in self.nodes}
        #: Every pod evicted, in order.
        self.evictions: list[EvictionRecord] = []
        #: Gangs held on their nodes until their victims are gone, by gang key.
        self.nominations: dict[str, Nomination] = {}
        #: Gangs moved by consolidation that have not run again yet.
        self.restoring = RestoringGangs()
        #: True when something changed since the last cycle (arrival, completion, bind).
        self.dirty = True
        templates = tuple(claim_templates)
        #: DeviceClasses, ResourceSlices and ResourceClaims (None: the cluster has none).
        self.claims: SimulatedClaims | None = None
        if dra is not None or templates:
            from scheduler.simulate.claims import SimulatedClaims

            self.claims = SimulatedClaims(dra, templates)

    # --- feeding the cluster -----------------------------------------------------------------

    def add_pods(
        self,
        pods: Iterable[Pod],
        gangs: Iterable[Gang],
        *,
        duration: float | None = None,
        grace: float | None = None,
        claims: Sequence[ClaimRef] = (),
    ) -> None:
        """Create pods (and their gangs, if new) at the current time.

        A pod that comes bound (a scenario's already running job) runs from its
        ``start_time``: it finishes at ``start_time + duration``. ``claims``: every pod's
        ``spec.resourceClaims`` entries (the claims must exist, see
        :meth:`SimulatedClaims.add_pod <scheduler.simulate.claims.SimulatedClaims.add_pod>`).
        """
        if claims and self.claims is None:
            raise ValueError("pods use ResourceClaims but the cluster has no DRA objects")
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
            pod_record = PodRecord(
                replace(pod, queue=queue), self.now, duration, grace=grace, base_name=pod.name
            )
            if pod.bound and pod.active:
                if pod.node_name not in self._node_names:
                    raise ValueError(f"pod {pod.key} runs on unknown node {pod.node_name}")
                pod_record.bound_at = pod.start_time
                pod_record.arrived_at = min(self.now, pod.start_time)
                record.arrived_at = min(record.arrived_at, pod.start_time)
                for attr in ("placed_at", "first_placed_at"):
                    held = getattr(record, attr)
                    setattr(
                        record, attr, pod.start_time if held is None else min(held, pod.start_time)
                    )
            self.pods[pod.uid] = pod_record
            if claims and self.claims is not None:
                self.claims.add_pod(pod_record.pod, claims)
            if pod_record.pod.active:
                self._live[pod.uid] = pod_record
            record.pod_uids.append(pod.uid)
        self.dirty = True

    def advance(self, now: float) -> list[PodRecord]:
        """Move the clock to ``now``: complete every pod whose run time is up, let evicted pods
        whose grace period ended go (their replacements arrive), and bind the nominations
        whose victims are all gone. Returns the pods that completed."""
        if now < self.now:
            raise ValueError(f"time cannot go back from {self.now} to {now}")
        self.now = now
        done = []
        for record in self._live.values():
            end = record.finishes_at
            leave = record.leaves_at
            if leave is not None and leave <= now and (end is None or leave < end):
                continue  # evicted: handled by _settle below
            if end is not None and end <= now:
                record.finished_at = end
                record.pod = replace(record.pod, phase=PodPhase.SUCCEEDED)
                done.append(record)
        for record in done:
            del self._live[record.pod.uid]
            self._release_claims(record.pod)
        if done:
            self.dirty = True
        self._settle()
        return done

    def fail_pod(self, uid: str) -> None:
        """End a pending pod as Failed (a replay drops pods that did not fit)."""
        record = self._live.pop(uid, None)
        if record is not None:
            record.pod = replace(record.pod, phase=PodPhase.FAILED)
            record.finished_at = self.now
            self._release_claims(record.pod)
            self.dirty = True

    def _release_claims(self, pod: Pod) -> None:
        if self.claims is not None:
            self.claims.release(pod)

    def _ends(self) -> list[float]:
        """When running pods complete and evicted pods leave."""
        ends = []
        for r in self._live.values():
            end = r.finishes_at
            if r.leaves_at is not None:
                end = r.leaves_at if end is None else min(end, r.leaves_at)
            if end is not None:
                ends.append(end)
        return ends

    def next_completion(self) -> float | None:
        """The earliest time a running pod completes or an evicted one leaves (None: never)."""
        return min(self._ends(), default=None)

    def last_completion(self) -> float | None:
        """The latest time a running pod completes or an evicted one leaves (None: never)."""
        return max(self._ends(), default=None)

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
        dra = None
        if self.claims is not None:
            from scheduler.cache.dra_usage import with_claim_gpus

            dra = self.claims.view(p for p in pods if p.pending)
            pods = with_claim_gpus(pods, dra)  # GPU-class devices count toward queues, as live
        return Snapshot(
            nodes=self.nodes,
            pods=pods,
            gangs=gangs,
            queues=self.queues,
            now=self.now,
            restoring=self.restoring.current(self.now) & live,
            dra=dra,
        )

    def queue_gpu(self) -> dict[str, tuple[int, int]]:
        """Per queue: GPU thousandths (held by bound, nominated and terminating pods; requested
        by pods still waiting)."""
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
        """Evict the victims, then bind every placed gang as a unit (or hold it while its
        victims terminate); remember why the other gangs wait."""
        by_gang: dict[str, dict[str, PodAssignment]] = defaultdict(dict)
        for a in placement.assignments:
            by_gang[a.gang][a.pod_uid] = a
        for outcome in placement.outcomes.values():
            for a in outcome.pods:
                by_gang[outcome.gang].setdefault(a.pod_uid, a)
        evicting = {e.pod_uid for e in placement.evictions}
        moves = {
            uid: a for items in by_gang.values() for uid, a in items.items() if uid in evicting
        }
        moved = self._evict(placement.evictions, moves)
        bound_gangs: list[str] = []
        failed_gangs: list[str] = []
        bound_pods = failed_pods = 0
        # Placed gangs, then assignments without an outcome (extra pods of running gangs,
        # pods moved by consolidation): each a unit, like the live commit.
        todo: list[tuple[str, bool]] = []
        for key, outcome in placement.outcomes.items():
            record = self.gangs.get(key)
            if record is None:
                log.warning("unknown_gang_in_placement", gang=key)
                continue
            if not outcome.placed:
                record.last_reason = (outcome.reason_code, outcome.reason)
                record.first_reason = record.first_reason or record.last_reason
                record.waited_cycles += 1
                by_gang.pop(key, None)
                continue
            todo.append((key, True))
        todo += [(key, False) for key in by_gang if key not in placement.outcomes]
        for key, has_outcome in todo:
            record = self.gangs.get(key)
            items = by_gang.pop(key, {})
            if record is None:
                log.warning("unknown_gang_in_placement", gang=key)
                continue
            assignments = [
                replace(a, pod_uid=moved[a.pod_uid], pod_key=self.pods[moved[a.pod_uid]].pod.key)
                if a.pod_uid in moved
                else a
                for a in items.values()
            ]
            if not assignments:
                continue
            problem = self._bind_problem(assignments)
            victims = tuple(placement.waits_for.get(key, ()))
            if not problem and victims:
                problem = self._victims_problem(victims)
            if problem:
                # Nothing of the gang is bound: all or nothing, like the live commit.
                log.warning("gang_bind_failed", gang=key, reason=problem)
                record.failed_binds += 1
                record.last_reason = ("BindFailed", problem)
                failed_gangs.append(key)
                failed_pods += len(assignments)
                continue
            if not has_outcome:
                log.debug("extra_pods_placed", gang=key, pods=len(assignments))
            if victims and not self._all_gone(victims):
                self._hold(Nomination(key, assignments, victims, self.now))
                continue
            self._bind(key, assignments)
            bound_gangs.append(key)
            bound_pods += len(assignments)
        if bound_pods or placement.evictions:
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
        if self.claims is not None:
            return self.claims.problem(assignments)
        return ""

    def _victims_problem(self, victims: Sequence[str]) -> str:
        """A nomination may only wait for pods that are leaving: a victim still running and
        not evicted would hold it forever."""
        for uid in victims:
            record = self._live.get(uid)
            if record is not None and record.eviction is None:
                return f"waits for pod {record.pod.key}, which is not being evicted"
        return ""

    def _all_gone(self, victims: Iterable[str]) -> bool:
        return all(uid not in self._live for uid in victims)

    # --- binding and nominations --------------------------------------------------------------

    def _bind(self, key: str, assignments: Sequence[PodAssignment]) -> None:
        record = self.gangs[key]
        for a in assignments:
            pod_record = self.pods[a.pod_uid]
            pod_record.pod = replace(
                pod_record.pod,
                node_name=a.node,
                gpu_grant=a.gpu_grant,
                phase=PodPhase.RUNNING,
                start_time=self.now,
                nominated=False,
            )
            pod_record.bound_at = self.now
            if self.claims is not None and a.claims:
                self.claims.bind(pod_record.pod, a.claims)
        if record.placed_at is None:
            record.placed_at = self.now
        if record.first_placed_at is None:
            record.first_placed_at = self.now
        record.last_reason = None
        self.restoring.bound(key)
        log.debug("gang_bound", gang=key, queue=record.gang.queue, pods=len(assignments))

    def _hold(self, nomination: Nomination) -> None:
        """Show the gang's pods on their nodes (holding the space) until the victims leave."""
        for a in nomination.assignments:
            pod_record = self.pods[a.pod_uid]
            pod_record.pod = replace(
                pod_record.pod, node_name=a.node, gpu_grant=a.gpu_grant, nominated=True
            )
            if self.claims is not None and a.claims:  # the devices are held from now on
                self.claims.bind(pod_record.pod, a.claims)
        self.nominations[nomination.gang] = nomination
        waiting = sum(1 for uid in nomination.victims if uid in self._live)
        self.gangs[nomination.gang].last_reason = (
            NOMINATED,
            f"placed; waiting for {waiting} evicted pod(s) to terminate",
        )
        log.debug("gang_nominated", gang=nomination.gang, victims=len(nomination.victims))

    def _settle(self) -> None:
        """Evicted pods whose grace period is over leave; ready nominations are bound."""
        leaving = [
            r for r in self._live.values() if r.leaves_at is not None and r.leaves_at <= self.now
        ]
        for record in sorted(leaving, key=lambda r: (r.leaves_at or 0.0, r.pod.uid)):
            self._leave(record)
        for key, nomination in list(self.nominations.items()):
            if self._all_gone(nomination.victims):
                del self.nominations[key]
                self._bind(key, nomination.assignments)
                self.dirty = True

    # --- evictions ----------------------------------------------------------------------------

    def _evict(
        self, evictions: Sequence[Eviction], moves: dict[str, PodAssignment]
    ) -> dict[str, str]:
        """Start terminating every victim; returns victim uid -> replacement uid for the pods
        that are placed elsewhere in the same placement (their replacements exist at once)."""
        if not evictions:
            return {}
        moved: dict[str, str] = {}
        restarted: dict[str, Eviction] = {}
        for e in evictions:
            record = self._live.get(e.pod_uid)
            if record is None or not record.pod.bound or record.pod.nominated:
                log.warning("eviction_of_a_pod_not_running", pod=e.pod_key, gang=e.gang)
                continue
            if record.eviction is not None:
                continue  # already terminating
            grace = self.termination_grace if record.grace is None else record.grace
            record.eviction = e
            record.leaves_at = self.now + grace
            record.pod = replace(record.pod, deleting=True)
            evicted = EvictionRecord(self.now, e, pod_queue_usage(record.pod)["gpu"])
            self.evictions.append(evicted)
            gang = self.gangs.get(record.pod.gang)
            if gang is not None:
                gang.evictions.append(evicted)
                if e.action != "shrink":
                    restarted.setdefault(gang.gang.key, e)
                if e.action == "consolidate" and e.pod_uid not in moves:
                    self.restoring.moved([gang.gang.key], self.now)
            beneficiary = self.gangs.get(e.for_gang)
            if beneficiary is not None:
                beneficiary.made_room.append(evicted)
            log.debug("pod_evicted", pod=e.pod_key, gang=e.gang, action=e.action, node=e.node)
            if e.pod_uid in moves:
                moved[e.pod_uid] = self._replace(record)
        for key, e in restarted.items():
            gang = self.gangs[key]
            still_running = any(
                (r := self.pods[uid]).pod.bound and r.pod.active and r.eviction is None
                for uid in gang.pod_uids
            )
            if still_running:
                continue
            gang.restarts += 1
            gang.restarted_at = self.now
            gang.placed_at = None
            gang.first_reason = None
            gang.last_reason = (EVICTED, e.message or f"evicted ({e.action}) for {e.for_gang}")
        self._settle()
        return moved

    def _leave(self, record: PodRecord) -> None:
        """An evicted pod is gone: Failed, and (unless already) replaced by a new pending pod."""
        record.finished_at = record.leaves_at
        record.pod = replace(record.pod, phase=PodPhase.FAILED)
        self._live.pop(record.pod.uid, None)
        self._release_claims(record.pod)
        if record.replaced_by is None:
            self._replace(record)
        self.dirty = True

    def _replace(self, record: PodRecord) -> str:
        """Create the pod that the job makes in place of an evicted one: same gang and spec,
        a new uid and name, pending, running its whole duration again once bound."""
        old = record.pod
        generation = record.generation + 1
        base = record.base_name or old.name
        name = f"{base}-r{generation}"
        while f"{old.namespace}/{name}" in self.pods:
            generation += 1
            name = f"{base}-r{generation}"
        pod = replace(
            old,
            uid=f"{old.namespace}/{name}",
            name=name,
            node_name=None,
            gpu_grant=(),
            phase=PodPhase.PENDING,
            deleting=False,
            nominated=False,
            start_time=0.0,
            creation_time=self.now,
        )
        new = PodRecord(
            pod,
            self.now,
            record.duration,
            grace=record.grace,
            replaces=old.uid,
            base_name=base,
            generation=generation,
        )
        record.replaced_by = pod.uid
        self.pods[pod.uid] = new
        self._live[pod.uid] = new
        if self.claims is not None:
            self.claims.replaced(old, pod)
        gang = self.gangs.get(pod.gang)
        if gang is not None:
            gang.pod_uids.append(pod.uid)
        self.dirty = True
        return pod.uid
