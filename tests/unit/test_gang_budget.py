"""A cycle's gang budget (``solve(max_gangs=...)``, the live loop's ``firstCycleMaxGangs``):
only the first gangs in admission order are considered; the rest are deferred, untouched."""

from __future__ import annotations

from scheduler.cluster import CPU, GPU, PODS, GpuRequest, Node, Pod, Queue, Resources, Snapshot
from scheduler.cluster.gang import Gang
from scheduler.config import parse_config
from scheduler.cycle import _decide
from scheduler.solver import PlacementSettings, solve


def backlog(count: int) -> Snapshot:
    nodes = tuple(Node(f"n{i}", Resources({CPU: 64000, GPU: 8, PODS: 110})) for i in range(4))
    pods, gangs = [], []
    for i in range(count):
        # Higher priority for the later ones: admission order is not creation order.
        priority = 10 if i >= count - 3 else 0
        pods.append(
            Pod(
                f"u{i}", "ns", f"p{i}", Resources({CPU: 100, GPU: 1}), gpu=GpuRequest(1),
                gang=f"ns/p{i}", queue="q", priority=priority, creation_time=float(i),
            )
        )  # fmt: skip
        gangs.append(
            Gang("ns", f"p{i}", queue="q", priority=priority, implicit=True, creation_time=i)
        )
    return Snapshot(nodes=nodes, pods=tuple(pods), gangs=tuple(gangs), queues=(Queue("q"),))


def test_only_the_first_gangs_in_admission_order_are_considered() -> None:
    snapshot = backlog(12)
    placement = solve(snapshot, PlacementSettings(), max_gangs=5)
    considered = set(placement.outcomes)
    assert len(considered) == 5 and all(o.placed for o in placement.outcomes.values())
    # The three high-priority gangs come first, then the oldest.
    assert considered == {"ns/p9", "ns/p10", "ns/p11", "ns/p0", "ns/p1"}
    assert placement.deferred == frozenset(f"ns/p{i}" for i in range(2, 9))
    assert not considered & placement.deferred
    assert {a.gang for a in placement.assignments} == considered


def test_no_budget_or_a_budget_above_the_backlog_defers_nothing() -> None:
    snapshot = backlog(6)
    for budget in (None, 6, 100):
        placement = solve(snapshot, PlacementSettings(), max_gangs=budget)
        assert placement.deferred == frozenset()
        assert len(placement.outcomes) == 6


def test_the_cycle_passes_the_budget_and_the_config_reads_it() -> None:
    _, placement = _decide(backlog(8), PlacementSettings(), 2)
    assert len(placement.outcomes) == 2 and len(placement.deferred) == 6
    assert parse_config({"firstCycleMaxGangs": 0}).first_cycle_max_gangs == 0
    assert parse_config({}).first_cycle_max_gangs == 1000
