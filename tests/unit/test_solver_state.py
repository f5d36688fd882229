"""ClusterState bookkeeping and the greedy entry point used by the simulator."""

from __future__ import annotations

import gc
import weakref

import pytest

from scheduler.bench.synthetic import make_gang, make_node, make_pod, make_queue
from scheduler.cluster import Snapshot
from scheduler.fairness import compute_fair_shares
from scheduler.plugins.packing import PackingScorer
from scheduler.solver import ClusterState, GangRequest, PodAssignment, QueueBook, place_gangs


def cluster() -> Snapshot:
    nodes = (make_node("n0", gpus=4), make_node("n1", gpus=4), make_node("n2", gpus=4))
    running = make_pod("r", queue="a", gpus=2, node="n0", grant=((0, 1000), (1, 1000)))
    return Snapshot(
        nodes, (running,), (), (make_queue("root"), make_queue("a", "root", gpu_limit=6))
    )


def test_identical_nodes_share_a_class_and_split_when_used() -> None:
    state = ClusterState.from_snapshot(cluster())
    assert len(state.classes) == 2  # n0 (2 GPUs used) and n1+n2 (empty)
    pod = make_pod("p", queue="a", gpus=1)
    state.apply(PodAssignment(pod.uid, pod.key, pod.gang, "n1", ((0, 1000),)), pod)
    assert len(state.classes) == 3
    state.release(pod.uid)
    assert len(state.classes) == 2
    state.release("default/r")  # a pod bound in the snapshot
    assert len(state.classes) == 1
    assert state.nodes["n0"].gpu_free == [1000] * 4


def test_apply_refuses_what_does_not_fit() -> None:
    state = ClusterState.from_snapshot(cluster())
    pod = make_pod("p", queue="a", gpus=1)
    with pytest.raises(ValueError, match="device 0"):
        state.apply(PodAssignment(pod.uid, pod.key, pod.gang, "n0", ((0, 1000),)), pod)
    with pytest.raises(ValueError, match="unknown"):
        state.apply(PodAssignment(pod.uid, pod.key, pod.gang, "nx", ((0, 1000),)), pod)


def test_place_gangs_all_or_nothing_and_queue_book() -> None:
    snap = cluster()
    state = ClusterState.from_snapshot(snap)
    gangs = []
    for name, size, gpus in [("big", 3, 4), ("fits", 2, 2), ("more", 2, 2)]:
        gang, pods = make_gang(name, size, queue="a", gpus=gpus)
        gangs.append(GangRequest(gang.key, "a", required=tuple(pods)))
    book = QueueBook(snap.queue_tree, compute_fair_shares(snap))
    result = place_gangs(state, gangs, PackingScorer(), book=book)
    # "big" needs 12 GPUs (only 10 free); "fits" takes 4; "more" would pass the limit of 6.
    assert set(result.placed) == {"default/fits"}
    assert result.failed["default/more"][0] == "QueueLimit"
    assert sum(m for a in result.assignments for _, m in a.gpu_grant) == 4000
    # binpack: the two 2-GPU pods fill n0 and one empty node rather than two empty nodes
    assert sorted(a.node for a in result.assignments)[0] == "n0"
    for a in result.assignments:
        state.release(a.pod_uid)
    assert sum(sum(s.gpu_free) for s in state.nodes.values()) == 10000


def test_a_placed_state_goes_as_soon_as_it_is_let_go() -> None:
    """Nothing a greedy pass leaves behind (its closed class index) holds the state in a
    reference cycle: the state goes when its holder lets go, without the cyclic collector
    (which, paused through a solve, then had the whole state of a 5,000-node cycle to walk
    and free when the solve was done)."""
    was = gc.isenabled()
    gc.disable()
    try:
        state = ClusterState.from_snapshot(cluster())
        gang, pods = make_gang("g", 2, queue="a", gpus=1)
        result = place_gangs(state, [GangRequest(gang.key, "a", required=tuple(pods))])
        assert set(result.placed) == {"default/g"}
        gone = weakref.ref(state)
        del state, result
        assert gone() is None
    finally:
        if was:
            gc.enable()
