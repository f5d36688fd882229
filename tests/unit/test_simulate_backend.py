"""The in-memory backend and the simulated-time loop (scheduler.simulate.backend / .engine)."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest

from scheduler.cluster.gang import Gang
from scheduler.cluster.node import Node
from scheduler.cluster.pod import Pod, PodPhase
from scheduler.cluster.queue import Queue, QueueResource
from scheduler.cluster.resources import GPU, Resources
from scheduler.fairness import compute_fair_shares
from scheduler.simulate.backend import SimulatedCluster
from scheduler.simulate.engine import simulate
from scheduler.simulate.scenario import parse_scenario
from scheduler.solver.placement import GangOutcome, Placement, PodAssignment


def _cluster() -> SimulatedCluster:
    node = Node("n1", Resources({GPU: 4, "cpu": 8000, "pods": 10}))
    queue = Queue("q", resources=(("gpu", QueueResource(quota=4000)),))
    cluster = SimulatedCluster([node], [queue])
    gang = Gang("ns", "g", min_member=2, queue="q")
    pods = [
        Pod(f"ns/p{i}", "ns", f"p{i}", Resources({GPU: 1}), gang="ns/g", queue="q")
        for i in range(2)
    ]
    cluster.add_pods(pods, [gang], duration=60.0)
    return cluster


def _placement(*, placed: bool = True) -> Placement:
    pods = tuple(PodAssignment(f"ns/p{i}", f"ns/p{i}", "ns/g", "n1", ((i, 1000),)) for i in (0, 1))
    outcome = (
        GangOutcome("ns/g", "q", True, pods)
        if placed
        else GangOutcome("ns/g", "q", False, (), "GangDoesNotFit", "no room")
    )
    return Placement(assignments=pods if placed else (), outcomes={"ns/g": outcome})


def _commit(cluster: SimulatedCluster, placement: Placement) -> Any:
    snap = cluster.snapshot_now()
    return asyncio.run(cluster.commit(snap, placement, compute_fair_shares(snap)))


def test_commit_binds_the_whole_gang_and_pods_finish_after_their_duration() -> None:
    cluster = _cluster()
    cluster.advance(10.0)
    result = _commit(cluster, _placement())
    assert result.bound_gangs == ("ns/g",) and result.bound_pods == 2
    pods = [cluster.pods[f"ns/p{i}"] for i in (0, 1)]
    assert all(p.pod.node_name == "n1" and p.pod.phase == PodPhase.RUNNING for p in pods)
    assert cluster.gangs["ns/g"].placed_at == 10.0
    assert cluster.next_completion() == 70.0
    assert cluster.advance(69.0) == []
    done = cluster.advance(70.0)
    assert len(done) == 2 and all(p.pod.phase == PodPhase.SUCCEEDED for p in pods)
    assert cluster.snapshot_now().pods == ()  # finished pods hold nothing
    with pytest.raises(ValueError, match="time cannot go back"):
        cluster.advance(5.0)


def test_commit_never_binds_part_of_a_gang() -> None:
    cluster = _cluster()
    # p1 was bound meanwhile (e.g. by a previous cycle): the gang must not be half bound now.
    record = cluster.pods["ns/p1"]
    record.pod = Pod(**{**_fields(record.pod), "node_name": "n1"})
    result = _commit(cluster, _placement())
    assert result.failed_gangs == ("ns/g",) and result.bound_pods == 0
    assert cluster.pods["ns/p0"].pod.node_name is None
    assert cluster.gangs["ns/g"].last_reason is not None
    assert cluster.gangs["ns/g"].last_reason[0] == "BindFailed"


def test_commit_records_first_and_last_reason() -> None:
    cluster = _cluster()
    _commit(cluster, _placement(placed=False))
    _commit(cluster, _placement(placed=False))
    record = cluster.gangs["ns/g"]
    assert record.first_reason == ("GangDoesNotFit", "no room")
    assert record.waited_cycles == 2
    _commit(cluster, _placement())
    assert record.last_reason is None and record.first_reason == ("GangDoesNotFit", "no room")


def _fields(pod: Pod) -> dict[str, Any]:
    return {name: getattr(pod, name) for name in pod.__dataclass_fields__}


SMALL: dict[str, Any] = {
    "settings": {"cyclePeriod": "10s", "solver": "greedy"},
    "nodes": [{"name": "n", "gpus": 4}],
    "queues": [{"metadata": {"name": "q"}, "spec": {"resources": {"gpu": {"quota": 4}}}}],
    "jobs": [
        {
            "name": "first",
            "queue": "q",
            "duration": "15m",
            "podGroup": {},
            "pods": {"count": 2, "resources": {"nvidia.com/gpu": 2}},
        },
        {
            "name": "second",
            "queue": "q",
            "at": "1m",
            "duration": "5m",
            "podGroup": {},
            "pods": {"count": 4, "resources": {"nvidia.com/gpu": 1}},
        },
        {"name": "never", "queue": "q", "at": "2m", "pods": {"resources": {"nvidia.com/gpu": 5}}},
    ],
}


def test_engine_runs_until_nothing_can_change_and_skips_idle_time() -> None:
    result = simulate(parse_scenario(SMALL))
    gangs = result.cluster.gangs
    assert gangs["default/first"].placed_at == 0.0
    assert gangs["default/second"].placed_at == 900.0  # when "first" frees the GPUs
    assert gangs["default/never"].placed_at is None
    # Nothing can make 5 GPUs appear: the run ends once "second" is done, not at the 30-day cap.
    assert result.stopped == "idle" and result.end_time == 900.0 + 300.0
    # Idle stretches are skipped: only cycles where something changed were run.
    assert result.cycles <= 8
    times = [s.time for s in result.samples]
    assert times == sorted(times) and times[0] == 0.0
    assert max(s.allocated_gpu.get("q", 0) for s in result.samples) == 4000


def test_engine_stops_at_the_end_time() -> None:
    data = {**SMALL, "settings": {"cyclePeriod": "10s", "end": "5m", "solver": "greedy"}}
    result = simulate(parse_scenario(data))
    assert result.stopped == "end" and result.end_time == 300.0
    assert result.cluster.gangs["default/second"].placed_at is None
    assert result.final_report.queues["q"].allocated["gpu"] == 4000


def test_progress_bar_draws_on_a_terminal() -> None:
    from rich.console import Console

    from scheduler.simulate.cli import _Progress

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=100)
    progress = _Progress(console, enabled=True)
    progress.DELAY_SECONDS = 0.0
    with progress:
        progress.update(0.0, 600.0)
        progress.update(300.0, 600.0)
    assert "simulated" in buffer.getvalue()
    silent = io.StringIO()
    with _Progress(Console(file=silent, force_terminal=True), enabled=False) as off:
        off.update(1.0, 2.0)
    assert silent.getvalue() == ""
