"""The greedy pass that stops at its frontier (solver.frontier), and solve() around it: the
tiers below the frontier are placed once, by whichever stage keeps the answer, and never lost."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from scheduler.bench.synthetic import make_gang, make_node, make_queue
from scheduler.cluster import Snapshot
from scheduler.fairness import compute_fair_shares
from scheduler.plugins.packing import PackingScorer
from scheduler.solver import PlacementSettings, SolveStatus, solve, validate
from scheduler.solver.frontier import (
    finish_greedy,
    place_to_frontier,
    priority_tiers,
    surely_short,
)
from scheduler.solver.greedy import ClassIndex, GangRequest, GreedyResult, place_gangs
from scheduler.solver.problem import build_problem
from scheduler.solver.queues import QueueBook
from scheduler.solver.state import ClusterState

solve_module = importlib.import_module("scheduler.solver.solve")
hybrid_module = importlib.import_module("scheduler.solver.hybrid")
ruled_module = importlib.import_module("scheduler.solver.ruled_gangs")

QUEUES = (make_queue("root"), make_queue("a", "root", gpu_quota=8), make_queue("b", "root"))


def _snapshot(top_gpus: int, *, extras: int = 0) -> Snapshot:
    """Two 8-GPU nodes. Priority 60: a gang of ``top_gpus`` one-GPU pods and one of 2;
    priority 50: three gangs of 4 (one with ``extras`` optional pods)."""
    gangs = [
        make_gang("big", top_gpus, queue="a", priority=60, gpus=1, created=1),
        make_gang("small", 2, queue="a", priority=60, gpus=1, created=2),
    ]
    gangs += [
        make_gang(f"low{i}", 4, queue="b", priority=50, gpus=1, created=3 + i) for i in range(2)
    ]
    gangs.append(
        make_gang("elastic", 4 + extras, queue="b", min_member=4, priority=50, gpus=1, created=9)
    )
    nodes = (make_node("n0", gpus=8), make_node("n1", gpus=8))
    return Snapshot(
        nodes, tuple(p for _, ps in gangs for p in ps), tuple(g for g, _ in gangs), QUEUES
    )


def _greedy_parts(snap: Snapshot) -> tuple[ClusterState, Any, QueueBook, PackingScorer]:
    report = compute_fair_shares(snap)
    problem = build_problem(snap, report)
    state = ClusterState.from_snapshot(snap)
    return state, problem, QueueBook(snap.queue_tree, report), PackingScorer()


def _to_frontier(
    snap: Snapshot, *, skip_short: bool = False
) -> tuple[ClusterState, Any, QueueBook, PackingScorer, GreedyResult, list[GangRequest]]:
    """:func:`place_to_frontier` over the snapshot's order, with its state and book (by
    default placing every tier it reaches, as when no tier is proven short)."""
    state, problem, book, scorer = _greedy_parts(snap)
    index = ClassIndex(state, scorer)
    try:
        greedy, rest, skipped = place_to_frontier(
            state, problem.order, scorer, index, book, skip_short=skip_short
        )
    finally:
        index.close()
    assert skipped == rest[: len(skipped)]
    return state, problem, book, scorer, greedy, rest


def test_priority_tiers_are_the_runs_of_one_priority() -> None:
    problem = build_problem(_snapshot(4), compute_fair_shares(_snapshot(4)))
    tiers = priority_tiers(problem.order)
    assert [[g.priority for g in t] for t in tiers] == [[60, 60], [50, 50, 50]]
    assert [g for t in tiers for g in t] == problem.order


def test_the_pass_stops_after_the_first_tier_that_leaves_a_gang_out() -> None:
    snap = _snapshot(20)  # 20 GPUs on a 16-GPU cluster: never fits
    state, _, book, _, greedy, rest = _to_frontier(snap)
    assert set(greedy.placed) == {"default/small"} and "default/big" in greedy.failed
    assert [g.key for g in rest] == ["default/low0", "default/low1", "default/elastic"]
    # Nothing of the lower tiers is on the state, and the book holds only what was placed.
    assert {a.gang for a in state.placed.values()} == {"default/small"}
    assert book.charged["a"]["gpu"] == 2000 and not book.charged.get("b", {}).get("gpu")


def test_a_pass_that_does_not_stop_is_the_one_pass_of_place_gangs() -> None:
    snap = _snapshot(2, extras=2)
    _, problem, _, _, tiered, rest = _to_frontier(snap)
    one, _, book_one, _ = _greedy_parts(snap)
    single = place_gangs(one, problem.order, PackingScorer(), book=book_one)
    assert rest == []
    assert tiered.placed == single.placed and tiered.failed == single.failed
    assert len(tiered.placed["default/elastic"]) == 4  # extras: none fit after 16 GPUs


def test_finishing_a_stopped_pass_places_the_lower_tiers_and_the_extras() -> None:
    snap = _snapshot(20, extras=2)
    state, problem, book, scorer, greedy, rest = _to_frontier(snap)
    done = finish_greedy(state, greedy, rest, problem.order, scorer, book)
    # 2 + 4 + 4 + 4 required GPUs, then both extras: the 16 GPUs of the cluster.
    assert set(done.placed) == {"default/small", "default/low0", "default/low1", "default/elastic"}
    assert len(done.placed["default/elastic"]) == 6
    assert "default/big" in done.failed
    assert not validate(snap, done.assignments)
    assert {a.pod_uid for a in done.assignments} == set(state.placed)


@pytest.mark.parametrize("greedy_only", [False, True])
def test_solve_places_the_tiers_below_a_gang_that_can_never_fit(greedy_only: bool) -> None:
    # The relaxation cannot admit the 20-GPU gang either: the model stage keeps the greedy's
    # answer, and the pass is finished after it.
    snap = _snapshot(20, extras=2)
    placement = solve(snap, PlacementSettings(greedy_only=greedy_only, take_back=False))
    placed = {k for k, o in placement.outcomes.items() if o.placed}
    assert placed == {"default/small", "default/low0", "default/low1", "default/elastic"}
    assert len(placement.assignments) == 16
    assert placement.status == SolveStatus.GREEDY
    assert not validate(snap, list(placement.assignments))


def test_a_refused_model_answer_falls_back_to_the_whole_greedy_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With the lower tiers optimised too, the model stage places them (the greedy stopped
    # at its frontier, "big") and returns its answer; the test refuses it, so the cycle must
    # fall back to the greedy, finished below its frontier.
    snap = _snapshot(20, extras=2)
    real = solve_module.validate
    calls: list[int] = []

    def refuse_first(snapshot: Snapshot, found: Any, **kw: Any) -> list[str]:
        calls.append(len(found))
        return ["refused by the test"] if len(calls) == 1 else real(snapshot, found, **kw)

    monkeypatch.setattr(solve_module, "validate", refuse_first)
    settings = PlacementSettings(take_back=False, lower_tier_stages=True)
    placement = solve(snap, settings)
    if len(calls) == 1:
        pytest.fail("the model stage returned nothing: this test needs its answer to refuse")
    assert placement.status == SolveStatus.GREEDY
    assert len(placement.assignments) == 16 and calls[-1] == 16
    assert not real(snap, list(placement.assignments))


# --- a tier proven short is left to the model stage -------------------------------------------


def test_surely_short_counts_whole_devices_on_nodes_with_room_for_them() -> None:
    def short(*asks: tuple[int, int]) -> bool:
        gangs = [make_gang(f"g{i}", n, queue="a", gpus=k) for i, (n, k) in enumerate(asks)]
        nodes = (make_node("n0", gpus=8), make_node("n1", gpus=8))
        snap = Snapshot(
            nodes, tuple(p for _, ps in gangs for p in ps), tuple(g for g, _ in gangs), QUEUES
        )
        tier = build_problem(snap, compute_fair_shares(snap)).order
        return surely_short(ClusterState.from_snapshot(snap), tier)

    assert not short((2, 8))  # two 8-GPU pods: one per node
    assert short((3, 8))  # a third has no node
    assert not short((4, 4))  # four 4-GPU pods fill both nodes
    assert short((4, 4), (1, 1))  # and a one-GPU pod more has no device
    assert not short((1, 8), (8, 1))  # one node whole, the other shared out by GPUs
    assert short((1, 8), (9, 1))


def test_a_tier_proven_short_is_not_placed_by_the_greedy() -> None:
    snap = _snapshot(20)  # 22 GPUs asked of 16 by the top tier
    state, _, book, _, greedy, rest = _to_frontier(snap, skip_short=True)
    assert greedy.placed == {} and greedy.failed == {}
    assert [g.key for g in rest][:2] == ["default/big", "default/small"] and len(rest) == 5
    assert not state.placed and not book.charged.get("a", {}).get("gpu")


def _solve_both(
    monkeypatch: pytest.MonkeyPatch, settings: PlacementSettings
) -> tuple[Any, Any, list[int]]:
    """The same cycle with the short tier skipped by the greedy, then not; and how often the
    greedy's answer for the skipped tier was asked for."""
    snap = _snapshot(20, extras=2)
    frontier = importlib.import_module("scheduler.solver.frontier")
    asked: list[int] = []
    real_improve = hybrid_module.improve

    def spy(*args: Any, **kw: Any) -> Any:
        place = args[8] if len(args) > 8 else kw.get("place_skipped")
        if place is not None:

            def counted() -> Any:
                asked.append(1)
                return place()

            args = (*args[:8], counted)
        return real_improve(*args, **kw)

    monkeypatch.setattr(ruled_module, "improve", spy)
    skipping = solve(snap, settings)
    monkeypatch.setattr(frontier, "surely_short", lambda state, tier: False)
    placing = solve(snap, settings)
    return skipping, placing, asked


