"""Fair share: scenario tables (cluster, queues, demand in -> shares out), properties, findings."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cluster.gang import Gang
from scheduler.cluster.node import Node
from scheduler.cluster.pod import GpuRequest, Pod, PodPhase
from scheduler.cluster.queue import QUEUE_RESOURCES, UNLIMITED, Queue, QueueResource
from scheduler.cluster.resources import Resources
from scheduler.cluster.snapshot import Snapshot
from scheduler.fairness import (
    NON_LEAF_QUEUE,
    QUEUE_INVALID,
    QUEUE_MISSING,
    QueueStatus,
    compute_fair_shares,
    pending_gangs_in_order,
    water_fill,
)

G = "nvidia.com/gpu"


def q(
    name: str,
    parent: str = "",
    *,
    quota: int = 0,
    weight: int = 1,
    limit: int = UNLIMITED,
    priority: int = 100,
    resource: str = "gpu",
) -> Queue:
    """A queue with settings for one resource, in whole units (GPUs / cores)."""
    scale = 1000
    return Queue(
        name,
        parent=parent,
        priority=priority,
        resources=(
            (
                resource,
                QueueResource(
                    quota if quota == UNLIMITED else quota * scale,
                    weight,
                    limit if limit == UNLIMITED else limit * scale,
                ),
            ),
        ),
    )


def gpu_pods(queue: str, gpus: int, *, bound_to: str | None = None, prefix: str = "") -> list[Pod]:
    """``gpus`` one-GPU pods of ``queue``, pending or bound to ``bound_to``."""
    return [
        Pod(
            uid=f"{prefix}{queue}-{i}",
            namespace="ns",
            name=f"{prefix}{queue}-{i}",
            requests=Resources({G: 1}),
            gpu=GpuRequest(1),
            gang=f"ns/{prefix}{queue}-{i}",
            queue=queue,
            node_name=bound_to,
            phase=PodPhase.RUNNING if bound_to else PodPhase.PENDING,
        )
        for i in range(gpus)
    ]


def gangs_of(pods: list[Pod]) -> tuple[Gang, ...]:
    return tuple(Gang(p.namespace, p.name, queue=p.queue) for p in pods)


@dataclass
class Case:
    """A fair-share scenario: GPUs in the cluster, queues, pending (and bound) GPUs per queue."""

    capacity: int
    queues: list[Queue]
    pending: dict[str, int]
    expected: dict[str, int]  # fair share in GPUs (thousandths when not whole)
    bound: dict[str, int] = field(default_factory=dict)
    milli: bool = False


CASES = {
    "weights 2:1 split the surplus 2:1": Case(
        9, [q("a", weight=2), q("b", weight=1)], {"a": 9, "b": 9}, {"a": 6, "b": 3}
    ),
    "higher priority takes the surplus first": Case(
        10, [q("a", priority=200), q("b", priority=100)], {"a": 8, "b": 8}, {"a": 8, "b": 2}
    ),
    "limit caps and releases the rest": Case(
        10, [q("a", limit=2), q("b")], {"a": 10, "b": 10}, {"a": 2, "b": 8}
    ),
    "demand caps and releases the rest": Case(
        10, [q("a"), q("b")], {"a": 1, "b": 10}, {"a": 1, "b": 9}
    ),
    "quota first, then surplus by weight": Case(
        10,
        [q("a", quota=6, weight=1), q("b", weight=5)],
        {"a": 10, "b": 10},
        {"a": 6667, "b": 3333},
        milli=True,
    ),
    "weight 0 gets nothing over quota": Case(
        10, [q("a", quota=2, weight=0), q("b")], {"a": 10, "b": 10}, {"a": 2, "b": 8}
    ),
    "quota -1 deserves all its demand": Case(
        10, [q("a", quota=UNLIMITED, weight=0), q("b")], {"a": 7, "b": 10}, {"a": 7, "b": 3}
    ),
    "quota -1 still respects the limit": Case(
        10,
        [q("a", quota=UNLIMITED, limit=3, weight=0), q("b")],
        {"a": 7, "b": 10},
        {"a": 3, "b": 7},
    ),
    "hierarchy: children split the parent's share": Case(
        16,
        [
            q("dept"),
            q("other"),
            q("a", "dept", weight=3),
            q("b", "dept", weight=1),
            q("o", "other"),
        ],
        {"a": 8, "b": 8, "o": 16},
        {"dept": 8, "other": 8, "a": 6, "b": 2, "o": 8},
    ),
    "hierarchy: parent limit caps the subtree": Case(
        16,
        [q("dept", limit=4), q("other"), q("a", "dept"), q("b", "dept"), q("o", "other")],
        {"a": 8, "b": 8, "o": 16},
        {"dept": 4, "other": 12, "a": 2, "b": 2, "o": 12},
    ),
    "quotas above capacity: equal priority shares pro rata": Case(
        10, [q("a", quota=8), q("b", quota=8)], {"a": 8, "b": 8}, {"a": 5, "b": 5}
    ),
    "quotas above capacity: higher priority first": Case(
        10, [q("a", quota=8, priority=150), q("b", quota=8)], {"a": 8, "b": 8}, {"a": 8, "b": 2}
    ),
    "integer remainder goes deterministically by name": Case(
        10,
        [q("c"), q("b"), q("a")],
        {"a": 10, "b": 10, "c": 10},
        {"a": 3334, "b": 3333, "c": 3333},
        milli=True,
    ),
    "a capped queue releases to weighted others": Case(
        9,
        [q("a"), q("b", weight=1), q("c", weight=2)],
        {"a": 1, "b": 100, "c": 100},
        {"a": 1000, "b": 2667, "c": 5333},
        milli=True,
    ),
    "bound pods count as demand": Case(
        8, [q("a"), q("b")], {"b": 8}, {"a": 4, "b": 4}, bound={"a": 6}
    ),
    "no demand, no share": Case(8, [q("a"), q("b")], {"a": 3}, {"a": 3, "b": 0}),
}


def build(case: Case) -> Snapshot:
    nodes = (
        Node("n1", Resources({G: case.capacity, "cpu": 10**6, "memory": 2**40})),
        # cordoned and NotReady nodes add no capacity
        Node("cordoned", Resources({G: 8}), unschedulable=True),
        Node("notready", Resources({G: 8}), ready=False),
    )
    pods: list[Pod] = []
    for name, n in case.pending.items():
        pods += gpu_pods(name, n)
    for name, n in case.bound.items():
        pods += gpu_pods(name, n, bound_to="n1", prefix="b-")
    return Snapshot(nodes=nodes, pods=tuple(pods), gangs=gangs_of(pods), queues=tuple(case.queues))


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_fair_share_scenarios(case: Case) -> None:
    report = compute_fair_shares(build(case))
    scale = 1 if case.milli else 1000
    got = {name: s.fair_share["gpu"] for name, s in report.queues.items()}
    assert got == {name: v * scale for name, v in case.expected.items()}
    assert report.capacity["gpu"] == case.capacity * 1000


def test_cpu_and_memory_are_shared_per_resource() -> None:
    queues = (q("a", weight=3, resource="cpu"), q("b", weight=1, resource="cpu"))
    pods = tuple(
        Pod(
            uid=f"{n}{i}",
            namespace="ns",
            name=f"{n}{i}",
            requests=Resources({"cpu": 4000, "memory": 2**30}),
            gang=f"ns/{n}{i}",
            queue=n,
        )
        for n in "ab"
        for i in range(4)
    )
    snap = Snapshot(
        nodes=(Node("n", Resources({"cpu": 8000, "memory": 2**31})),),
        pods=pods,
        gangs=gangs_of(list(pods)),
        queues=queues,
    )
    report = compute_fair_shares(snap)
    assert report.queues["a"].fair_share["cpu"] == 6000
    assert report.queues["b"].fair_share["cpu"] == 2000
    # memory: both default weight 1, capacity 2 GiB split evenly
    assert report.queues["a"].fair_share["memory"] == 2**30
    assert report.queues["a"].requested == {"gpu": 0, "cpu": 16000, "memory": 4 * 2**30}


def test_status_allocated_and_requested() -> None:
    case = Case(
        8, [q("dept"), q("a", "dept"), q("b", "dept")], {"a": 2, "b": 1}, {}, bound={"a": 3}
    )
    report = compute_fair_shares(build(case))
    a, dept = report.queues["a"], report.queues["dept"]
    assert a.allocated["gpu"] == 3000 and a.requested["gpu"] == 5000
    assert dept.allocated["gpu"] == 3000 and dept.requested["gpu"] == 6000
    assert dept.children == ("a", "b") and a.parent == "dept"
    assert a.limit["gpu"] == UNLIMITED and a.quota["gpu"] == 0


def test_pods_on_a_deleted_node_hold_no_share() -> None:
    """A queue whose pods are left on a node that is gone (waiting for the pod garbage
    collector) holds nothing: the other queue's share of the remaining node is not cut."""
    case = Case(8, [q("old", quota=8), q("new", quota=8)], {"new": 8}, {}, bound={"new": 2})
    snap = build(case)
    orphans = gpu_pods("old", 8, bound_to="gone", prefix="o-")
    snap = Snapshot(
        nodes=snap.nodes,
        pods=snap.pods + tuple(orphans),
        gangs=snap.gangs + gangs_of(orphans),
        queues=snap.queues,
    )
    report = compute_fair_shares(snap)
    assert report.queues["old"].allocated["gpu"] == 0
    assert report.queues["new"].allocated["gpu"] == 2000
    assert report.queues["new"].fair_share["gpu"] == 8000
    # The same pods on a node that exists do hold their share.
    kept = [replace(p, node_name="n1") for p in orphans]
    report = compute_fair_shares(
        Snapshot(
            nodes=snap.nodes,
            pods=build(case).pods + tuple(kept),
            gangs=snap.gangs,
            queues=snap.queues,
        )
    )
    assert report.queues["old"].allocated["gpu"] == 8000
    assert report.queues["new"].fair_share["gpu"] < 8000


