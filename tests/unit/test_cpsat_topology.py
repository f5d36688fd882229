"""The exact, pod-level search for gangs with pod (anti-)affinity and spread rules
(:mod:`scheduler.solver.cpsat_topology`): instances where the greedy's node choice loses a
pod, each rule on its own, and a property test that every answer passes the validator."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.bench.synthetic import make_gang, make_node, make_pod
from scheduler.cluster.gang import Gang
from scheduler.cluster.node import Node
from scheduler.cluster.pod import Pod
from scheduler.cluster.podaffinity import (
    HOSTNAME_LABEL,
    LabelSelector,
    PodAffinityTerm,
    SpreadConstraint,
)
from scheduler.cluster.queue import Queue
from scheduler.cluster.snapshot import Snapshot
from scheduler.fairness import compute_fair_shares
from scheduler.solver import PlacementSettings, solve
from scheduler.solver import cpsat_topology as exact
from scheduler.solver.greedy import GreedyResult
from scheduler.solver.placement import PodAssignment
from scheduler.solver.problem import Problem, build_problem
from scheduler.solver.queues import QueueBook
from scheduler.solver.ruled_gangs import topology_gang_sets
from scheduler.solver.state import ClusterState
from scheduler.solver.validate import validate

QUEUES = (Queue("root"), Queue("team", "root"))
ZONE = "zone"
# ``scheduler.solver.solve`` is also the name of the function the package exports.
SOLVE_MODULE = sys.modules["scheduler.solver.solve"]


def node(name: str, zone: str | None, cpu: float = 8, **kw: Any) -> Node:
    labels = {HOSTNAME_LABEL: name}
    if zone is not None:
        labels[ZONE] = zone
    return make_node(name, gpus=0, cpu=cpu, memory_gib=64, labels=labels, **kw)


def sel(app: str) -> LabelSelector:
    return LabelSelector((("app", app),))


def single(
    name: str, created: float, cpu: float = 1, app: str | None = None, **rules: Any
) -> tuple[Gang, Pod]:
    """A gang of one pending pod labelled ``app`` (default: its name) with ``rules``
    (pod_affinity, pod_anti_affinity, spread, node_selector) set on the pod."""
    gang, (pod,) = make_gang(
        name, 1, queue="team", cpu=cpu, memory_gib=1, created=created, labels={"app": app or name}
    )
    return gang, replace(pod, creation_time=created, **rules)


def running(name: str, on: str, cpu: float, app: str = "busy", **rules: Any) -> tuple[Gang, Pod]:
    pod = make_pod(name, queue="team", cpu=cpu, memory_gib=1, node=on, labels={"app": app})
    return Gang("default", name, 1, "team"), replace(pod, **rules)


def snapshot(nodes: Sequence[Node], members: Sequence[tuple[Gang, Pod]]) -> Snapshot:
    gangs = tuple(dict.fromkeys(g for g, _ in members))  # a gang once, however many pods
    return Snapshot(tuple(nodes), tuple(p for _, p in members), gangs, QUEUES)


def placed(snap: Snapshot, disabled: bool = False, monkeypatch: Any = None) -> dict[str, str]:
    """Pod name -> node of a full solve (the pipeline's validator passed it)."""
    if disabled:
        monkeypatch.setattr(SOLVE_MODULE, "place_ruled_exactly", lambda *a, **k: a[4])
    placement = solve(snap, PlacementSettings(take_back=False))
    assert placement.violations == ()
    return names(placement.assignments)


def exact_answer(snap: Snapshot) -> tuple[Problem, list[PodAssignment]]:
    """The model over every ruled gang of ``snap``, nothing placed before: its answer as
    assignments in the answer's order."""
    problem = build_problem(snap, compute_fair_shares(snap))
    ruled = topology_gang_sets(snap, problem).ruled
    gangs = [g for g in problem.order if g.key in ruled]
    state = ClusterState.from_snapshot(snap)
    book = QueueBook(snap.queue_tree, problem.report)
    answer = exact.solve_ruled(snap, problem, gangs, state, book, {}, [], seconds=2.0)
    assert answer is not None
    out = [PodAssignment(p.uid, p.key, key, n, ()) for key, pods in answer.order for p, n in pods]
    return problem, out


def names(assignments: Sequence[PodAssignment]) -> dict[str, str]:
    """Gang name (its pod's name without ``-0``) -> node."""
    return {a.pod_key.split("/")[1].removesuffix("-0"): a.node for a in assignments}


# --- the greedy's node choice loses a pod -----------------------------------------------


def affinity_case() -> Snapshot:
    """``b`` must run in zone z1 next to an ``a`` pod. Binpack puts ``a`` on the fullest
    node it fits (n0), the second pass on the emptiest (n1): both in z0, so ``b`` is left
    out either way. The exact search puts ``a`` in z1 (n2) and ``b`` with it."""
    a = single("a", 1.0)
    b = single(
        "b",
        2.0,
        node_selector=((ZONE, "z1"),),
        pod_affinity=(PodAffinityTerm(ZONE, sel("a")),),
    )
    busy0 = running("busy0", "n0", 7)
    busy2 = running("busy2", "n2", 4)
    return snapshot([node("n0", "z0"), node("n1", "z0"), node("n2", "z1")], [busy0, busy2, a, b])


def test_the_exact_search_places_the_pod_the_greedys_node_choice_loses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    snap = affinity_case()
    got = placed(snap)
    assert got == {"a": "n2", "b": "n2"}
    # without the search both greedy passes leave b out (this test would catch its loss)
    assert placed(snap, disabled=True, monkeypatch=monkeypatch) == {"a": "n0"}


def spread_case() -> Snapshot:
    """``p`` (1 core, 30 GiB, spread over hostnames) may go on n0 (2 cores, 32 GiB) or n1
    (4 cores, 64 GiB, 1 core used); ``q`` (1 core, 40 GiB) only on n1. Binpack puts ``p`` on
    n1 (the partly used node), and so does the second pass (emptiest first by CPU and
    memory, as kube-scheduler scores): ``q`` is left out. The exact search puts ``p`` on
    n0."""

    def pod(name: str, created: float, memory: int, **rules: Any) -> tuple[Gang, Pod]:
        gang, (one,) = make_gang(
            name, 1, queue="team", cpu=1, memory_gib=memory, created=created,
            labels={"app": "db"},
        )  # fmt: skip
        return gang, replace(one, creation_time=created, **rules)

    p = pod("p", 1.0, 30, spread=(SpreadConstraint(1, HOSTNAME_LABEL, sel("db")),))
    q = pod("q", 2.0, 40, node_selector=((HOSTNAME_LABEL, "n1"),))
    busy = running("busy", "n1", 1)
    n0 = make_node("n0", gpus=0, cpu=2, memory_gib=32, labels={HOSTNAME_LABEL: "n0"})
    n1 = make_node("n1", gpus=0, cpu=4, memory_gib=64, labels={HOSTNAME_LABEL: "n1"})
    return snapshot([n0, n1], [busy, p, q])


@pytest.mark.parametrize(
    ("case", "lost", "want"),
    [
        (affinity_case, {"a": "n0"}, {"a": "n2", "b": "n2"}),
        (spread_case, {"p": "n1"}, {"p": "n0", "q": "n1"}),
    ],
)
def test_the_exact_search_places_the_pods_the_greedys_node_choices_lose(
    monkeypatch: pytest.MonkeyPatch,
    case: Any,
    lost: dict[str, str],
    want: dict[str, str],
) -> None:
    snap = case()
    assert placed(snap) == want
    # without the search both greedy passes leave a pod out (so this test sees its loss)
    assert placed(snap, disabled=True, monkeypatch=monkeypatch) == lost


def test_a_gang_is_placed_whole_or_not_at_all() -> None:
    """A gang of three kept one per node on two nodes cannot be placed: none of its pods is
    (placing two would admit more pods), while the single pod next to it is."""
    apart = PodAffinityTerm(HOSTNAME_LABEL, sel("trio"))
    trio, pods = make_gang("trio", 3, queue="team", cpu=1, memory_gib=1, labels={"app": "trio"})
    trio_members = [(trio, replace(p, pod_anti_affinity=(apart,))) for p in pods]
    solo = single("solo", 5.0, pod_anti_affinity=(PodAffinityTerm(HOSTNAME_LABEL, sel("x")),))
    snap = snapshot([node("n0", "z0"), node("n1", "z1")], [*trio_members, solo])
    _, answer = exact_answer(snap)
    assert [a.gang for a in answer] == ["default/solo"]
    # with min_member 2, two of the three go (one per node) and the gang is admitted
    trio2 = replace(trio, min_member=2)
    snap = snapshot([node("n0", "z0"), node("n1", "z1")], [(trio2, p) for _, p in trio_members])
    _, answer = exact_answer(snap)
    assert len(answer) == 2 and {a.node for a in answer} == {"n0", "n1"}
    assert validate(snap, answer) == []


def test_anti_affinity_against_running_pods_both_ways() -> None:
    """A running ``db`` pod keeps ``web`` off its node (its own anti-affinity); a pending
    ``cache`` pod must stay out of the zone where a running ``web``-like pod runs."""
    db = running(
        "db", "n0", 1, app="db", pod_anti_affinity=(PodAffinityTerm(HOSTNAME_LABEL, sel("web")),)
    )
    old = running("old", "n1", 1, app="old")
    web = single("web", 1.0)
    cache = single("cache", 2.0, pod_anti_affinity=(PodAffinityTerm(ZONE, sel("old")),))
    nodes = [node("n0", "z0"), node("n1", "z1"), node("n2", "z0", cpu=2)]
    snap = snapshot(nodes, [db, old, web, cache])
    _, answer = exact_answer(snap)
    got = names(answer)
    assert got["web"] != "n0"
    assert got["cache"] in {"n0", "n2"}  # zone z0: not z1, where "old" runs
    assert validate(snap, answer) == []


def test_anti_affinity_between_pending_pods_per_domain() -> None:
    """Three pods that keep each other out of their zone, two zones: two are placed, in
    different zones."""
    members = [
        single(f"w{i}", float(i), app="web", pod_anti_affinity=(PodAffinityTerm(ZONE, sel("web")),))
        for i in range(3)
    ]
    nodes = [node("n0", "z0"), node("n1", "z0"), node("n2", "z1")]
    snap = snapshot(nodes, members)
    _, answer = exact_answer(snap)
    assert len(answer) == 2
    zones = {"n0": "z0", "n1": "z0", "n2": "z1"}
    assert {zones[a.node] for a in answer} == {"z0", "z1"}
    assert validate(snap, answer) == []


def test_spread_max_skew_is_kept_pod_by_pod_in_the_answers_order() -> None:
    """A running ``web`` pod in z0; three pending ones spread over zones with maxSkew 1; z1
    has room for one pod. Only two can go: z1 first (counts 1/1), then z0 (2/1); a third in
    z0 would make the skew 2. The answer's order must put the z1 pod first, else the
    validator (which replays it) refuses it."""
    spread = (SpreadConstraint(1, ZONE, sel("web")),)
    old = running("old", "n0", 1, app="web")
    members = [single(f"w{i}", float(i), app="web", spread=spread) for i in range(3)]
    snap = snapshot([node("n0", "z0"), node("n1", "z1", cpu=1)], [old, *members])
    _, answer = exact_answer(snap)
    assert [a.node for a in answer] == ["n1", "n0"]
    assert validate(snap, answer) == []
    assert validate(snap, answer[::-1]) != []  # the order matters, and the validator sees it


def test_min_domains_counts_missing_domains_as_zero() -> None:
    """minDomains 3 with two zones: the minimum is 0, so maxSkew 1 allows one matching pod
    per zone and no more."""
    spread = (SpreadConstraint(1, ZONE, sel("web"), min_domains=3),)
    members = [single(f"w{i}", float(i), app="web", spread=spread) for i in range(4)]
    snap = snapshot([node("n0", "z0"), node("n1", "z1")], members)
    _, answer = exact_answer(snap)
    assert sorted(a.node for a in answer) == ["n0", "n1"]
    assert validate(snap, answer) == []


def test_affinity_to_a_pod_placed_in_the_same_answer() -> None:
    """``b`` needs an ``a`` pod in its zone and none runs: ``a`` is placed in the same
    answer, before ``b``, in the zone ``b`` can use."""
    a = single("a", 2.0)
    b = single(
        "b", 1.0, node_selector=((ZONE, "z1"),), pod_affinity=(PodAffinityTerm(ZONE, sel("a")),)
    )
    snap = snapshot([node("n0", "z0"), node("n1", "z1")], [a, b])
    _, answer = exact_answer(snap)
    assert [names([x]) for x in answer] == [{"a": "n1"}, {"b": "n1"}]
    assert validate(snap, answer) == []


def test_a_self_affine_group_starts_anywhere_and_stays_together() -> None:
    """Pods affine to their own app on the zone, none running: the first may go anywhere
    (kube-scheduler's rule), the rest must join its zone. z0 has room for two, z1 for three:
    all three go to z1."""
    term = (PodAffinityTerm(ZONE, sel("web")),)
    members = [single(f"w{i}", float(i), app="web", pod_affinity=term) for i in range(3)]
    nodes = [node("n0", "z0", cpu=2), node("n1", "z1", cpu=2), node("n2", "z1", cpu=1)]
    snap = snapshot(nodes, members)
    _, answer = exact_answer(snap)
    assert len(answer) == 3 and {a.node for a in answer} <= {"n1", "n2"}
    assert validate(snap, answer) == []
    # a running pod that matches takes the first pod's freedom away: all go next to it
    old = running("old", "n0", 0.5, app="web")
    snap = snapshot(nodes, [old, *members])
    _, answer = exact_answer(snap)
    assert {a.node for a in answer} == {"n0"} and len(answer) == 1
    assert validate(snap, answer) == []


def test_large_instances_are_skipped_before_anything_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pods without a node selector x nodes over the bound: nothing is built (the model's
    context is never made), the greedy's answer is returned as it is."""

    def boom(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("nothing may be built")

    monkeypatch.setattr(exact, "ExactContext", boom)
    monkeypatch.setattr(exact, "MAX_POD_NODES", 2)  # "a" has no node selector: 1 x 3 nodes
    snap = affinity_case()
    problem = build_problem(snap, compute_fair_shares(snap))
    state = ClusterState.from_snapshot(snap)
    greedy = GreedyResult()
    ruled = topology_gang_sets(snap, problem).ruled
    got = exact.place_ruled_exactly(snap, problem, ruled, state, greedy, PlacementSettings(), None)
    assert got is greedy and not state.placed
    # within the bound the search runs (and places both pods)
    monkeypatch.setattr(exact, "MAX_POD_NODES", 40000)
    monkeypatch.undo()
    got = exact.place_ruled_exactly(snap, problem, ruled, state, greedy, PlacementSettings(), None)
    assert sorted(got.placed) == ["default/a", "default/b"] and len(state.placed) == 2


def test_a_failing_search_leaves_the_greedys_answer_and_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    snap = affinity_case()

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug in the search")

    monkeypatch.setattr(exact, "_apply", broken)  # after the models were solved
    problem = build_problem(snap, compute_fair_shares(snap))
    state = ClusterState.from_snapshot(snap)
    a_pod = next(p for p in snap.pods if p.name == "a-0")
    first = PodAssignment(a_pod.uid, a_pod.key, "default/a", "n0", ())
    state.apply(first)
    greedy = GreedyResult({"default/a": [first]})
    ruled = topology_gang_sets(snap, problem).ruled
    got = exact.place_ruled_exactly(snap, problem, ruled, state, greedy, PlacementSettings(), None)
    assert got is greedy
    assert state.placed == {a_pod.uid: first}
    # and the whole solve still places what the greedy did
    assert placed(snap, disabled=False) == {"a": "n0"}


# --- property: every answer passes the validator -----------------------------------------

APPS = ("web", "db")


@st.composite
def instances(draw: st.DrawFn) -> Snapshot:
    n_nodes = draw(st.integers(2, 4))
    nodes = []
    for i in range(n_nodes):
        zone = draw(st.sampled_from(["z0", "z1", None]))
        nodes.append(
            node(
                f"n{i}",
                zone,
                cpu=draw(st.sampled_from([1, 2, 4])),
                max_pods=draw(st.sampled_from([2, 110])),
            )
        )
    keys = [ZONE, HOSTNAME_LABEL]
    members: list[tuple[Gang, Pod]] = []
    for i in range(draw(st.integers(0, 2))):
        rules: dict[str, Any] = {}
        if draw(st.booleans()):
            rules["pod_anti_affinity"] = (
                PodAffinityTerm(draw(st.sampled_from(keys)), sel(draw(st.sampled_from(APPS)))),
            )
        members.append(
            running(
                f"r{i}",
                f"n{draw(st.integers(0, n_nodes - 1))}",
                0.5,
                app=draw(st.sampled_from(APPS)),
                **rules,
            )
        )
    for i in range(draw(st.integers(1, 6))):
        app = draw(st.sampled_from(APPS))
        rules = {}
        if draw(st.integers(0, 3)) == 0:
            rules["pod_affinity"] = (
                PodAffinityTerm(draw(st.sampled_from(keys)), sel(draw(st.sampled_from(APPS)))),
            )
        if draw(st.integers(0, 2)) == 0:
            rules["pod_anti_affinity"] = (
                PodAffinityTerm(draw(st.sampled_from(keys)), sel(draw(st.sampled_from(APPS)))),
            )
        if draw(st.integers(0, 2)) == 0:
            rules["spread"] = (
                SpreadConstraint(
                    draw(st.integers(1, 2)),
                    draw(st.sampled_from(keys)),
                    sel(draw(st.sampled_from(APPS))),
                    min_domains=draw(st.sampled_from([1, 1, 3])),
                ),
            )
        if draw(st.integers(0, 4)) == 0:
            rules["node_selector"] = ((ZONE, draw(st.sampled_from(["z0", "z1"]))),)
        cpu = draw(st.sampled_from([0.5, 1, 2]))
        size = draw(st.sampled_from([1, 1, 1, 2]))
        gang, pods = make_gang(
            f"g{i}",
            size,
            queue="team",
            cpu=cpu,
            memory_gib=1,
            created=float(i),
            labels={"app": app},
        )
        members += [(gang, replace(p, **rules)) for p in pods]
    return snapshot(nodes, members)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_every_answer_passes_the_validator(snap: Snapshot) -> None:
    problem = build_problem(snap, compute_fair_shares(snap))
    ruled = topology_gang_sets(snap, problem).ruled
    gangs = [g for g in problem.order if g.key in ruled]
    if not gangs:
        return
    state = ClusterState.from_snapshot(snap)
    book = QueueBook(snap.queue_tree, problem.report)
    answer = exact.solve_ruled(snap, problem, gangs, state, book, {}, [], seconds=2.0)
    assert answer is not None  # placing nothing is always feasible
    out = [PodAssignment(p.uid, p.key, key, n, ()) for key, pods in answer.order for p, n in pods]
    assert validate(snap, out) == []
    # and the whole solve keeps its answer only when it validates, never placing fewer
    # pods than the pipeline without the search
    placement = solve(snap, PlacementSettings(take_back=False))
    assert placement.violations == ()


def test_groups_with_nothing_to_gain_are_not_solved(monkeypatch: pytest.MonkeyPatch) -> None:
    """A left-out pod with no candidate node (its selector matches no node) cannot be placed
    by any model: its group is not solved, so it costs none of the cycle's budget. The group
    of :func:`affinity_case`, where the greedy lost a pod that has candidates, still is."""
    solved: list[list[str]] = []
    real = exact.solve_ruled

    def counting(*args: Any, **kwargs: Any) -> Any:
        solved.append(sorted(g.key for g in args[2]))
        return real(*args, **kwargs)

    monkeypatch.setattr(exact, "solve_ruled", counting)
    lost = single(
        "lost", 1.0, app="x", node_selector=((ZONE, "nowhere"),),
        pod_anti_affinity=(PodAffinityTerm(ZONE, sel("x")),),
    )  # fmt: skip
    base = affinity_case()
    snap = snapshot(
        base.nodes, [*((g, p) for p in base.pods for g in base.gangs if g.key == p.gang), lost]
    )
    assert placed(snap) == {"a": "n2", "b": "n2"}
    assert solved == [["default/a", "default/b"]]
    solved.clear()
    alone = snapshot(base.nodes, [lost])
    assert placed(alone) == {}
    assert solved == []
