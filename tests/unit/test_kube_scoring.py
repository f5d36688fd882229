"""kube-scheduler's scores where ours follows them: the resource scores of nodes without GPUs
under ``cpu_strategy: spread`` (:mod:`scheduler.plugins.leastallocated`) and the terms of
pods already on nodes that draw or repel a pod (InterPodAffinity's score;
:meth:`~scheduler.plugins.podtopology.PodTopology.preference`).

The numbers are worked by hand from kube-scheduler 1.37's definitions (NodeResourcesFit
LeastAllocated, NodeResourcesBalancedAllocation, InterPodAffinity with
``hardPodAffinityWeight`` 1).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from scheduler.bench.synthetic import make_node, make_pod, make_queue
from scheduler.cluster import Gang, Node, Pod, Snapshot, Taint, Toleration
from scheduler.cluster.podaffinity import (
    LabelSelector,
    PodAffinityTerm,
    Preferences,
    SpreadConstraint,
    WeightedTerm,
    scoring_terms,
)
from scheduler.cluster.podspec import pod_from_k8s
from scheduler.cluster.resources import MEMORY
from scheduler.framework.scoring import pod_demand
from scheduler.plugins.leastallocated import kube_resource_score
from scheduler.plugins.packing import PackingScorer, node_cost
from scheduler.solver import ClusterState, GangRequest, PlacementSettings, place_gangs, solve

HOST = "kubernetes.io/hostname"


def node(name: str, cpu: float, memory_gib: int, **labels: str) -> Node:
    return make_node(name, gpus=0, cpu=cpu, memory_gib=memory_gib, labels={HOST: name, **labels})


def pod(name: str, cpu: float, memory_gib: float, on: str | None = None, **kw: Any) -> Pod:
    return make_pod(name, queue="a", cpu=cpu, memory_gib=memory_gib, node=on, **kw)


def snapshot(nodes: list[Node], pods: list[Pod]) -> Snapshot:
    gangs = tuple(Gang("default", p.name, 1, "a") for p in pods)
    return Snapshot(tuple(nodes), tuple(pods), gangs, (make_queue("root"), make_queue("a", "root")))


def score_on(state: ClusterState, name: str, p: Pod) -> int:
    slot = state.nodes[name]
    demand = pod_demand(p, slot.node)
    assert demand is not None
    return kube_resource_score(slot, demand)


# --- resource scores -----------------------------------------------------------------------


def test_resource_scores_as_kube_scheduler_computes_them() -> None:
    state = ClusterState.from_snapshot(snapshot([node("n", 4, 8)], []))
    # 1 core / 2 GiB on 4 / 8 GiB: LeastAllocated (75 + 75) / 2 = 75; balance stays 100, so
    # BalancedAllocation 50 + (50 + 100 - 100) // 2 = 75
    assert score_on(state, "n", pod("even", 1, 2)) == 150
    # 1 core / 0.5 GiB: LeastAllocated (75 + 93) // 2 = 84; balance after 90 (std 0.09375):
    # BalancedAllocation 50 + (50 + 90 - 100) // 2 = 70
    assert score_on(state, "n", pod("cpu-heavy", 1, 0.5)) == 154


def test_a_memory_heavy_pod_goes_where_memory_is_not_where_cpu_is() -> None:
    """Node a: 2 cores / 2 GiB, empty. Node b: 4 cores / 4 GiB with 1.75 cores / 1.25 GiB used.
    A pod of 0.5 core / 2 GiB takes all of a's memory: kube-scheduler scores a 37 + 56 = 93
    and b 30 + 72 = 102. The CPU-only spread cost ranks a first (its eighths of CPU rise
    less), which leaves a with no memory for the next pod."""
    busy = pod("busy", 1.75, 1.25, on="b")
    big = pod("big", 0.5, 2)
    snap = snapshot([node("a", 2, 2), node("b", 4, 4)], [busy, big])
    state = ClusterState.from_snapshot(snap)
    assert score_on(state, "a", big) == 93 and score_on(state, "b", big) == 102
    spread = PackingScorer("binpack", "spread")
    got = place_gangs(state, [GangRequest("default/big", "a", required=(big,))], spread)
    assert [a.node for a in got.placed["default/big"]] == ["b"]
    # binpack is unchanged: the fuller node that fits
    state = ClusterState.from_snapshot(snap)
    got = place_gangs(state, [GangRequest("default/big", "a", required=(big,))], PackingScorer())
    assert [a.node for a in got.placed["default/big"]] == ["b"]
    state = ClusterState.from_snapshot(snapshot([node("a", 2, 2), node("b", 4, 4)], [big]))
    got = place_gangs(state, [GangRequest("default/big", "a", required=(big,))], spread)
    assert [a.node for a in got.placed["default/big"]] == ["b"]  # emptier in both


def test_spread_scores_per_free_cpu_and_memory() -> None:
    """Nodes equal in free CPU but not memory score apart (the greedy caches scores by the
    key the scorer names)."""
    scorer = PackingScorer("binpack", "spread")
    state = ClusterState.from_snapshot(snapshot([node("a", 4, 8), node("b", 4, 16)], []))
    a, b = state.nodes["a"], state.nodes["b"]
    assert scorer.score_key(a) != scorer.score_key(b)
    demand = pod_demand(pod("p", 0.1, 0.25), a.node)
    assert demand is not None
    assert scorer.score(b, demand, ()) < scorer.score(a, demand, ())  # lower is better


def test_the_spread_cost_reads_memory_too() -> None:
    """CP-SAT's placement quality under ``cpu: spread`` (:func:`node_cost`): the same CPU
    used, the node whose memory is used up costs more; a node used alike in both costs less
    than one used all in memory."""
    n = node("n", 4, 8)
    gib = 1024**3
    cost = [
        node_cost(n, {"cpu": 2000, MEMORY: free * gib}, (), "binpack", "spread")
        for free in (8, 4, 0)
    ]
    assert cost == [8, 16, 40]  # (16 + 0) // 2, (16 + 16) // 2, (16 + 64) // 2
    assert node_cost(n, {"cpu": 0, MEMORY: 0}, (), "binpack", "spread") == 64  # the bound


def test_the_optimiser_does_not_fill_a_nodes_memory_where_kube_scheduler_would_not() -> None:
    """One cycle of the differential case 147 (seed 147): a web pod of 0.5 core / 2 GiB
    with two 1.5-core pods and a small one, on 2-core nodes of 2 or 4 GiB and 4-core nodes of
    4 GiB. With a CPU-only spread cost CP-SAT's answer put the web pod on a 2 GiB node and
    left it no memory (a later pod that could only go there was lost); kube-scheduler, and
    the greedy, score memory and put it where 2 GiB remain."""
    nodes = [node("n0", 4, 4), node("n1", 2, 2), node("n2", 2, 4), node("n3", 2, 2)]
    nodes += [node("n4", 2, 2), node("n5", 4, 4)]
    pods = [pod("cache", 1.5, 0.5, on="n0"), pod("db", 0.25, 0.25), pod("web", 0.5, 2)]
    pods += [pod("api1", 1.5, 0.5), pod("api2", 1.5, 0.5)]
    placement = solve(
        snapshot(nodes, pods), PlacementSettings(cpu_strategy="spread", take_back=False)
    )
    assert len(placement.assignments) == 4 and placement.violations == ()
    on = {a.pod_key.split("/")[1]: a.node for a in placement.assignments}
    memory = {p.name: p.requests[MEMORY] for p in pods}
    left = {n.name: n.allocatable[MEMORY] for n in nodes}
    left["n0"] -= memory["cache"]
    for name, where in on.items():
        left[where] -= memory[name]
    assert min(left.values()) > 0, on


# --- terms of located pods ----------------------------------------------------------------


def test_a_running_pods_required_affinity_draws_the_pods_it_matches() -> None:
    """A cache pod that must run next to a db pod: a db pod (no rules of its own) goes to
    the cache pod's node, as kube-scheduler's InterPodAffinity score sends it, not to the
    emptier node - the cache pod's next replica then finds its db."""
    cache = replace(
        pod("cache", 0.1, 0.1, on="full", labels={"app": "cache"}),
        scoring_affinity=scoring_terms(
            (PodAffinityTerm(HOST, LabelSelector((("app", "db"),)), ("default",)),), None
        ),
    )
    db = pod("db", 0.1, 0.1, labels={"app": "db"})
    web = pod("web", 0.1, 0.1, labels={"app": "web"})
    nodes = [node("full", 4, 8), node("empty", 8, 16)]
    state = ClusterState.from_snapshot(snapshot(nodes, [cache, db, web]))
    spread = PackingScorer("binpack", "spread")
    got = place_gangs(
        state,
        [
            GangRequest("default/db", "a", required=(db,)),
            GangRequest("default/web", "a", required=(web,)),
        ],
        spread,
    )
    assert got.placed["default/db"][0].node == "full"
    assert got.placed["default/web"][0].node == "empty"  # the term does not match it