def _by_pod(placement: Any) -> list[Any]:
    return sorted(placement.assignments, key=lambda a: a.pod_uid)


def _placed(placement: Any) -> set[str]:
    return {k for k, o in placement.outcomes.items() if o.placed}


def test_a_skipped_tier_is_placed_by_the_guided_pass_when_it_reaches_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    skipping, placing, asked = _solve_both(monkeypatch, PlacementSettings(take_back=False))
    assert asked == []  # the guided answer is the best there is: no greedy pass for it
    assert _placed(skipping) == _placed(placing)
    assert len(skipping.assignments) == len(placing.assignments) == 16
    assert 0 < skipping.objective <= skipping.best_bound
    assert skipping.greedy_objective == 0  # never measured: the greedy did not place it


def test_a_skipped_tier_gets_the_greedys_answer_when_the_guided_one_is_not_proven(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A guided pass that places nothing: it must be compared with the greedy's answer, which
    # is then placed (once), and the cycle is the cycle without skipping.
    monkeypatch.setattr(hybrid_module, "place_guided", lambda *a, **kw: GreedyResult())
    skipping, placing, asked = _solve_both(monkeypatch, PlacementSettings(take_back=False))
    assert asked == [1]
    assert _by_pod(skipping) == _by_pod(placing)
    assert skipping.greedy_objective == placing.greedy_objective > 0


def test_a_skipped_tier_gets_the_greedys_answer_without_a_relaxation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(hybrid_module, "admission_bound", lambda **kw: None)
    skipping, placing, asked = _solve_both(monkeypatch, PlacementSettings(take_back=False))
    assert asked == [1]
    assert _by_pod(skipping) == _by_pod(placing)
