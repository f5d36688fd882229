"""The LP ceiling of ``bench openb`` (scheduler/bench/openb_bound.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.bench import openb_bound
from scheduler.bench.openb import share_gap_bound
from scheduler.bench.openb_bound import device_patterns, lp_bound, node_shapes
from scheduler.simulate.replay import ReplaySettings, replay
from scheduler.simulate.trace import TraceNode, TracePod, gpu_capacity_milli


def _pod(name: str, gpus: int, milli: int, cpu: int = 1000, spec: tuple[str, ...] = ()) -> TracePod:
    return TracePod(name, cpu, 1024, gpus, milli, spec)


NODES = [TraceNode("t4", 8000, 65536, 2, "T4"), TraceNode("g2", 8000, 65536, 2, "G2")]


def test_pods_pinned_to_one_model_use_only_its_capacity() -> None:
    pods = [_pod(f"p{i}", 1, 1000, spec=("T4",)) for i in range(4)]
    cap = gpu_capacity_milli(NODES)
    assert share_gap_bound(pods, cap) == 100.0  # one pool of devices: no limit seen
    assert lp_bound(pods, NODES) == pytest.approx(50.0, abs=1e-3)


def test_cpu_beside_the_gpus_runs_out() -> None:
    nodes = [TraceNode(f"n{i}", 4000, 65536, 2, "T4") for i in range(3)]
    pods = [_pod(f"p{i}", 1, 1000, cpu=3000) for i in range(6)]
    assert lp_bound(pods, nodes) == pytest.approx(50.0, abs=1e-3)  # one pod per node


def test_multi_gpu_pods_need_a_node_with_that_many_devices() -> None:
    nodes = [TraceNode("small", 8000, 65536, 1, "T4"), TraceNode("big", 8000, 65536, 4, "G2")]
    pods = [_pod("a", 4, 1000), _pod("b", 4, 1000)]
    assert lp_bound(pods, nodes) == pytest.approx(80.0, abs=1e-3)  # 4 of 5 devices


def test_shares_above_half_strand_what_only_small_pods_could_fill() -> None:
    pods = [_pod("a", 1, 810), _pod("b", 1, 810), _pod("c", 1, 190), _pod("d", 1, 700)]
    nodes = NODES[:1]
    cap = gpu_capacity_milli(nodes)
    # two devices: at most two pods above 500; the best is 810 + 190 and 810 (or 700).
    assert lp_bound(pods, nodes) == pytest.approx(90.5, abs=1e-3)
    assert lp_bound(pods, nodes) <= share_gap_bound(pods, cap) + 1e-6


def test_node_shapes_group_identical_gpu_nodes() -> None:
    nodes = [*NODES, TraceNode("t4b", 8000, 65536, 2, "T4"), TraceNode("cpu", 8000, 1024, 0, "")]
    shapes = node_shapes(nodes)
    assert [(h.model, h.count) for h in shapes] == [("G2", 1), ("T4", 2)]


def test_the_ceiling_is_above_what_a_replay_places() -> None:
    """A small mixed replay: whatever the scheduler's placement pass reaches, the LP allows."""
    nodes = [TraceNode(f"n{i}", 16000, 65536, 2, "T4" if i % 2 else "G2") for i in range(6)]
    pods = [
        _pod(
            f"p{i}",
            1,
            (810, 470, 1000, 320, 650)[i % 5],
            cpu=(2000, 5000)[i % 2],
            spec=("T4",) if i % 3 == 0 else (),
        )
        for i in range(30)
    ]
    result = replay(nodes, pods, ReplaySettings(batch=1), engine="greedy")
    placed = 100 * result.allocated_milli / result.capacity_milli
    bound = lp_bound(pods, nodes)
    assert 0 < placed <= bound + 1e-6


def test_cpu_shared_by_pods_of_different_types() -> None:
    """Each type alone fits the node's CPU; together they do not (per-type caps miss it)."""
    nodes = [TraceNode("n", 4000, 65536, 2, "T4")]
    pods = [_pod("a", 1, 1000, cpu=3000), _pod("b", 1, 1000, cpu=2000)]
    # LP: 3000 a + 2000 b <= 4000 with a, b <= 1: b = 1, a = 2/3 of a pod.
    assert lp_bound(pods, nodes) == pytest.approx(100 * (1000 + 2000 / 3) / 2000, abs=1e-3)