def test_a_running_pods_preferred_anti_affinity_repels_the_pods_it_matches() -> None:
    term = PodAffinityTerm(HOST, LabelSelector((("app", "db"),)), ("default",))
    prefs = Preferences(anti_affinity=(WeightedTerm(50, term),))
    loner = replace(
        pod("loner", 0.1, 0.1, on="empty", labels={"app": "x"}),
        scoring_affinity=scoring_terms((), prefs),
    )
    db = pod("db", 0.1, 0.1, labels={"app": "db"})
    state = ClusterState.from_snapshot(
        snapshot([node("empty", 8, 16), node("full", 4, 8)], [loner, db])
    )
    got = place_gangs(
        state, [GangRequest("default/db", "a", required=(db,))], PackingScorer("binpack", "spread")
    )
    assert got.placed["default/db"][0].node == "full"


def test_bound_pods_keep_the_terms_that_score_others() -> None:
    """Read from the API object: a bound pod's required affinity (weight 1) and preferred
    (anti-)affinity (their weights, anti-affinity negative); a pending pod's the same."""
    term = {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": HOST}
    spec = {
        "nodeName": "n1",
        "schedulerName": "kai",
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
        "affinity": {
            "podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [term],
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 30, "podAffinityTerm": term}
                ],
            },
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 7, "podAffinityTerm": term}
                ]
            },
        },
    }
    obj = {
        "metadata": {"namespace": "ns", "name": "p", "uid": "u", "labels": {"app": "cache"}},
        "spec": spec,
        "status": {"phase": "Running"},
    }
    bound = pod_from_k8s(obj, scheduler_name="kai", default_queue="default")
    assert bound.pod_affinity == ()  # a bound pod's own affinity restricts nothing any more
    assert [w for _, w in bound.scoring_affinity] == [1, 30, -7]
    assert {t.topology_key for t, _ in bound.scoring_affinity} == {HOST}
    pending = pod_from_k8s(
        {**obj, "spec": {k: v for k, v in spec.items() if k != "nodeName"}, "status": {}},
        scheduler_name="kai",
        default_queue="default",
    )
    assert [w for _, w in pending.scoring_affinity] == [1, 30, -7]
    assert (
        pod_from_k8s(
            {**obj, "spec": {"containers": spec["containers"], "nodeName": "n1"}},
            scheduler_name="kai",
            default_queue="default",
        ).scoring_affinity
        == ()
    )


