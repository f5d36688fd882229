"""Pod topology rules through the whole solve: which gangs the CP-SAT stage may move, the
one-per-node patterns it uses for gangs that keep their own pods apart, and preferences."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from scheduler.bench.__main__ import main
from scheduler.bench.synthetic import (
    ClusterSpec,
    make_gang,
    make_node,
    make_pod,
    synthetic_snapshot,
)
from scheduler.cluster.gang import Gang
from scheduler.cluster.node import Node
from scheduler.cluster.pod import Pod
from scheduler.cluster.podaffinity import (
    HOSTNAME_LABEL,
    LabelSelector,
    PodAffinityTerm,
    Preferences,
    SpreadConstraint,
    WeightedTerm,
)
from scheduler.cluster.queue import Queue
from scheduler.cluster.snapshot import Snapshot
from scheduler.fairness import compute_fair_shares
from scheduler.solver import PlacementSettings, solve
from scheduler.solver.problem import build_problem
from scheduler.solver.solve import topology_gangs

QUEUES = (Queue("root"), Queue("team", "root"))


def nodes(n: int, cpu: float = 8) -> list[Node]:
    return [
        make_node(f"n{i}", gpus=0, cpu=cpu, labels={HOSTNAME_LABEL: f"n{i}", "zone": f"z{i % 2}"})
        for i in range(n)
    ]


def apart(job: str) -> dict[str, Any]:
    """Pod arguments: one pod of ``job`` per node (its own anti-affinity)."""
    return {
        "labels": {"job": job},
        "anti_affinity": (PodAffinityTerm(HOSTNAME_LABEL, LabelSelector((("job", job),))),),
    }


def snapshot(node_list: list[Node], pods: list[Pod], gangs: list[Gang]) -> Snapshot:
    return Snapshot(tuple(node_list), tuple(pods), tuple(gangs), QUEUES)


def test_cpsat_keeps_a_one_per_node_gang_on_distinct_nodes() -> None:
    """n0 is partly used, so packing would put both pods there; the gang's anti-affinity
    forbids it. The CP-SAT stage runs (quality, every gang admitted) and may move the gang:
    its answer must pass the validator (no violations) with the pods on two nodes."""
    running = make_pod("busy", queue="team", cpu=4, node="n0")
    gang, pods = make_gang("job", 2, queue="team", cpu=1, memory_gib=1, **apart("job"))
    snap = snapshot(nodes(3), [running, *pods], [Gang("default", "busy", 1, "team"), gang])
    assert topology_gangs(snap, build_problem(snap, compute_fair_shares(snap))) == set()
    placement = solve(snap, PlacementSettings(quality_when_all_admitted=True))
    assert placement.violations == ()
    where = {a.pod_key: a.node for a in placement.assignments}
    assert len(where) == 2 and len(set(where.values())) == 2


def test_gangs_with_other_rules_or_selected_by_one_are_left_to_the_greedy() -> None:
    spread = SpreadConstraint(1, "zone", LabelSelector((("app", "web"),)))
    web, web_pods = make_gang("web", 2, queue="team", labels={"app": "web"}, spread=(spread,))
    # selected by web's spread constraint, with no rule of its own
    other, other_pods = make_gang("other", 1, queue="team", labels={"app": "web"})
    free, free_pods = make_gang("free", 1, queue="team", labels={"app": "db"})
    own, own_pods = make_gang("own", 2, queue="team", **apart("own"))
    snap = snapshot(
        nodes(4),
        [*web_pods, *other_pods, *free_pods, *own_pods],
        [web, other, free, own],
    )
    problem = build_problem(snap, compute_fair_shares(snap))
    assert topology_gangs(snap, problem) == {"default/web", "default/other"}
    # a running pod selected by "own"'s anti-affinity: the model cannot see it, so pinned
    running = make_pod("old", queue="team", node="n0", labels={"job": "own"})
    snap = replace(snap, pods=(*snap.pods, running), gangs=(*snap.gangs, Gang("default", "old")))
    problem = build_problem(snap, compute_fair_shares(snap))
    assert "default/own" in topology_gangs(snap, problem)
    placement = solve(snap)
    assert placement.violations == ()
    own_nodes = [a.node for a in placement.assignments if a.gang == "default/own"]
    assert "n0" not in own_nodes and len(set(own_nodes)) == 2


def test_preferred_anti_affinity_spreads_pods_that_binpack_would_stack() -> None:
    term = PodAffinityTerm(HOSTNAME_LABEL, LabelSelector((("app", "web"),)))
    prefs = Preferences(anti_affinity=(WeightedTerm(100, term),))
    pods, gangs = [], []
    for i in range(3):
        g, ps = make_gang(f"w{i}", 1, queue="team", labels={"app": "web"})
        gangs.append(g)
        pods += [replace(p, preferences=prefs) for p in ps]
    placement = solve(snapshot(nodes(3), pods, gangs))
    assert len({a.node for a in placement.assignments}) == 3
    # without the preference, binpack stacks them on one node
    plain = solve(snapshot(nodes(3), [replace(p, preferences=None) for p in pods], gangs))
    assert len({a.node for a in plain.assignments}) == 1


def test_solver_bench_with_constraints_keeps_every_rule(capsys: pytest.CaptureFixture[str]) -> None:
    """``bench solver --constraints``: a third of the gangs keep their pods apart; every
    cycle's placement passes the validator (which replays the rules), and the gangs with a
    zone spread are reported as left to the greedy."""
    args = ["solver", "--nodes", "120", "--gangs", "60", "--constraints", "0.4", "--cycles", "2"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["validator"] == "ok" and out["constraints"] == 0.4
    assert all(n > 0 for n in out["gangs_left_to_greedy"])
    snap = synthetic_snapshot(ClusterSpec(120, 8, 60, 0.7, 0, constraints=0.4))
    ruled = [p for p in snap.pods if p.topology_rules]
    assert any(p.one_per_node for p in ruled) and any(p.spread for p in ruled)
    assert all(HOSTNAME_LABEL in n.label_map for n in snap.nodes)
