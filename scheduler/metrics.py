"""Prometheus metrics of the scheduler service (served on ``/metrics`` by :mod:`.health`).

Every metric lives in one :class:`SchedulerMetrics` with its own registry, so tests and two
schedulers in one process never collide on the global default registry.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from scheduler.cluster.node import GPU_MILLI
from scheduler.cluster.queue import QUEUE_RESOURCES
from scheduler.cluster.snapshot import Snapshot
from scheduler.fairness import FairShareReport

if TYPE_CHECKING:
    from scheduler.cycle import CycleReport
    from scheduler.solver.placement import GangOutcome

__all__ = ["EVICTION_FAILURE_REASONS", "SchedulerMetrics", "queue_units"]

#: The ``reason`` label values of ``kai_eviction_failures_total``.
EVICTION_FAILURE_REASONS = ("pdb", "error", "not_leader", "timeout")

_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def queue_units(resource: str, amount: int) -> float:
    """Scheduler units (gpu milli, cpu milli, bytes) to the CRD's (devices, millicores, MB)."""
    if resource == "gpu":
        return amount / GPU_MILLI
    if resource == "memory":
        return amount / 10**6
    return float(amount)


class SchedulerMetrics:
    """The scheduler's metrics, registered on :attr:`registry`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.cycle_seconds = Histogram(
            "kai_cycle_duration_seconds",
            "Duration of one scheduling cycle.",
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.solve_seconds = Histogram(
            "kai_solve_duration_seconds",
            "Duration of fair share plus placement solving.",
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.cycles = Counter("kai_cycles", "Scheduling cycles run.", registry=r)
        # A timestamp, not only a counter: `kai-scheduler doctor` reads the age of the last
        # cycle from one scrape (a counter needs two, spaced by more than a cycle).
        self.last_cycle = Gauge(
            "kai_last_cycle_timestamp_seconds",
            "Unix time at which the last scheduling cycle finished (0 before the first).",
            registry=r,
        )
        self.pending_pods = Gauge(
            "kai_pending_pods", "Pods waiting for a node, per queue.", ["queue"], registry=r
        )
        self.pending_gangs = Gauge(
            "kai_pending_gangs", "Gangs waiting to be placed, per queue.", ["queue"], registry=r
        )
        self.pending_gangs_by_reason = Gauge(
            "kai_pending_gangs_by_reason",
            "Gangs left waiting by the last cycle, per queue and reason code (the reason of "
            "their PodGroup's Unschedulable condition and Events).",
            ["queue", "reason"],
            registry=r,
        )
        self.pending_gang_wait = Gauge(
            "kai_pending_gang_max_wait_seconds",
            "How long the longest-waiting gang of a queue left waiting by the last cycle has "
            "waited, since its oldest pending pod was created (0 when none waits).",
            ["queue"],
            registry=r,
        )
        self.binds = Counter("kai_binds", "Pods bound to a node.", registry=r)
        self.bind_failures = Counter(
            "kai_bind_failures", "Bind attempts that failed for good.", registry=r
        )
        self.evictions = Counter(
            "kai_evictions",
            "Pods evicted, by why (reclaim, preempt, consolidate, shrink, stale_gang) and the "
            "queue of the evicted pod.",
            ["action", "queue"],
            registry=r,
        )
        self.eviction_failures = Counter(
            "kai_eviction_failures",
            "Evictions that did not happen (pdb: refused by a PodDisruptionBudget; error; "
            "not_leader), and plans dropped because evicted pods did not go in time (timeout).",
            ["reason"],
            registry=r,
        )
        for reason in EVICTION_FAILURE_REASONS:  # exported as 0 before the first one
            self.eviction_failures.labels(reason=reason)
        self.nominated_pods = Gauge(
            "kai_nominated_pods",
            "Pods holding a place on a node while the pods evicted for them terminate.",
            registry=r,
        )
        self.queue_allocated = Gauge(
            "kai_queue_allocated",
            "Resources held by a queue (gpu devices, cpu millicores, memory MB).",
            ["queue", "resource"],
            registry=r,
        )
        self.queue_fair_share = Gauge(
            "kai_queue_fair_share",
            "Fair share of a queue (gpu devices, cpu millicores, memory MB).",
            ["queue", "resource"],
            registry=r,
        )
        self.queue_requested = Gauge(
            "kai_queue_requested",
            "Resources a queue holds plus what its pending pods ask for.",
            ["queue", "resource"],
            registry=r,
        )
        self.loop_lag = Histogram(
            "kai_event_loop_lag_seconds",
            "How late the event loop woke a 50 ms timer (solving must not stall the loop).",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=r,
        )
        self.leader = Gauge(
            "kai_leader", "1 while this replica holds the leader lease.", registry=r
        )
        # Read from the Lease, so it survives the restarts a flapping leader goes through
        # (a replica that loses the Lease exits); absent until this replica has read it.
        self.lease_transitions = Gauge(
            "kai_leader_lease_transitions",
            "spec.leaseTransitions of the leader Lease as this replica last saw it (how often "
            "the leader changed hands).",
            ["lease"],
            registry=r,
        )
        self.binds_in_flight = Gauge(
            "kai_binds_in_flight",
            "Gangs whose binds were started and have not finished (binding streams).",
            registry=r,
        )
        self.assumed_pods = Gauge(
            "kai_assumed_pods",
            "Pods counted as bound whose bind the watch has not confirmed yet.",
            registry=r,
        )
        self.read_backs = Counter(
            "kai_assumed_pod_read_backs",
            "Assumed pods read back from the API because the watch did not confirm them.",
            registry=r,
        )
        self.watch_restarts = Counter(
            "kai_watch_restarts",
            "Watches that ended abnormally and were resumed or relisted, by kind.",
            ["kind"],
            registry=r,
        )
        # process_start_time_seconds etc.: the no-cycle alert waits a minute after a start.
        ProcessCollector(registry=r)
        self._queues: set[str] = set()
        self._waiting: set[tuple[str, str]] = set()
        self._waiting_queues: set[str] = set()

    def observe_cycle(self, seconds: float, solve_seconds: float) -> None:
        """Record the durations of one cycle."""
        self.cycles.inc()
        self.last_cycle.set_to_current_time()
        self.cycle_seconds.observe(seconds)
        self.solve_seconds.observe(solve_seconds)

    def observe_pending(self, snapshot: Snapshot, pending_gangs: Iterable[str]) -> None:
        """Set pending pods and gangs per queue from this cycle's snapshot."""
        pods = Tally(
            snapshot.gang_by_key[p.gang].queue if p.gang in snapshot.gang_by_key else p.queue
            for p in snapshot.pods
            if p.pending
        )
        gangs = Tally(
            snapshot.gang_by_key[g].queue for g in pending_gangs if g in snapshot.gang_by_key
        )
        queues = set(pods) | set(gangs) | self._queues | {q.name for q in snapshot.queues}
        for q in queues:
            self.pending_pods.labels(queue=q).set(pods.get(q, 0))
            self.pending_gangs.labels(queue=q).set(gangs.get(q, 0))
        self._queues = {q for q in queues if pods.get(q) or gangs.get(q)}

    def observe_waiting(self, snapshot: Snapshot, outcomes: Mapping[str, GangOutcome]) -> None:
        """Set gangs left waiting per queue and reason, and the longest wait per queue.

        A gang's wait starts at the creation of its oldest pending pod (a gang whose pods
        were evicted and recreated waits anew), or at its own creation when no pod is
        pending (every pod gated). Series that drop to 0 are exported as 0 once more, then
        no longer updated (as :meth:`observe_pending` does)."""
        counts: Tally[tuple[str, str]] = Tally()
        waits: dict[str, float] = {}
        for key, outcome in outcomes.items():
            if outcome.placed:
                continue
            gang = snapshot.gang_by_key.get(key)
            queue = outcome.queue or (gang.queue if gang else "")
            counts[queue, outcome.reason_code or "Unknown"] += 1
            pods = snapshot.pending_by_gang.get(key)
            since = pods[0].creation_time if pods else gang.creation_time if gang else None
            if since is not None:
                waits[queue] = max(waits.get(queue, 0.0), snapshot.now - since)
        for queue, reason in set(counts) | self._waiting:
            self.pending_gangs_by_reason.labels(queue, reason).set(counts.get((queue, reason), 0))
        for queue in set(waits) | self._waiting_queues | {q for q, _ in counts}:
            self.pending_gang_wait.labels(queue).set(max(0.0, waits.get(queue, 0.0)))
        self._waiting = set(counts)
        self._waiting_queues = {q for q, _ in counts}

    def observe_lease(self, lease: str, transitions: int) -> None:
        """Record the Lease's ``spec.leaseTransitions`` (``lease`` is ``namespace/name``)."""
        self.lease_transitions.labels(lease=lease).set(transitions)

    def observe_report(self, report: CycleReport) -> None:
        """Everything one finished cycle tells: durations, pending work, fair shares."""
        self.observe_cycle(report.seconds, report.solve_seconds)
        # Gangs a budgeted cycle left for the next one are pending too.
        pending = [*report.placement.outcomes, *report.placement.deferred]
        self.observe_pending(report.snapshot, pending)
        self.observe_waiting(report.snapshot, report.placement.outcomes)
        self.observe_fair_share(report.fair_share)

    def observe_fair_share(self, report: FairShareReport) -> None:
        """Set allocated, requested and fair share of every queue."""
        for name, status in report.queues.items():
            for res in QUEUE_RESOURCES:
                self.queue_allocated.labels(name, res).set(
                    queue_units(res, status.allocated.get(res, 0))
                )
                self.queue_fair_share.labels(name, res).set(
                    queue_units(res, status.fair_share.get(res, 0))
                )
                self.queue_requested.labels(name, res).set(
                    queue_units(res, status.requested.get(res, 0))
                )

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
