"""A whole simulated run with evictions: engine, report tables, JSON and the evictions plot.

The cycle's solver is replaced by the real one without taking back plus one hand-written
reclaim, so this checks the simulator's side whatever the solver's take-back stage does.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml
from rich.console import Console

import scheduler.cycle
from scheduler.cluster.snapshot import Snapshot
from scheduler.fairness import FairShareReport
from scheduler.plugins.scorer_memory import ScorerMemory
from scheduler.simulate.engine import SimulationResult, simulate
from scheduler.simulate.plots import write_plots
from scheduler.simulate.report import eviction_totals, gang_summaries, print_report, summary
from scheduler.simulate.scenario import parse_scenario
from scheduler.solver import solve
from scheduler.solver.placement import (
    Eviction,
    GangOutcome,
    Placement,
    PlacementSettings,
    PodAssignment,
)

MESSAGE = "reclaimed for team-b/job: queue team-a is over its fair share"

SCENARIO: dict[str, Any] = {
    "name": "hand-reclaim",
    "settings": {
        "cyclePeriod": "10s",
        "end": "20m",
        "solver": "greedy",
        "terminationGracePeriod": "30s",
    },
    "nodes": [{"name": "n", "gpus": 4}],
    "queues": [
        {"metadata": {"name": "team-a"}, "spec": {"resources": {"gpu": {"quota": 2}}}},
        {"metadata": {"name": "team-b"}, "spec": {"resources": {"gpu": {"quota": 2}}}},
    ],
    "jobs": [
        {
            "name": "one",
            "namespace": "team-a",
            "queue": "team-a",
            "duration": "1h",
            "podGroup": {},
            "running": {"nodes": "n", "startTime": "-10m"},
            "pods": {"resources": {"nvidia.com/gpu": 2}},
        },
        {
            "name": "two",
            "namespace": "team-a",
            "queue": "team-a",
            "duration": "1h",
            "podGroup": {},
            "pods": {"resources": {"nvidia.com/gpu": 2}},
        },
        {
            "name": "job",
            "namespace": "team-b",
            "queue": "team-b",
            "at": "5m",
            "duration": "1h",
            "podGroup": {},
            "pods": {"resources": {"nvidia.com/gpu": 2}},
        },
    ],
}


def _hand_reclaim(
    snapshot: Snapshot,
    settings: PlacementSettings,
    report: FairShareReport | None = None,
    *,
    cycle: int | None = None,
    max_gangs: int | None = None,
    scorers: ScorerMemory | None = None,
) -> Placement:
    """The solver without take-back; when team-b/job waits, team-a/two makes room for it."""
    placement = solve(
        snapshot,
        replace(settings, take_back=False),
        report,
        cycle=cycle,
        max_gangs=max_gangs,
        scorers=scorers,
    )
    outcome = placement.outcomes.get("team-b/job")
    if outcome is None or outcome.placed:
        return placement
    victims = [p for p in snapshot.pods if p.gang == "team-a/two" and p.bound and not p.deleting]
    if not victims:
        return placement
    job = next(p for p in snapshot.pods if p.gang == "team-b/job")
    victim = victims[0]
    node = victim.node_name or ""
    moved = PodAssignment(job.uid, job.key, job.gang, node, victim.gpu_grant)
    evictions = tuple(
        Eviction(v.uid, v.key, v.gang, v.queue, node, "reclaim", "team-b/job", MESSAGE)
        for v in victims
    )
    outcomes = {
        **placement.outcomes,
        "team-b/job": GangOutcome("team-b/job", "team-b", True, (moved,)),
    }
    return replace(
        placement,
        assignments=(*placement.assignments, moved),
        outcomes=outcomes,
        evictions=evictions,
        waits_for={"team-b/job": tuple(v.uid for v in victims)},
    )


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.fixture(scope="module")
def result() -> Iterator[SimulationResult]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scheduler.cycle, "solve", _hand_reclaim)
        yield simulate(parse_scenario(SCENARIO))


def test_the_reclaim_plays_out_in_simulated_time(result: SimulationResult) -> None:
    gangs = {g.gang: g for g in gang_summaries(result)}
    one, two, job = gangs["team-a/one"], gangs["team-a/two"], gangs["team-b/job"]
    # "one" was running before the start; it is never touched.
    assert (one.arrived_at, one.placed_at, one.status, one.evicted) == (
        -600.0,
        -600.0,
        "running",
        0,
    )
    pod = result.cluster.pods["team-a/one"]
    assert pod.pod.start_time == -600.0 and pod.finishes_at == 3000.0
    # "job" arrives at 5m, is nominated at once and bound when the victim's 30 s are up.
    assert job.placed_at == 330.0 and job.waited == 30.0 and job.status == "running"
    assert [(e.gang, e.action, e.pods) for e in job.made_room] == [("team-a/two", "reclaim", 1)]
    # "two" restarted and waits (team-a is at its fair share now).
    assert (two.status, two.restarts, two.evicted, two.queued_at) == ("waiting", 1, 1, 300.0)
    assert two.pods == 1  # the replacement stands for the evicted pod
    assert [e.message for e in two.evictions] == [MESSAGE]
    at_end = result.samples[-1].allocated_gpu
    assert at_end == {"team-a": 2000, "team-b": 2000}
    # While the victim terminated, it and the nominee both held their GPUs.
    during = next(s for s in result.samples if s.time == 300.0)
    assert during.allocated_gpu == {"team-a": 4000, "team-b": 2000}


def test_summary_json_lists_evictions_and_totals(result: SimulationResult) -> None:
    data = json.loads(json.dumps(summary(result)))
    assert data["evictions"] == [
        {
            "time": 300.0,
            "gang": "team-a/two",
            "queue": "team-a",
            "action": "reclaim",
            "for_gang": "team-b/job",
            "message": MESSAGE,
            "pods": 1,
            "gpus": 2.0,
        }
    ]
    totals = data["eviction_totals"]
    assert totals["total"] == {"events": 1, "pods": 1, "gpus": 2.0}
    assert totals["by_action"]["reclaim"]["gpus"] == 2.0
    assert totals["by_action"]["preempt"] == {"events": 0, "pods": 0, "gpus": 0.0}
    assert totals["by_queue"] == {"team-a": {"reclaim": {"events": 1, "pods": 1, "gpus": 2.0}}}
    by_gang = {g["gang"]: g for g in data["gangs"]}
    assert by_gang["team-a/two"]["restarts"] == 1
    assert by_gang["team-a/two"]["evictions"][0]["action"] == "reclaim"
    assert by_gang["team-b/job"]["made_room_by"][0]["gang"] == "team-a/two"
    assert eviction_totals(result)["total"]["pods"] == 1


def test_tables_show_the_evictions(result: SimulationResult) -> None:
    out = io.StringIO()
    print_report(result, Console(file=out, width=200))
    text = out.getvalue()
    assert "Evictions" in text and MESSAGE in text
    assert "Evicted pods (GPUs) by queue and action" in text
    assert "1 (2)" in text  # one pod, two GPUs
    assert "evicted: reclaim; 1x restarted" in text
    assert "took back 1 pod(s) (reclaim); bound 30s later" in text
    assert "-10m" in text  # "one" arrived (was running) 10 minutes before the start


def test_evictions_plot_is_written(result: SimulationResult, tmp_path: Path) -> None:
    paths = write_plots(result, tmp_path)
    assert [p.name for p in paths] == [
        "allocation_per_queue.png",
        "gpu_allocation_vs_workload.png",
        "evictions_over_time.png",
    ]
    content = paths[-1].read_bytes()
    assert content.startswith(b"\x89PNG") and len(content) > 10_000


def test_cli_runs_a_scenario_with_running_jobs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from scheduler.simulate.__main__ import main

    monkeypatch.setattr(scheduler.cycle, "solve", _hand_reclaim)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    assert main([str(path), "--json", "--out", str(tmp_path / "plots")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["evictions"]) == 1
    assert [Path(p).name for p in data["plots"]][-1] == "evictions_over_time.png"