@pytest.mark.parametrize(
    ("amount", "weights", "rooms", "expected"),
    [
        (10, {"a": 1, "b": 1}, {"a": 100, "b": 100}, {"a": 5, "b": 5}),
        (10, {"a": 1, "b": 1}, {"a": 2, "b": 100}, {"a": 2, "b": 8}),
        (10, {"a": 0, "b": 1}, {"a": 100, "b": 3}, {"a": 0, "b": 3}),
        (1, {"b": 1, "a": 1}, {"a": 5, "b": 5}, {"a": 1, "b": 0}),
        (7, {"a": 2, "b": 1}, {"a": 100, "b": 100}, {"a": 5, "b": 2}),
        (0, {"a": 1}, {"a": 5}, {"a": 0}),
    ],
)
def test_water_fill(
    amount: int, weights: dict[str, int], rooms: dict[str, int], expected: dict[str, int]
) -> None:
    assert water_fill(amount, weights, rooms) == expected


@pytest.mark.parametrize(
    ("fair", "used", "below", "dominant"),
    [
        ({"gpu": 4000}, {"gpu": 2000}, True, 0.5),
        ({"gpu": 4000}, {"gpu": 4000}, False, 1.0),
        ({"gpu": 4000, "cpu": 1000}, {"gpu": 1000, "cpu": 2000}, False, 2.0),
        ({"gpu": 0}, {"gpu": 0}, False, 0.0),
        ({"gpu": 0, "cpu": 1000}, {"gpu": 1000}, False, float("inf")),
    ],
)
def test_queue_status_shares(
    fair: dict[str, int], used: dict[str, int], below: bool, dominant: float
) -> None:
    status = QueueStatus(
        "a",
        fair_share={r: fair.get(r, 0) for r in QUEUE_RESOURCES},
        allocated={r: used.get(r, 0) for r in QUEUE_RESOURCES},
    )
    assert status.below_fair_share() is below
    assert status.dominant_share() == dominant
    # extra usage is counted as if allocated
    empty = QueueStatus("a", fair_share=status.fair_share)
    assert empty.below_fair_share({r: used.get(r, 0) for r in QUEUE_RESOURCES}) is below


