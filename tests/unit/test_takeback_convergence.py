"""No reclaim ping-pong: a property test over random queue trees and arrivals, run through
the simulator for 50 cycles (docs/taking-back.md).

Nothing finishes during a run, so what opens a fairness gap is an arrival, or a preemption
inside a queue (a higher-priority gang evicting a larger one of its own queue drops that
queue's usage: a new gap, which it may fill by reclaiming). Hence, between two such events:
- capacity never flows back: once queue A reclaimed from queue B, B does not reclaim from A;
- a gang is not evicted twice for the same reclaiming gang;
and once arrivals stop, evictions stop within a few cycles (the set of evictions converges).

(A gang reclaimed from a queue above its fair share may restart into idle capacity and be
reclaimed again by *another* gang that needs the room: KAI's semantics allow it, and
``reclaimMinRuntime`` is the knob that stops it. Not asserted against.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.simulate.engine import simulate
from scheduler.simulate.scenario import parse_scenario

PERIOD = 10.0
CYCLES = 50
GRACE = 10.0


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    nodes = draw(st.integers(2, 3))
    total = nodes * 8
    leaves = draw(st.integers(2, 4))
    depth_two = draw(st.booleans()) and leaves >= 3
    quotas = [draw(st.integers(0, total // leaves)) for _ in range(leaves)]
    weights = [draw(st.integers(0, 3)) for _ in range(leaves)]
    queues: list[dict[str, Any]] = [
        {"metadata": {"name": "org"}, "spec": {"resources": {"gpu": {"quota": total}}}}
    ]
    parents = ["org"]
    if depth_two:  # two departments; leaves split between them
        for d in ("x", "y"):
            queues.append(
                {
                    "metadata": {"name": f"dept-{d}"},
                    "spec": {
                        "parentQueue": "org",
                        "resources": {"gpu": {"quota": total // 2, "overQuotaWeight": 1}},
                    },
                }
            )
        parents = ["dept-x", "dept-y"]
    for i in range(leaves):
        queues.append(
            {
                "metadata": {"name": f"q{i}"},
                "spec": {
                    "parentQueue": parents[i % len(parents)],
                    "resources": {"gpu": {"quota": quotas[i], "overQuotaWeight": weights[i]}},
                },
            }
        )
    jobs = []

    def job(at: int, queue: int) -> int:
        pods = draw(st.integers(1, 3))
        size = draw(st.sampled_from([1, 2, 2, 4, 4, 8]))
        jobs.append(
            {
                "name": f"j{len(jobs)}",
                "queue": f"q{queue}",
                "at": f"{int(at * PERIOD)}s",
                "duration": "10h",
                "priorityClassName": draw(st.sampled_from(["train", "train", "build-preemptible"])),
                "podGroup": {"minMember": pods},
                "pods": {"count": pods, "resources": {"nvidia.com/gpu": size}},
            }
        )
        return pods * size

    # A first wave from some queues fills the cluster; later arrivals must take back.
    asked = 0
    while asked < total:
        asked += job(0, draw(st.integers(0, max(0, leaves - 2))))
    for _ in range(draw(st.integers(1, 8))):
        job(draw(st.sampled_from([5, 10, 15, 20])), draw(st.integers(0, leaves - 1)))
    return {
        "name": "convergence",
        "settings": {
            "cyclePeriod": f"{int(PERIOD)}s",
            "end": f"{int(PERIOD * CYCLES)}s",
            "terminationGracePeriod": f"{int(GRACE)}s",
            "solverTimeLimit": "0.2s",
        },
        "nodes": [{"name": "n", "count": nodes, "gpus": 8, "cpu": 128, "memory": "1Ti"}],
        "queues": queues,
        "jobs": jobs,
    }


def scenario_gangs(result: Any) -> list[Any]:
    """Every gang the simulation knew (for the queue of a reclaiming gang)."""
    return [record.gang for record in result.cluster.gangs.values()]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_evictions_converge_and_never_ping_pong(data: dict[str, Any]) -> None:
    scenario = parse_scenario(data)
    result = simulate(scenario)
    first_time: dict[tuple[int, str, str], float] = {}
    arrivals = sorted({j.at for j in scenario.jobs})
    # A preemption's evictions happen in one cycle; its gap opens for the cycles after it.
    preempted = sorted({r.time for r in result.cluster.evictions if r.eviction.action == "preempt"})

    def window(t: float) -> int:
        """Index of the last gap-opening event at or before ``t``: decisions in one window
        answer the same fairness gaps."""
        return sum(1 for a in arrivals if a <= t) + sum(1 for p in preempted if p < t)

    gangs = {g.key: g for g in scenario_gangs(result)}
    flows: dict[int, set[tuple[str, str]]] = {}
    seen: set[tuple[int, str, str]] = set()
    for record in result.cluster.evictions:
        e = record.eviction
        w = window(record.time)
        key = (w, e.gang, e.for_gang)
        if key in seen and record.time != first_time[key]:
            raise AssertionError(f"{e.gang} evicted twice for {e.for_gang} in one arrival window")
        if key not in seen:
            seen.add(key)
            first_time[key] = record.time
        if e.action != "reclaim":
            continue
        to = gangs[e.for_gang].queue if e.for_gang in gangs else ""
        flow = flows.setdefault(w, set())
        assert (to, e.queue) not in flow, (
            f"ping-pong: {e.queue} reclaimed from {to} and {to} from {e.queue} at {record.time}"
        )
        flow.add((e.queue, to))
    last = scenario.last_arrival
    settle = last + GRACE + 5 * PERIOD
    late = [r for r in result.cluster.evictions if r.time > settle]
    assert not late, f"evictions after arrivals stopped at {last}: {late[:3]}"


def test_a_moved_gang_gets_back_the_room_planned_for_it() -> None:
    """A case the property test found: j5 preempts j9 inside q2 and moves q0's j6 into the
    room j9 leaves. Without the moved gang's head start (``Snapshot.restoring``), j9's restart
    took that room first; j6, homeless, reclaimed j5, which preempted j9 and moved j6 again:
    an eviction every cycle until the end of the run."""
    data = json.loads((Path(__file__).parent / "data" / "consolidation_loop.json").read_text())
    result = simulate(parse_scenario(data))
    moved = [r for r in result.cluster.evictions if r.eviction.action == "consolidate"]
    assert [r.eviction.gang for r in moved] == ["default/j6"]
    assert not [r for r in result.cluster.evictions if r.time > moved[0].time]
    running = {p.pod.gang for p in result.cluster.pods.values() if p.pod.bound and p.pod.active}
    assert {"default/j5", "default/j6"} <= running
