"""Entry points around the solver: thread wrapper, scorer plug-in, benchmark CLI."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

import pytest
import structlog

from scheduler.bench.__main__ import main as bench_main
from scheduler.bench.synthetic import ClusterSpec, synthetic_snapshot
from scheduler.framework import NodeView, PodDemand
from scheduler.plugins.packing import PackingScorer
from scheduler.solver import PlacementSettings, SolveStatus, solve, solve_in_thread, validate


class Unkeyed:
    """PackingScorer without ScoreKey: the greedy must score every class itself."""

    def __init__(self) -> None:
        self.inner = PackingScorer()
        self.calls = 0

    def score(self, node: NodeView, demand: PodDemand, grant: Sequence[tuple[int, int]]) -> float:
        self.calls += 1
        return self.inner.score(node, demand, grant)


def test_score_cache_does_not_change_the_greedy_answer() -> None:
    snap = synthetic_snapshot(ClusterSpec(nodes=60, gangs=40, seed=3, jitter=4))
    greedy = PlacementSettings(greedy_only=True)
    keyed = solve(snap, greedy)
    plain_scorer = Unkeyed()
    plain = solve(snap, greedy, scorer=plain_scorer)
    assert plain_scorer.calls > 0
    assert keyed.assignments == plain.assignments
    assert keyed.assignments


def test_custom_scorer_keeps_cpsat_to_admission_only() -> None:
    snap = synthetic_snapshot(ClusterSpec(nodes=30, gangs=30, seed=5))
    placement = solve(snap, PlacementSettings(time_limit_seconds=0.5), scorer=Unkeyed())
    evicted = placement.freed
    assert validate(snap, placement.assignments, evicted=evicted) == []
    assert placement.objective >= placement.greedy_objective


async def test_solve_in_thread_matches_solve() -> None:
    snap = synthetic_snapshot(ClusterSpec(nodes=20, gangs=10, seed=1))
    settings = PlacementSettings(greedy_only=True)
    threaded = await solve_in_thread(snap, settings)
    assert threaded.assignments == solve(snap, settings).assignments


def test_empty_snapshot_places_nothing() -> None:
    snap = synthetic_snapshot(ClusterSpec(nodes=3, gangs=0, seed=1))
    placement = solve(snap)
    assert placement.status is SolveStatus.EMPTY
    assert placement.assignments == () and placement.outcomes == {}


@pytest.fixture
def keep_logging() -> Iterator[None]:
    """The benchmark configures structlog for a script; undo it for the other tests."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.mark.usefixtures("keep_logging")
def test_bench_solver_prints_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = bench_main(["solver", "--nodes", "30", "--gangs", "10", "--cycles", "2", "--seed", "2"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and len(lines) == 1
    row = json.loads(lines[0])
    assert row["validator"] == "ok"
    for key in (
        "cycle_seconds_p50",
        "cycle_seconds_p95",
        "admitted_gangs",
        "admitted_pods",
        "admitted_gpus",
        "objective",
        "best_bound",
        "greedy_objective",
        "peak_rss_mb",
    ):
        assert key in row
    assert row["objective"] >= row["greedy_objective"]


def test_bench_rejects_bad_arguments() -> None:
    with pytest.raises(SystemExit):
        bench_main(["solver", "--fill", "2"])
