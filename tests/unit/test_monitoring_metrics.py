"""The metrics behind the dashboard and alerts (scheduler/metrics.py): gangs left waiting by
reason, the longest wait per queue, the last cycle's time, the Lease's transitions, process
metrics; observed from a simulated cycle the way the runner observes a live one."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from scheduler.cluster.gang import Gang
from scheduler.cluster.node import Node
from scheduler.cluster.pod import Pod
from scheduler.cluster.resources import GPU, Resources
from scheduler.cluster.snapshot import Snapshot
from scheduler.metrics import SchedulerMetrics
from scheduler.solver.placement import GangOutcome
from tests.monitoring.assets import simulated_cycle

__all__: list[str] = []

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _samples(metrics: SchedulerMetrics) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(metrics.render().decode())
        for s in f.samples
    }


def _value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def _snapshot(now: float) -> Snapshot:
    gangs = (
        Gang("ns", "a", queue="q1"),
        Gang("ns", "b", queue="q1"),
        Gang("ns", "c", queue="q2", creation_time=40.0),
        Gang("ns", "d", queue="q2"),
    )
    pods = (
        Pod("ns/a0", "ns", "a0", Resources({GPU: 1}), gang="ns/a", queue="q1", creation_time=70.0),
        Pod("ns/a1", "ns", "a1", Resources({GPU: 1}), gang="ns/a", queue="q1", creation_time=10.0),
        Pod("ns/b0", "ns", "b0", Resources({GPU: 1}), gang="ns/b", queue="q1", creation_time=90.0),
        Pod("ns/d0", "ns", "d0", Resources({GPU: 1}), gang="ns/d", queue="q2", creation_time=0.0),
    )
    return Snapshot(nodes=(Node("n", Resources({GPU: 8})),), pods=pods, gangs=gangs, now=now)


def _outcomes(*, d_placed: bool) -> dict[str, GangOutcome]:
    return {
        "ns/a": GangOutcome("ns/a", "q1", False, (), "GangDoesNotFit", "no room"),
        "ns/b": GangOutcome("ns/b", "q1", False, (), "GangDoesNotFit", "no room"),
        # Every pod gated: no pending pod, so the wait starts at the gang's creation.
        "ns/c": GangOutcome("ns/c", "q2", False, (), "SchedulingGated", "gated"),
        "ns/d": GangOutcome("ns/d", "q2", d_placed, (), "" if d_placed else "OverQuota", ""),
    }


def test_waiting_gangs_are_counted_by_queue_and_reason_with_the_longest_wait() -> None:
    metrics = SchedulerMetrics()
    metrics.observe_waiting(_snapshot(now=100.0), _outcomes(d_placed=True))
    got = _samples(metrics)
    reason = "kai_pending_gangs_by_reason"
    assert _value(got, reason, queue="q1", reason="GangDoesNotFit") == 2
    assert _value(got, reason, queue="q2", reason="SchedulingGated") == 1
    assert _value(got, reason, queue="q2", reason="OverQuota") is None  # d was placed
    wait = "kai_pending_gang_max_wait_seconds"
    assert _value(got, wait, queue="q1") == 90.0  # a's oldest pending pod, created at 10
    assert _value(got, wait, queue="q2") == 60.0  # c: no pending pod, created at 40


def test_series_drop_to_zero_when_the_gangs_stop_waiting() -> None:
    metrics = SchedulerMetrics()
    snap = _snapshot(now=100.0)
    metrics.observe_waiting(snap, _outcomes(d_placed=False))
    assert _value(_samples(metrics), "kai_pending_gangs_by_reason", queue="q2", reason="OverQuota")
    metrics.observe_waiting(snap, {"ns/b": _outcomes(d_placed=False)["ns/b"]})
    got = _samples(metrics)
    assert _value(got, "kai_pending_gangs_by_reason", queue="q1", reason="GangDoesNotFit") == 1
    assert _value(got, "kai_pending_gangs_by_reason", queue="q2", reason="OverQuota") == 0
    assert _value(got, "kai_pending_gangs_by_reason", queue="q2", reason="SchedulingGated") == 0
    assert _value(got, "kai_pending_gang_max_wait_seconds", queue="q1") == 10.0  # b alone
    assert _value(got, "kai_pending_gang_max_wait_seconds", queue="q2") == 0.0


def test_a_simulated_cycle_exports_reasons_waits_and_the_cycle_time() -> None:
    before = time.time()
    metrics, report = simulated_cycle()
    got = _samples(metrics)
    waiting = {k: o.reason_code for k, o in report.placement.outcomes.items() if not o.placed}
    assert waiting == {"ns/big": "NodeTooSmall", "ns/short": "GangIncomplete"}
    for code in waiting.values():
        assert _value(got, "kai_pending_gangs_by_reason", queue="team-b", reason=code) == 1
    assert _value(got, "kai_pending_gang_max_wait_seconds", queue="team-b") == 100.0
    assert _value(got, "kai_cycles_total") == 1
    last = _value(got, "kai_last_cycle_timestamp_seconds")
    assert last is not None and before <= last <= time.time()
    assert _value(got, "kai_queue_fair_share", queue="team-a", resource="gpu") == 2.0
    start = _value(got, "process_start_time_seconds")
    assert start is not None and 0 < start <= before


def test_lease_transitions_are_exported_once_seen() -> None:
    metrics = SchedulerMetrics()
    name = "kai_leader_lease_transitions"
    assert not [k for k in _samples(metrics) if k[0] == name]  # nothing before the first read
    metrics.observe_lease("kai-scheduler/kai-scheduler", 3)
    assert _value(_samples(metrics), name, lease="kai-scheduler/kai-scheduler") == 3
