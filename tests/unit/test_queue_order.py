"""Queue order (KAI): below fair share, then DRF, then priority and age; gang admission order."""

from __future__ import annotations

import pytest

from scheduler.cluster.gang import Gang
from scheduler.cluster.node import Node
from scheduler.cluster.pod import GpuRequest, Pod, PodPhase
from scheduler.cluster.queue import QUEUE_RESOURCES, UNLIMITED, Queue, QueueResource
from scheduler.cluster.resources import Resources
from scheduler.cluster.snapshot import Snapshot
from scheduler.fairness import (
    QueueStatus,
    compute_fair_shares,
    gang_sort_key,
    pending_gangs_in_order,
    queue_sort_key,
)

G = "nvidia.com/gpu"


def status(
    name: str, fair: int, used: int, priority: int = 100, created: float = 0.0
) -> QueueStatus:
    zero = dict.fromkeys(QUEUE_RESOURCES, 0)
    return QueueStatus(
        name,
        fair_share={**zero, "gpu": fair},
        allocated={**zero, "gpu": used},
        priority=priority,
        creation_time=created,
    )


@pytest.mark.parametrize(
    ("first", "second"),
    [
        # below fair share beats a higher priority at its share
        (status("low", 4000, 1000, priority=10), status("high", 4000, 4000, priority=500)),
        # both below: the lower dominant share first
        (status("b", 4000, 1000), status("a", 4000, 2000)),
        # both over: still DRF
        (status("b", 1000, 2000), status("a", 1000, 3000)),
        # equal shares: higher priority first
        (status("b", 4000, 2000, priority=200), status("a", 4000, 2000, priority=100)),
        # equal shares and priority: the older queue first
        (status("b", 4000, 2000, created=1.0), status("a", 4000, 2000, created=2.0)),
        # everything equal: by name
        (status("a", 4000, 2000), status("b", 4000, 2000)),
    ],
)
def test_queue_sort_key_order(first: QueueStatus, second: QueueStatus) -> None:
    assert queue_sort_key(first) < queue_sort_key(second)


def test_queue_sort_key_counts_extra() -> None:
    a, b = status("a", 4000, 1000), status("b", 4000, 2000)
    assert queue_sort_key(a) < queue_sort_key(b)
    assert queue_sort_key(a, {"gpu": 2000}) > queue_sort_key(b)
    assert queue_sort_key(a, {"gpu": 3000})[0] == 1  # no longer below its fair share


def test_gang_sort_key() -> None:
    gangs = [
        Gang("ns", "old-low", priority=1, creation_time=1),
        Gang("ns", "new-high", priority=9, creation_time=5),
        Gang("ns", "old-high", priority=9, creation_time=2),
        Gang("ns", "b-tie", priority=1, creation_time=1),
    ]
    assert [g.name for g in sorted(gangs, key=gang_sort_key)] == [
        "old-high",
        "new-high",
        "b-tie",
        "old-low",
    ]


def queue(
    name: str, parent: str = "", weight: int = 1, priority: int = 100, created: float = 0.0
) -> Queue:
    return Queue(
        name,
        parent,
        priority,
        (("gpu", QueueResource(0, weight, UNLIMITED)),),
        creation_time=created,
    )


def job(
    queue_name: str,
    name: str,
    gpus: int = 1,
    *,
    priority: int = 0,
    created: float = 0.0,
    members: int = 1,
    bound: int = 0,
) -> tuple[Gang, list[Pod]]:
    """A gang of ``members`` pods asking ``gpus`` GPUs each (``bound`` of them already running)."""
    gang = Gang(
        "ns", name, min_member=members, queue=queue_name, priority=priority, creation_time=created
    )
    pods = [
        Pod(
            uid=f"{name}-{i}",
            namespace="ns",
            name=f"{name}-{i}",
            requests=Resources({G: gpus}),
            gpu=GpuRequest(gpus),
            gang=gang.key,
            queue=queue_name,
            node_name="n1" if i < bound else None,
            phase=PodPhase.RUNNING if i < bound else PodPhase.PENDING,
            creation_time=created,
        )
        for i in range(members)
    ]
    return gang, pods


def snapshot(queues: list[Queue], jobs: list[tuple[Gang, list[Pod]]], gpus: int = 12) -> Snapshot:
    return Snapshot(
        nodes=(Node("n1", Resources({G: gpus})),),
        pods=tuple(p for _, pods in jobs for p in pods),
        gangs=tuple(g for g, _ in jobs),
        queues=tuple(queues),
    )