# --- findings -------------------------------------------------------------------------------


def test_gang_findings_for_bad_queues_only() -> None:
    queues = (q("dept"), q("a", "dept"), q("x", "y"), q("y", "x"), q("lost", "ghost"))
    pods = [
        *gpu_pods("a", 1),
        *gpu_pods("dept", 1),
        *gpu_pods("x", 1),
        *gpu_pods("lost", 1),
        *gpu_pods("nowhere", 1),
        *gpu_pods("nowhere", 1, bound_to="n1", prefix="running-"),
    ]
    snap = Snapshot(
        nodes=(Node("n1", Resources({G: 8})),),
        pods=tuple(pods),
        gangs=gangs_of(pods),
        queues=queues,
    )
    report = compute_fair_shares(snap)
    codes = {k: v[0] for k, v in report.gang_findings.items()}
    assert codes == {
        "ns/dept-0": NON_LEAF_QUEUE,
        "ns/x-0": QUEUE_INVALID,
        "ns/lost-0": QUEUE_INVALID,
        "ns/nowhere-0": QUEUE_MISSING,
    }
    msgs = {k: v[1] for k, v in report.gang_findings.items()}
    assert msgs["ns/dept-0"] == (
        "queue dept has child queues; submit jobs to a leaf queue such as a"
    )
    assert msgs["ns/nowhere-0"] == (
        "queue nowhere does not exist; create it or set spec.queue / label kai.scheduler/queue"
    )
    assert "cycle" in msgs["ns/x-0"] and "ghost" in msgs["ns/lost-0"]
    assert {f.queue for f in report.findings} == {"x", "y", "lost"}
    # broken queues get no share; the healthy part of the tree is unaffected
    assert report.queues["x"].fair_share["gpu"] == 0 and not report.queues["x"].healthy
    assert report.queues["a"].fair_share["gpu"] == 1000


