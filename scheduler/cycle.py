"""One scheduling cycle: snapshot -> fair share -> solve -> commit, returning a report.

The cycle is the same for every backend; a backend is where snapshots come from and where
decisions go: the Kubernetes API in production (:mod:`scheduler.commit` + :mod:`scheduler.cache`),
an in-memory cluster in ``kai-scheduler simulate``. Solving runs in a worker thread:
CP-SAT releases the GIL, so the event loop keeps serving watches and probes meanwhile.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from scheduler.cluster.snapshot import Snapshot
from scheduler.fairness import FairShareReport, compute_fair_shares
from scheduler.plugins.scorer_memory import ScorerMemory
from scheduler.solver import solve
from scheduler.solver.placement import GangOutcome, Placement, PlacementSettings

__all__ = ["Backend", "CommitResult", "CycleReport", "run_cycle", "with_findings"]

log = structlog.get_logger("scheduler.cycle")


@dataclass(frozen=True)
class CommitResult:
    """What the backend did with a placement."""

    #: Gang keys whose every assigned pod was bound.
    bound_gangs: tuple[str, ...] = ()
    #: Gang keys whose binding failed and was rolled back (requeued for the next cycle).
    failed_gangs: tuple[str, ...] = ()
    bound_pods: int = 0
    failed_pods: int = 0
    #: Pods whose binds were started and finish in the background (the live backend).
    dispatched_pods: int = 0


class Backend(Protocol):
    """Where a cycle reads the cluster and writes its decisions."""

    async def snapshot(self) -> Snapshot:
        """An immutable view of the cluster for this cycle."""
        ...

    async def commit(
        self, snapshot: Snapshot, placement: Placement, report: FairShareReport
    ) -> CommitResult:
        """Bind placed gangs (each as a unit), report why others wait, publish queue status."""
        ...


@dataclass(frozen=True)
class CycleReport:
    """The outcome of one cycle, for logs, metrics and the simulator."""

    number: int
    snapshot: Snapshot
    placement: Placement
    fair_share: FairShareReport
    commit: CommitResult
    seconds: float
    solve_seconds: float
    pending_gangs: int = 0
    timings: dict[str, float] = field(default_factory=dict)


def _decide(
    snapshot: Snapshot,
    settings: PlacementSettings,
    max_gangs: int | None = None,
    scorers: ScorerMemory | None = None,
) -> tuple[FairShareReport, Placement]:
    report = compute_fair_shares(snapshot)
    placement = solve(snapshot, settings, report, max_gangs=max_gangs, scorers=scorers)
    return report, with_findings(snapshot, report, placement)


def with_findings(snapshot: Snapshot, report: FairShareReport, placement: Placement) -> Placement:
    """``placement`` with an outcome for every gang that waits for a reason found before
    solving (``report.gang_findings``) but has no pending pod for the solver to report on: a
    gang whose every waiting pod is gated. Its PodGroup then says ``SchedulingGated`` and
    names the gates; its pods are left alone (the API server marks gated pods itself)."""
    missing = [k for k in report.gang_findings if k not in placement.outcomes]
    if not missing:
        return placement
    outcomes = dict(placement.outcomes)
    for key in missing:
        gang = snapshot.gang_by_key.get(key)
        code, message = report.gang_findings[key]
        outcomes[key] = GangOutcome(key, gang.queue if gang else "", False, (), code, message)
    return dataclasses.replace(placement, outcomes=outcomes)


async def run_cycle(
    backend: Backend,
    settings: PlacementSettings,
    number: int,
    *,
    max_gangs: int | None = None,
    scorers: ScorerMemory | None = None,
) -> CycleReport:
    """Run one cycle against ``backend``; ``max_gangs`` bounds the gangs it considers (see
    :func:`scheduler.solver.solve`), the rest are in ``placement.deferred``. A caller that
    runs cycle after cycle passes one ``scorers`` to all of them (see :func:`solve`)."""
    started = time.perf_counter()
    snapshot = await backend.snapshot()
    t_snap = time.perf_counter()
    report, placement = await asyncio.to_thread(_decide, snapshot, settings, max_gangs, scorers)
    t_solve = time.perf_counter()
    result = await backend.commit(snapshot, placement, report)
    finished = time.perf_counter()
    pending = len(placement.outcomes)
    log.info(
        "cycle",
        cycle=number,
        pending_gangs=pending,
        placed_gangs=sum(1 for o in placement.outcomes.values() if o.placed),
        bound_pods=result.bound_pods,
        dispatched_pods=result.dispatched_pods,
        failed_pods=result.failed_pods,
        status=str(placement.status),
        seconds=round(finished - started, 4),
        **({"deferred_gangs": len(placement.deferred)} if placement.deferred else {}),
    )
    return CycleReport(
        number=number,
        snapshot=snapshot,
        placement=placement,
        fair_share=report,
        commit=result,
        seconds=finished - started,
        solve_seconds=t_solve - t_snap,
        pending_gangs=pending,
        timings={
            "snapshot": t_snap - started,
            "decide": t_solve - t_snap,
            "commit": finished - t_solve,
        },
    )
