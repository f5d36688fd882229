"""The taking-back examples: reclaim between two queues, preemption by priority in one.

The two ``..._evicts_...`` tests check what the solver's take-back stage decides (they run
the real cycle); they fail while the solver does not take back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from scheduler.simulate.engine import SimulationResult, simulate
from scheduler.simulate.report import eviction_events, gang_summaries, summary
from scheduler.simulate.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "simulate"


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.fixture(scope="module")
def reclaim() -> SimulationResult:
    return simulate(load_scenario(EXAMPLES / "reclaim.yaml"))


@pytest.fixture(scope="module")
def preempt() -> SimulationResult:
    return simulate(load_scenario(EXAMPLES / "preempt.yaml"))


def test_the_examples_load_with_their_take_back_fields() -> None:
    sc = load_scenario(EXAMPLES / "reclaim.yaml")
    assert sc.settings.placement.take_back and sc.settings.termination_grace == 30.0
    queues = {q.name: q for q in sc.queues}
    assert queues["team-a"].resource("gpu").quota == queues["team-b"].resource("gpu").quota == 8000
    assert queues["team-a"].reclaim_min_runtime == 300.0
    pre = load_scenario(EXAMPLES / "preempt.yaml")
    assert {q.name: q.preempt_min_runtime for q in pre.queues} == {"research": 600.0}
    jobs = {j.name: j for j in pre.jobs}
    assert jobs["sweep"].running and all(p.start_time == -900.0 for p in jobs["sweep"].pods)
    assert not jobs["polite"].gangs[0].may_preempt and jobs["urgent"].gangs[0].may_preempt


def test_reclaim_example_evicts_team_a_back_to_its_fair_share(reclaim: SimulationResult) -> None:
    """Waits for the solver's take-back stage (reclaim)."""
    events = eviction_events(reclaim)
    assert events, "team-b's gangs should reclaim team-a's borrowed GPUs"
    assert {e.action for e in events} == {"reclaim"}
    assert {e.queue for e in events} == {"team-a"}
    assert {e.for_gang for e in events} <= {"team-b/eval-1", "team-b/eval-2"}
    assert all(e.time == 600.0 for e in events)  # when team-b arrives
    assert sum(e.gpu for e in events) == 8000  # exactly what team-b is owed
    gangs = {g.gang: g for g in gang_summaries(reclaim)}
    for key in ("team-b/eval-1", "team-b/eval-2"):
        placed = gangs[key].placed_at
        # Nominated at 10m, bound once the victims' 30 s grace period is over.
        assert placed is not None and 630.0 <= placed <= 660.0, (key, placed)
        assert gangs[key].status == "running"
    victims = {e.gang for e in events}
    assert len(victims) == 2
    for key in victims:
        assert (gangs[key].status, gangs[key].restarts) == ("waiting", 1), key
    untouched = {f"team-a/train-{i}" for i in range(1, 5)} - victims
    assert all(gangs[k].status == "running" and gangs[k].evicted == 0 for k in untouched)
    queues = {q["name"]: q for q in summary(reclaim)["queues"]}
    for name in ("team-a", "team-b"):
        assert queues[name]["allocated"]["gpu"] == queues[name]["fair_share"]["gpu"] == 8
    assert queues["team-a"]["peak_allocated_gpu"] == 16
    # Whole gangs only: a gang runs all its pods or none.
    for g in gangs.values():
        assert g.running in (0, g.pods), g.gang


def test_preempt_example_evicts_sweep_pods_for_the_urgent_gang(preempt: SimulationResult) -> None:
    """Waits for the solver's take-back stage (preemption by priority)."""
    events = eviction_events(preempt)
    assert events, "the urgent gang should preempt lower-priority sweep pods"
    assert {e.action for e in events} == {"preempt"}
    assert {e.for_gang for e in events} == {"research/urgent"}
    assert all(e.gang.startswith("research/sweep-") for e in events)
    assert sum(e.pods for e in events) == 4 and sum(e.gpu for e in events) == 4000
    gangs = {g.gang: g for g in gang_summaries(preempt)}
    urgent = gangs["research/urgent"]
    assert urgent.status == "running" and urgent.placed_at == 300.0
    # preemptionPolicy Never: it outranks the sweep but evicts nobody; it waits.
    polite = gangs["research/polite"]
    assert polite.status == "waiting" and not polite.made_room
    sweep = [g for g in gangs.values() if g.job == "sweep"]
    assert sum(g.status == "running" for g in sweep) == 4
    assert sum(g.status == "waiting" and g.restarts == 1 for g in sweep) == 4
    assert preempt.samples[-1].allocated_gpu == {"research": 8000}