# --- properties ---------------------------------------------------------------------------


@st.composite
def trees(draw: st.DrawFn) -> Snapshot:
    """A random healthy queue tree (parents drawn from earlier queues), GPU/CPU demand, nodes."""
    count = draw(st.integers(1, 7))
    queues: list[Queue] = []
    for i in range(count):
        parent = draw(st.sampled_from(["", *[x.name for x in queues]]))
        res = []
        for r in ("gpu", "cpu"):
            quota = draw(st.sampled_from([UNLIMITED, 0, 500, 2000, 8000]))
            limit = draw(st.sampled_from([UNLIMITED, 0, 1000, 3000, 20000]))
            if limit != UNLIMITED and quota != UNLIMITED:
                quota = min(quota, limit)
            res.append((r, QueueResource(quota, draw(st.integers(0, 4)), limit)))
        queues.append(Queue(f"q{i}", parent, draw(st.sampled_from([50, 100, 150])), tuple(res)))
    parents = {x.parent for x in queues}
    leaves = [x.name for x in queues if x.name not in parents]
    pods: list[Pod] = []
    for leaf in leaves:
        for j in range(draw(st.integers(0, 4))):
            gpus = draw(st.integers(0, 4))
            bound = draw(st.booleans())
            pods.append(
                Pod(
                    uid=f"{leaf}-{j}",
                    namespace="ns",
                    name=f"{leaf}-{j}",
                    requests=Resources({G: gpus, "cpu": draw(st.integers(0, 5000))}),
                    gpu=GpuRequest(gpus) if gpus else None,
                    gang=f"ns/{leaf}-{j}",
                    queue=leaf,
                    node_name="n0" if bound else None,
                    phase=PodPhase.RUNNING if bound else PodPhase.PENDING,
                )
            )
    nodes = tuple(
        Node(f"n{i}", Resources({G: draw(st.integers(0, 8)), "cpu": draw(st.integers(0, 16000))}))
        for i in range(draw(st.integers(1, 3)))
    )
    return Snapshot(nodes=nodes, pods=tuple(pods), gangs=gangs_of(pods), queues=tuple(queues))


@settings(max_examples=200, deadline=None)
@given(trees())
def test_fair_share_properties(snap: Snapshot) -> None:
    report = compute_fair_shares(snap)
    tree = snap.queue_tree
    for r in ("gpu", "cpu"):
        roots = tree.roots()
        assert sum(report.queues[n].fair_share[r] for n in roots) <= report.capacity[r]
        level = [(report.capacity[r], roots)]
        while level:
            total, names = level.pop()
            shares = [report.queues[n].fair_share[r] for n in names]
            assert sum(shares) <= total
            for n in names:
                s = report.queues[n]
                share = s.fair_share[r]
                assert 0 <= share <= s.requested[r]
                if s.limit[r] != UNLIMITED:
                    assert share <= s.limit[r]
                cap = s.requested[r] if s.limit[r] == UNLIMITED else min(s.requested[r], s.limit[r])
                if sum(shares) < total and s.over_quota_weight[r] > 0:
                    # work-conserving: nothing is left over while someone could still take it
                    assert share == cap
                if s.children:
                    level.append((share, list(s.children)))


@settings(max_examples=100, deadline=None)
@given(trees())
def test_admission_order_lists_each_schedulable_gang_once(snap: Snapshot) -> None:
    report = compute_fair_shares(snap)
    order = pending_gangs_in_order(snap, report)
    pending = {p.gang for p in snap.pods if p.pending}
    assert sorted(order) == sorted(pending - set(report.gang_findings))