def order(snap: Snapshot) -> list[str]:
    return [k.removeprefix("ns/") for k in pending_gangs_in_order(snap, compute_fair_shares(snap))]


def test_weights_interleave_admission() -> None:
    # a deserves 8 of 12 GPUs, b 4: a gets two turns for every one of b's while below share
    jobs = [job("a", f"a{i}") for i in range(8)] + [job("b", f"b{i}") for i in range(8)]
    snap = snapshot([queue("a", weight=2), queue("b", weight=1)], jobs)
    got = order(snap)
    # Shares are compared with the next gang added (KAI): a at 2/8 ties b at 1/4 (a wins on
    # name), then a at 3/8 loses to b at 1/4.
    assert got[:6] == ["a0", "a1", "b0", "a2", "a3", "b1"]
    assert len(got) == 16 and sorted(got) == sorted(f"{x}{i}" for x in "ab" for i in range(8))


def test_within_a_queue_priority_then_age_then_key() -> None:
    jobs = [
        job("a", "late-low", priority=1, created=9),
        job("a", "early-low", priority=1, created=1),
        job("a", "high", priority=50, created=10),
        job("a", "aa-tie", priority=1, created=1),
    ]
    assert order(snapshot([queue("a")], jobs)) == ["high", "aa-tie", "early-low", "late-low"]


def test_queue_priority_and_age_break_ties() -> None:
    jobs = [job("old", "o"), job("young", "y"), job("vip", "v")]
    queues = [queue("young", created=5), queue("old", created=1), queue("vip", priority=300)]
    # vip has the highest priority: it takes the whole surplus first, so its share is 12 GPUs
    # and it stays below fair share the longest; old and young tie on everything but age
    assert order(snapshot(queues, jobs, gpus=30)) == ["v", "o", "y"]


def test_below_fair_share_first_then_drf() -> None:
    # a holds 6 of its fair share of 7; b holds nothing: b's gangs go first
    running = [job("a", f"run{i}", bound=1) for i in range(6)]
    jobs = [
        *running,
        job("a", "a-next", created=0),
        job("b", "b1", created=5),
        job("b", "b2", created=6),
        job("b", "b3", created=7),
    ]
    snap = snapshot([queue("a"), queue("b")], jobs, gpus=12)
    # With its next gang a is at 7/7 of its share; b at 1/3, then 2/3, then 3/3 (a tie,
    # broken by name).
    assert order(snap) == ["b1", "b2", "a-next", "b3"]


def test_hierarchy_compares_each_level() -> None:
    # dept1 (weight 3) has two teams, dept2 (weight 1) one: the root level decides first
    queues = [
        queue("dept1", weight=3),
        queue("dept2", weight=1),
        queue("t1", "dept1"),
        queue("t2", "dept1"),
        queue("t3", "dept2"),
    ]
    jobs = [job(t, f"{t}-{i}") for t in ("t1", "t2", "t3") for i in range(4)]
    got = order(snapshot(queues, jobs, gpus=8))
    # dept1 deserves 6 GPUs, dept2 2; t1/t2 alternate inside dept1. With the next gang
    # added, dept1 is at 1/6, 2/6, 3/6 while dept2 would be at 1/2: dept1 takes three turns
    # (the tie at 3/6 goes by name), then dept2 one.
    assert got[:5] == ["t1-0", "t2-0", "t1-1", "t3-0", "t2-1"]
    assert got.index("t3-1") < got.index("t3-2")


def test_excluded_and_non_pending_gangs() -> None:
    jobs = [
        job("a", "ok"),
        job("dept", "in-parent"),
        job("ghost", "lost"),
        job("a", "running", bound=1),
    ]
    queues = [queue("dept"), queue("a", "dept")]
    snap = snapshot(queues, jobs)
    report = compute_fair_shares(snap)
    assert set(report.gang_findings) == {"ns/in-parent", "ns/lost"}
    assert order(snap) == ["ok"]


def test_running_members_count_as_allocated() -> None:
    # a 4-member gang with 3 running: a holds 3 of its 5 GPU share, b holds none of its 1.
    # With its next gang added a is at 4/5 and b at 1/1: a's gang goes first; then a at
    # 5/5 ties b at 1/1 (by name: a2)
    jobs = [job("a", "big", members=4, bound=3), job("a", "a2", created=1), job("b", "b1")]
    snap = snapshot([queue("a"), queue("b")], jobs, gpus=12)
    assert order(snap) == ["big", "a2", "b1"]
