"""Placing a lower tier again below a stage that changed (hybrid._place_again)."""

from __future__ import annotations

from scheduler.bench.synthetic import make_gang, make_node, make_queue
from scheduler.cluster import Snapshot
from scheduler.fairness import compute_fair_shares
from scheduler.plugins.packing import PackingScorer
from scheduler.solver.greedy import GangRequest, place_gangs
from scheduler.solver.hybrid import _place_again
from scheduler.solver.placement import PodAssignment
from scheduler.solver.queues import QueueBook
from scheduler.solver.state import ClusterState

QUEUES = (make_queue("root"), make_queue("a", "root", gpu_quota=8), make_queue("b", "root"))


def _setup(limit_b: float | None = None) -> tuple[Snapshot, list[GangRequest]]:
    queues = QUEUES
    if limit_b is not None:
        queues = (*QUEUES[:2], make_queue("b", "root", gpu_limit=limit_b))
    gangs = [make_gang(f"g{i}", 1, queue="b", gpus=2) for i in range(4)]
    gangs.append(make_gang("top", 1, queue="a", gpus=2))
    nodes = (make_node("n0", gpus=4), make_node("n1", gpus=4))
    snap = Snapshot(
        nodes, tuple(p for _, ps in gangs for p in ps), tuple(g for g, _ in gangs), queues
    )
    requests = [GangRequest(g.key, g.queue, 0, True, tuple(ps)) for g, ps in gangs[:4]]
    return snap, requests


def test_gangs_keep_their_earlier_placement_when_it_is_still_free() -> None:
    snap, tier = _setup()
    state = ClusterState.from_snapshot(snap)
    before = place_gangs(state, tier[::-1], extras=False)  # another order: other nodes
    for a in before.assignments:
        state.release(a.pod_uid)
    book = QueueBook(snap.queue_tree, compute_fair_shares(snap))
    again = _place_again(state, tier, before.placed, PackingScorer(), book, False, None)
    assert again.placed == {k: v for k, v in before.placed.items()}


def test_a_gang_whose_room_was_taken_is_placed_again_and_queue_rules_still_hold() -> None:
    snap, tier = _setup(limit_b=6)
    state = ClusterState.from_snapshot(snap)
    before = place_gangs(state, tier, extras=False)
    for a in before.assignments:
        state.release(a.pod_uid)
    # The stage above took g0's devices: g0 must move, and the queue's limit (6 GPUs) now
    # leaves room for three of the four gangs, first come first served.
    taken = before.placed[tier[0].key][0]
    top = next(p for p in snap.pods if p.gang.endswith("/top"))
    state.apply(PodAssignment(top.uid, top.key, top.gang, taken.node, taken.gpu_grant))
    book = QueueBook(snap.queue_tree, compute_fair_shares(snap))
    again = _place_again(state, tier, before.placed, PackingScorer(), book, False, None)
    assert set(again.placed) == {g.key for g in tier[:3]}
    assert again.placed[tier[0].key][0].node != taken.node or (
        again.placed[tier[0].key][0].gpu_grant != taken.gpu_grant
    )
    assert tier[3].key in again.failed
    # Every device given once (g0, first in order, may take a later gang's old spot).
    grants = [(a.node, i) for pods in again.placed.values() for a in pods for i, _ in a.gpu_grant]
    grants += [(taken.node, i) for i, _ in taken.gpu_grant]
    assert len(grants) == len(set(grants))