def test_equal_scores_go_to_the_node_fewer_pods_may_use() -> None:
    """Two empty nodes alike but for a taint the pod tolerates: kube-scheduler scores them
    the same and picks one at random; ours takes the tainted one, leaving the other to pods
    that do not tolerate the taint."""
    dedicated = replace(node("dedicated", 2, 2), taints=(Taint("team", "infra", "NoSchedule"),))
    tolerant = replace(pod("tolerant", 0.25, 1), tolerations=(Toleration("team", "Exists"),))
    plain = pod("plain", 0.25, 1)
    state = ClusterState.from_snapshot(
        snapshot([node("general", 2, 2), dedicated], [tolerant, plain])
    )
    assert score_on(state, "general", tolerant) == score_on(state, "dedicated", tolerant)
    spread = PackingScorer("binpack", "spread")
    got = place_gangs(
        state,
        [
            GangRequest("default/tolerant", "a", required=(tolerant,)),
            GangRequest("default/plain", "a", required=(plain,)),
        ],
        spread,
    )
    assert got.placed["default/tolerant"][0].node == "dedicated"
    assert got.placed["default/plain"][0].node == "general"


# --- preferences added to the resource scores ---------------------------------------------


def test_a_weak_spread_preference_loses_to_a_much_emptier_node_as_in_kube_scheduler() -> None:
    """ScheduleAnyway spread over hostnames; node a (4 cores / 8 GiB) runs 3 matching pods
    and has no CPU left for more than this pod, node b (16 / 32 GiB) runs 4 small ones.

    kube-scheduler: resources a 115, b 172; PodTopologySpread normalised
    ``100 * (max + min - s) / max`` = a 100, b 75, times its weight 2: a 315, b 322, so b.
    Min-max normalising the spread (a 100, b 0) or letting preferences outrank the
    resource score would send the pod to a, the node it then fills."""
    web = {"app": "web"}
    spread = SpreadConstraint(1, HOST, LabelSelector((("app", "web"),)))
    running = [pod(f"a{i}", 1.25, 1 / 3, on="a", labels=web) for i in range(3)]
    running += [pod(f"b{i}", 0.05, 0.05, on="b", labels=web) for i in range(4)]
    new = replace(pod("new", 0.25, 0.5, labels=web), preferences=Preferences(spread=(spread,)))
    snap = snapshot([node("a", 4, 8), node("b", 16, 32)], [*running, new])
    state = ClusterState.from_snapshot(snap)
    assert (score_on(state, "a", new), score_on(state, "b", new)) == (115, 172)
    got = place_gangs(
        state,
        [GangRequest("default/new", "a", required=(new,))],
        PackingScorer("binpack", "spread"),
    )
    assert got.placed["default/new"][0].node == "b"


def test_a_strong_preference_still_wins_over_resources() -> None:
    """Same nodes, but node a runs 1 matching pod and b 4: spread a 100, b 25 (weight 2:
    150 points apart), more than the resource scores differ, so a."""
    web = {"app": "web"}
    spread = SpreadConstraint(1, HOST, LabelSelector((("app", "web"),)))
    running = [pod("a0", 3.75, 1, on="a", labels=web)]
    running += [pod(f"b{i}", 0.05, 0.05, on="b", labels=web) for i in range(4)]
    new = replace(pod("new", 0.25, 0.5, labels=web), preferences=Preferences(spread=(spread,)))
    snap = snapshot([node("a", 4, 8), node("b", 16, 32)], [*running, new])
    state = ClusterState.from_snapshot(snap)
    assert score_on(state, "b", new) - score_on(state, "a", new) < 150
    got = place_gangs(
        state,
        [GangRequest("default/new", "a", required=(new,))],
        PackingScorer("binpack", "spread"),
    )
    assert got.placed["default/new"][0].node == "a"
