"""The simulated-time loop: arrivals, a scheduling cycle every period, completions.

Time moves on the cycle grid (0, period, 2*period, ...). At each grid point the cluster first
finishes pods whose run time is up and creates the jobs that have arrived; then, if anything
changed since the last cycle and some gang waits, one :func:`scheduler.cycle.run_cycle` runs.
When nothing changed, a cycle would see exactly the same snapshot as the last one, so the
loop jumps straight to the grid point of the next arrival or completion - long idle stretches
cost nothing, and the outcome is the same as running every cycle. An evicted pod leaving at the
end of its termination grace period is such an event too: its replacement arrives, and the
gang nominated in its place is bound.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from scheduler.cycle import CycleReport, run_cycle
from scheduler.fairness import FairShareReport, compute_fair_shares
from scheduler.plugins.scorer_memory import ScorerMemory
from scheduler.simulate.backend import SimulatedCluster
from scheduler.simulate.scenario import Scenario

__all__ = ["MAX_SIMULATED_SECONDS", "Sample", "SimulationResult", "simulate", "simulate_async"]

#: Without an end time, a run stops after this much simulated time even if work remains.
MAX_SIMULATED_SECONDS = 30 * 24 * 3600.0
#: Safety net against a scenario that keeps the scheduler busy forever.
MAX_CYCLES = 200_000

#: ``progress(simulated_now, horizon)`` - called after every step; horizon may grow.
ProgressFn = Callable[[float, float], None]


@dataclass(frozen=True)
class Sample:
    """The cluster at one point in simulated time (for plots and the timeline)."""

    time: float
    #: Per queue: GPU thousandths held by bound pods.
    allocated_gpu: dict[str, int]
    #: Per queue: GPU thousandths asked for by pods that arrived and still wait.
    waiting_gpu: dict[str, int]
    #: Per queue: fair share of GPU thousandths at the last cycle (empty before the first).
    fair_share_gpu: dict[str, int]


@dataclass
class SimulationResult:
    """Everything a run produced: final state, per-gang records, samples over time."""

    scenario: Scenario
    cluster: SimulatedCluster
    end_time: float
    cycles: int
    #: Fair share computed on the final state (requested / allocated / fair share per queue).
    final_report: FairShareReport
    samples: list[Sample] = field(default_factory=list)
    #: Solver status -> number of cycles that ended with it.
    solver_status: Counter[str] = field(default_factory=Counter)
    wall_seconds: float = 0.0
    solve_seconds: float = 0.0
    #: Why the run stopped: "end" (settings.end), "idle" (nothing more can change), "limit".
    stopped: str = "idle"


def _sample(cluster: SimulatedCluster, fair: dict[str, int]) -> Sample:
    usage = cluster.queue_gpu()
    return Sample(
        time=cluster.now,
        allocated_gpu={q: a for q, (a, _) in usage.items()},
        waiting_gpu={q: w for q, (_, w) in usage.items()},
        fair_share_gpu=dict(fair),
    )


def _grid(t: float, period: float) -> float:
    """The first cycle time at or after ``t``."""
    return math.ceil(t / period - 1e-9) * period


async def simulate_async(
    scenario: Scenario, *, progress: ProgressFn | None = None
) -> SimulationResult:
    """Run ``scenario`` to its end time (or until nothing more can change)."""
    settings = scenario.settings
    period = settings.cycle_period
    cluster = SimulatedCluster(
        scenario.nodes,
        scenario.queues,
        termination_grace=settings.termination_grace,
        dra=scenario.dra,
        claim_templates=scenario.claim_templates,
    )
    arrivals = sorted(scenario.jobs, key=lambda j: j.at)
    next_job = 0
    end = settings.end
    horizon_cap = end if end is not None else MAX_SIMULATED_SECONDS
    result = SimulationResult(
        scenario=scenario,
        cluster=cluster,
        end_time=0.0,
        cycles=0,
        final_report=compute_fair_shares(cluster.snapshot_now()),
    )
    fair: dict[str, int] = {}
    scorers = ScorerMemory()  # one per run: cycles reuse the scorer's measured states
    started = time.perf_counter()
    t = 0.0
    while True:
        cluster.advance(t)
        while next_job < len(arrivals) and arrivals[next_job].at <= t + 1e-9:
            job = arrivals[next_job]
            cluster.add_pods(
                job.pods, job.gangs, duration=job.duration, grace=job.grace, claims=job.claims
            )
            next_job += 1
        report: CycleReport | None = None
        if cluster.dirty and cluster.pending_gangs():
            result.cycles += 1
            report = await run_cycle(cluster, settings.placement, result.cycles, scorers=scorers)
            result.solver_status[str(report.placement.status)] += 1
            result.solve_seconds += report.solve_seconds
            fair = {
                name: s.fair_share.get("gpu", 0) for name, s in report.fair_share.queues.items()
            }
        result.samples.append(_sample(cluster, fair))
        if progress is not None:
            upcoming = arrivals[-1].at if arrivals else 0.0
            progress(t, min(horizon_cap, max(upcoming, cluster.last_completion() or 0.0, t)))

        # Where to go next: the next cycle if the last one changed the cluster, else the next
        # arrival, completion or departure of an evicted pod (nothing else can make a waiting
        # gang fit).
        candidates = []
        if cluster.dirty and cluster.pending_gangs():
            candidates.append(t + period)
        if next_job < len(arrivals):
            candidates.append(_grid(arrivals[next_job].at, period))
        completion = cluster.next_completion()
        if completion is not None:
            candidates.append(_grid(completion, period))
        nxt = max(min(candidates), t + period) if candidates else None
        if result.cycles >= MAX_CYCLES:
            result.stopped = "limit"
            break
        if end is not None and t >= end:
            result.stopped = "end"
            break
        if nxt is None:
            if end is None:
                result.stopped = "idle"
                break
            nxt = end  # show the state at the requested end time
        if end is not None and nxt > end:
            nxt = end
        if end is None and nxt > MAX_SIMULATED_SECONDS:
            result.stopped = "limit"
            break
        t = nxt
    result.end_time = cluster.now
    result.final_report = compute_fair_shares(cluster.snapshot_now())
    result.wall_seconds = time.perf_counter() - started
    return result


def simulate(scenario: Scenario, *, progress: ProgressFn | None = None) -> SimulationResult:
    """Synchronous wrapper around :func:`simulate_async` (its own event loop)."""
    return asyncio.run(simulate_async(scenario, progress=progress))
