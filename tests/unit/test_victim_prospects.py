"""The checks that let the take-back stage skip building eviction units: they may only say
"no" when no plan exists (scheduler/solver/victim_prospects.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scheduler.solver.takeback as takeback
from scheduler.bench.synthetic import make_gang, make_node, make_pod, make_queue
from scheduler.cluster import Gang, Pod, Snapshot
from scheduler.solver import PlacementSettings, solve
from scheduler.solver.greedy import GangRequest
from scheduler.solver.victim_prospects import least_need, room_anywhere

NOW = 10_000.0
GREEDY = PlacementSettings(greedy_only=True)


def running(name: str, queue: str, node: str, devices: tuple[int, ...], priority: int) -> list[Any]:
    gang = Gang("default", name, queue=queue, priority=priority, preemptible=priority < 100)
    pod = replace(
        make_pod(
            f"{name}-0",
            gang=name,
            queue=queue,
            gpus=len(devices),
            priority=priority,
            node=node,
            grant=tuple((d, 1000) for d in devices),
        ),
        start_time=1.0,
    )
    return [gang, pod]


def build(groups: list[list[Any]], pending: list[tuple[Gang, list[Pod]]], queues: Any) -> Snapshot:
    gangs = [g[0] for g in groups] + [g for g, _ in pending]
    pods = [g[1] for g in groups] + [p for _, ps in pending for p in ps]
    nodes = (make_node("n0"), make_node("n1"))
    return Snapshot(nodes, tuple(pods), tuple(gangs), tuple(queues), now=NOW)


@pytest.fixture
def unit_builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the calls of build_units made by the take-back stage."""
    calls: list[int] = []
    real = takeback.build_units

    def counting(snapshot: Snapshot) -> Any:
        calls.append(1)
        return real(snapshot)

    monkeypatch.setattr(takeback, "build_units", counting)
    return calls


def test_full_cluster_of_one_priority_is_refused_without_building_units(
    unit_builds: list[int],
) -> None:
    queues = [make_queue("root"), make_queue("a", "root", gpu_quota=16)]
    full = [running(f"r{i}", "a", f"n{i // 2}", tuple(range(4 * (i % 2), 4 * (i % 2) + 4)), 50)
            for i in range(4)]  # fmt: skip
    want = make_gang("want", 1, queue="a", gpus=4, priority=50, created=NOW - 1)
    placement = solve(build(full, [want], queues), GREEDY)
    assert placement.evictions == ()
    assert not placement.outcomes["default/want"].placed
    assert unit_builds == []


def test_fragmented_free_room_still_reaches_the_model(unit_builds: list[int]) -> None:
    """Two free GPUs on each node: 4 in total, so moving pods may make room for 4."""
    queues = [make_queue("root"), make_queue("a", "root", gpu_quota=16)]
    groups = [running("r0", "a", "n0", tuple(range(6)), 50)]
    groups += [running("r1", "a", "n1", (0, 1, 2, 3), 50), running("m", "a", "n1", (4, 5), 50)]
    want = make_gang("want", 1, queue="a", gpus=4, priority=50, created=NOW - 1)
    placement = solve(build(groups, [want], queues), PlacementSettings(time_limit_seconds=2.0))
    assert unit_builds == [1]
    assert [e.action for e in placement.evictions] == ["consolidate"]


def test_least_need_counts_memory_sized_shares_as_nothing() -> None:
    whole = make_pod("w", gpus=2, cpu=1, memory_gib=1)
    share = make_pod("s", fraction=0.5, cpu=1, memory_gib=1)
    by_memory = make_pod("m", gpu_memory_mib=1000, cpu=1, memory_gib=1)
    g = GangRequest(key="default/x", queue="a", priority=0, preemptible=True,
                    required=(whole, share, by_memory))  # fmt: skip
    gpu, cpu, memory = least_need(g)
    assert (gpu, cpu, memory) == (2500, 3000, 3 * 2**30)
    assert room_anywhere((2500, 3000, 3 * 2**30), g)
    assert not room_anywhere((2499, 3000, 3 * 2**30), g)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    used=st.lists(st.integers(0, 8), min_size=4, max_size=4),
    priorities=st.lists(st.sampled_from([10, 50, 200]), min_size=4, max_size=4),
    queues_of=st.lists(st.sampled_from(["a", "b"]), min_size=4, max_size=4),
    want=st.lists(
        st.tuples(st.integers(1, 8), st.sampled_from([10, 50, 200]), st.sampled_from("ab")),
        min_size=1,
        max_size=3,
    ),
)
def test_the_checks_never_change_what_the_stage_decides(
    used: list[int],
    priorities: list[int],
    queues_of: list[str],
    want: list[tuple[int, int, str]],
) -> None:
    """The same evictions with the checks as with checks that always say "maybe"."""
    queues = [make_queue("root"), make_queue("a", "root", gpu_quota=8),
              make_queue("b", "root", gpu_quota=8)]  # fmt: skip
    groups = []
    for i, n in enumerate(used):
        half = (4 * (i % 2), 4 * (i % 2) + min(4, n))
        if half[1] > half[0]:
            groups.append(
                running(f"r{i}", queues_of[i], f"n{i // 2}", tuple(range(*half)), priorities[i])
            )
    pending = [
        make_gang(f"w{j}", 1, queue=q, gpus=g, priority=p, created=NOW - 1)
        for j, (g, p, q) in enumerate(want)
    ]
    snapshot = build(groups, pending, queues)
    with_checks = solve(snapshot, GREEDY)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(takeback, "may_evict_for", lambda *a, **k: True)
        without = solve(snapshot, GREEDY)
    assert [(e.pod_uid, e.action) for e in with_checks.evictions] == [
        (e.pod_uid, e.action) for e in without.evictions
    ]
    assert {k: o.placed for k, o in with_checks.outcomes.items()} == {
        k: o.placed for k, o in without.outcomes.items()
    }