def test_memory_shared_by_pods_of_different_types() -> None:
    nodes = [TraceNode("n", 64000, 4096, 2, "T4")]
    pods = [
        TracePod("a", 1000, 3072, 1, 1000),
        TracePod("b", 1000, 2048, 1, 1000),
    ]
    assert lp_bound(pods, nodes) == pytest.approx(100 * (1000 + 2000 / 3) / 2000, abs=1e-3)


def test_pods_that_must_be_placed_lower_the_ceiling_or_make_it_void() -> None:
    pods = [_pod("a", 1, 810), _pod("b", 1, 810), _pod("c", 1, 190), _pod("d", 1, 700)]
    nodes = NODES[:1]
    free = lp_bound(pods, nodes)
    forced = lp_bound(pods, nodes, placed=[pods[3]])
    assert forced is not None and free is not None
    # 700 placed strands 300 that only the 190 pod can use: 810 + 700 + 190 at best.
    assert forced == pytest.approx(85.0, abs=1e-3) and forced < free
    # A pod pinned to a model the cluster lacks cannot be placed by anyone.
    assert lp_bound(pods, nodes, placed=[_pod("x", 1, 500, spec=("A100",))]) is None


def test_device_patterns_are_the_full_ways_to_fill_one_device() -> None:
    # (470, 1) alone leaves 530 where another 470 fits: not full, so not listed.
    assert device_patterns([(470, 3), (320, 2)]) == [(2, 0), (1, 1), (0, 2)]
    # At most as many copies as there are pods: one 400 pod leaves the rest of its device.
    assert device_patterns([(400, 1)]) == [(1,)]


def test_shares_that_do_not_pair_leave_room_the_lp_sees() -> None:
    """400, 400 and 300 thousandths, one device: 800 at most; the GPU row would allow 1000."""
    nodes = [TraceNode("n", 16000, 65536, 1, "T4")]
    pods = [_pod("a", 1, 400), _pod("b", 1, 400), _pod("c", 1, 300)]
    assert lp_bound(pods, nodes) == pytest.approx(80.0, abs=1e-3)
    # 470s pair with 530s and nothing else fills 60: two devices, four 470s and one 530.
    nodes = [TraceNode("n", 16000, 65536, 2, "T4")]
    pods = [*(_pod(f"a{i}", 1, 470) for i in range(4)), _pod("b", 1, 530)]
    assert lp_bound(pods, nodes) == pytest.approx(100 * (470 + 530 + 2 * 470) / 2000, abs=1e-3)


def test_too_many_patterns_leave_the_rows_out(monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = [TraceNode("n", 16000, 65536, 1, "T4")]
    pods = [_pod("a", 1, 400), _pod("b", 1, 400), _pod("c", 1, 300)]
    monkeypatch.setattr(openb_bound, "MAX_PATTERNS", 0)
    assert device_patterns([(400, 3)]) is None
    assert lp_bound(pods, nodes) == pytest.approx(100.0, abs=1e-3)  # the GPU row only


def test_the_enumeration_gives_up_after_max_visits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sizes 10, 20, ..., 500 have millions of ways to fill a device: the search stops
    after MAX_VISITS of them, however few full patterns it has found by then."""
    sizes = [(s, 100) for s in range(500, 0, -10)]
    monkeypatch.setattr(openb_bound, "MAX_PATTERNS", 10**9)
    monkeypatch.setattr(openb_bound, "MAX_VISITS", 5_000)
    assert device_patterns(sizes) is None
    monkeypatch.setattr(openb_bound, "MAX_VISITS", 10**9)
    assert device_patterns(sizes[:3]) is not None  # 500, 490, 480: a handful


@settings(max_examples=40, deadline=None)
@given(
    shares=st.lists(st.sampled_from([50, 110, 230, 320, 470, 530, 650, 810, 1000]), max_size=14),
    devices=st.lists(st.integers(1, 4), min_size=1, max_size=3),
)
def test_no_placement_beats_the_ceiling(shares: list[int], devices: list[int]) -> None:
    """Whatever the placement pass fits of random shares, the LP with its patterns allows."""
    nodes = [TraceNode(f"n{i}", 64000, 262144, d, "T4") for i, d in enumerate(devices)]
    pods = [_pod(f"p{i}", 1, m) for i, m in enumerate(shares)]
    result = replay(nodes, pods, ReplaySettings(batch=1), engine="greedy")
    placed = 100 * result.allocated_milli / result.capacity_milli
    bound = lp_bound(pods, nodes)
    assert bound is not None and placed <= bound + 1e-6
