"""Scenario tests in the KAI style: nodes, queues, gangs in -> who runs, and where, out.

Outcomes are asserted as which gangs run and what queues get; node names only where the
answer is forced.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from scheduler.bench.synthetic import make_gang, make_node, make_pod, make_queue
from scheduler.cluster import Gang, Node, Pod, Queue, Snapshot, Taint, Toleration
from scheduler.cluster.selectors import NodeSelectorRequirement, NodeSelectorTerm
from scheduler.solver import Placement, PlacementSettings, SolveStatus, solve, validate

GREEDY = PlacementSettings(greedy_only=True)
CPSAT = PlacementSettings(time_limit_seconds=2.0)
BOTH = pytest.mark.parametrize("settings", [GREEDY, CPSAT], ids=["greedy", "cpsat"])


def snapshot(
    nodes: list[Node],
    queues: list[Queue],
    gangs: list[tuple[Gang, list[Pod]]],
    running: list[Pod] = (),  # type: ignore[assignment]
) -> Snapshot:
    pods = [p for _, ps in gangs for p in ps] + list(running)
    all_gangs = [g for g, _ in gangs] + [Gang(p.namespace, p.name, 1, p.queue) for p in running]
    return Snapshot(tuple(nodes), tuple(pods), tuple(all_gangs), tuple(queues))


def run(snap: Snapshot, settings: PlacementSettings) -> Placement:
    placement = solve(snap, settings)
    assert validate(snap, placement.assignments) == []
    pending = {g.key for g in snap.gangs if any(p.pending for p in snap.pods_by_gang[g.key])}
    assert set(placement.outcomes) == pending
    return placement


def placed(placement: Placement) -> set[str]:
    return {k.split("/")[1] for k, o in placement.outcomes.items() if o.placed}


def per_queue_gpus(placement: Placement) -> Counter[str]:
    out: Counter[str] = Counter()
    for o in placement.outcomes.values():
        out[o.queue] += sum(m for a in o.pods for _, m in a.gpu_grant)
    return out


QUEUES = [make_queue("root"), make_queue("a", "root"), make_queue("b", "root")]


@BOTH
def test_gang_fits_only_if_packed(settings: PlacementSettings) -> None:
    nodes = [make_node("n0"), make_node("n1")]
    small = make_gang("small", 2, queue="a", gpus=4, created=0)
    big = make_gang("big", 1, queue="a", gpus=8, created=1)
    result = run(snapshot(nodes, QUEUES, [small, big]), settings)
    assert placed(result) == {"small", "big"}
    small_nodes = {a.node for a in result.outcomes["default/small"].pods}
    assert len(small_nodes) == 1


@BOTH
def test_gang_of_four_two_gpu_pods_with_six_free_gpus_places_nothing(
    settings: PlacementSettings,
) -> None:
    nodes = [make_node("n0", gpus=4), make_node("n1", gpus=2)]
    gang = make_gang("g", 4, queue="a", gpus=2)
    result = run(snapshot(nodes, QUEUES, [gang]), settings)
    assert result.assignments == ()
    outcome = result.outcomes["default/g"]
    assert not outcome.placed
    assert outcome.reason_code and outcome.reason


@BOTH
def test_fractional_pods_share_a_gpu(settings: PlacementSettings) -> None:
    nodes = [make_node("n0", gpus=1)]
    pods = [make_gang(f"f{i}", 1, queue="a", fraction=0.5, created=i) for i in range(3)]
    result = run(snapshot(nodes, QUEUES, pods), settings)
    assert len(placed(result)) == 2
    grants = [a.gpu_grant for a in result.assignments]
    assert sorted(grants) == [((0, 500),), ((0, 500),)]


@BOTH
def test_fractional_pod_prefers_partly_used_device(settings: PlacementSettings) -> None:
    nodes = [make_node("n0", gpus=2)]
    running = [make_pod("r", queue="a", fraction=0.5, node="n0", grant=((1, 500),))]
    pods = [make_gang("f", 1, queue="a", fraction=0.5)]
    result = run(snapshot(nodes, QUEUES, pods, running), settings)
    assert [a.gpu_grant for a in result.assignments] == [((1, 500),)]


@BOTH
def test_queue_at_its_limit_gets_nothing_more(settings: PlacementSettings) -> None:
    queues = [make_queue("root"), make_queue("a", "root", gpu_limit=4), make_queue("b", "root")]
    nodes = [make_node("n0"), make_node("n1")]
    running = [
        make_pod("r", queue="a", gpus=4, node="n0", grant=tuple((i, 1000) for i in range(4)))
    ]
    gangs = [make_gang("ga", 1, queue="a", gpus=1), make_gang("gb", 1, queue="b", gpus=1)]
    result = run(snapshot(nodes, queues, gangs, running), settings)
    assert placed(result) == {"gb"}
    assert result.outcomes["default/ga"].reason_code == "QueueLimit"


@BOTH
def test_parent_limit_applies_to_children(settings: PlacementSettings) -> None:
    queues = [
        make_queue("root", gpu_limit=3),
        make_queue("a", "root"),
        make_queue("b", "root"),
    ]
    nodes = [make_node("n0")]
    gangs = [make_gang(f"g{i}", 1, queue="ab"[i % 2], gpus=1, created=i) for i in range(6)]
    result = run(snapshot(nodes, queues, gangs), settings)
    assert sum(per_queue_gpus(result).values()) == 3000


@BOTH
def test_sibling_weights_split_surplus_two_to_one(settings: PlacementSettings) -> None:
    queues = [
        make_queue("root"),
        make_queue("a", "root", gpu_weight=2),
        make_queue("b", "root", gpu_weight=1),
    ]
    nodes = [make_node("n0", gpus=6), make_node("n1", gpus=6)]
    gangs = [make_gang(f"a{i}", 1, queue="a", gpus=1, created=i) for i in range(12)]
    gangs += [make_gang(f"b{i}", 1, queue="b", gpus=1, created=i) for i in range(12)]
    result = run(snapshot(nodes, queues, gangs), settings)
    got = per_queue_gpus(result)
    assert got["a"] == 8000 and got["b"] == 4000


@BOTH
def test_higher_priority_queue_takes_surplus_first(settings: PlacementSettings) -> None:
    queues = [
        make_queue("root"),
        make_queue("hi", "root", priority=200),
        make_queue("lo", "root", priority=100),
    ]
    nodes = [make_node("n0")]
    gangs = [make_gang(f"h{i}", 1, queue="hi", gpus=1, created=i) for i in range(8)]
    gangs += [make_gang(f"l{i}", 1, queue="lo", gpus=1, created=i) for i in range(8)]
    result = run(snapshot(nodes, queues, gangs), settings)
    got = per_queue_gpus(result)
    assert got["hi"] == 8000 and got["lo"] == 0


@BOTH
def test_higher_priority_gang_wins_over_many_lower(settings: PlacementSettings) -> None:
    nodes = [make_node("n0")]
    low = [make_gang(f"low{i}", 1, queue="a", gpus=1, priority=50, created=i) for i in range(8)]
    high = make_gang("high", 1, queue="a", gpus=8, priority=100, preemptible=True, created=99)
    result = run(snapshot(nodes, QUEUES, [*low, high]), settings)
    assert placed(result) == {"high"}


@BOTH
def test_non_preemptible_work_stays_within_quota(settings: PlacementSettings) -> None:
    queues = [make_queue("root", gpu_quota=8), make_queue("a", "root", gpu_quota=2)]
    nodes = [make_node("n0")]
    strict = [make_gang(f"np{i}", 1, queue="a", gpus=1, priority=100, created=i) for i in range(4)]
    loose = [
        make_gang(f"p{i}", 1, queue="a", gpus=1, priority=50, created=10 + i) for i in range(3)
    ]
    result = run(snapshot(nodes, queues, [*strict, *loose]), settings)
    names = placed(result)
    assert len([n for n in names if n.startswith("np")]) == 2
    assert {"p0", "p1", "p2"} <= names
    refused = [o for k, o in result.outcomes.items() if "np" in k and not o.placed]
    assert {o.reason_code for o in refused} == {"OverQuota"}


@BOTH
def test_non_preemptible_work_stays_within_every_ancestors_quota(
    settings: PlacementSettings,
) -> None:
    """KAI's rule: the quota of the leaf and of each parent; only non-preemptible usage
    counts against it, so preemptible work already running does not block."""
    queues = [make_queue("root", gpu_quota=1), make_queue("a", "root", gpu_quota=4)]
    nodes = [make_node("n0")]
    running = [
        make_pod(
            "r0",
            gang="r0",
            queue="a",
            gpus=4,
            priority=50,
            node="n0",
            grant=tuple((d, 1000) for d in range(4)),
        )
    ]
    strict = [make_gang(f"np{i}", 1, queue="a", gpus=1, priority=100, created=i) for i in range(3)]
    result = run(snapshot(nodes, queues, strict, running), settings)
    assert len([n for n in placed(result) if n.startswith("np")]) == 1
    refused = [o for k, o in result.outcomes.items() if not o.placed]
    assert {o.reason_code for o in refused} == {"OverQuota"}
    assert all("queue root" in o.reason for o in refused)


@BOTH
def test_taints_selectors_and_affinity_are_honoured(settings: PlacementSettings) -> None:
    nodes = [
        make_node("tainted", gpus=2, taints=[Taint("dedicated", "infer")], labels={"zone": "a"}),
        make_node("zone-b", gpus=2, labels={"zone": "b", "gpu": "h100"}),
        make_node("zone-a", gpus=2, labels={"zone": "a", "gpu": "a100"}),
    ]
    term = NodeSelectorTerm((NodeSelectorRequirement("gpu", "In", ("h100",)),))
    tol = Toleration("dedicated", "Equal", "infer")
    gangs = [
        make_gang("sel", 1, queue="a", gpus=2, selector={"zone": "a"}, created=0),
        make_gang("aff", 1, queue="a", gpus=2, affinity=[term], created=1),
        make_gang(
            "tol", 1, queue="a", gpus=2, tolerations=[tol], selector={"zone": "a"}, created=2
        ),
        make_gang("nowhere", 1, queue="a", gpus=1, selector={"zone": "c"}, created=3),
    ]
    result = run(snapshot(nodes, QUEUES, gangs), settings)
    where = {o.gang.split("/")[1]: o.pods[0].node for o in result.outcomes.values() if o.placed}
    assert where == {"sel": "zone-a", "aff": "zone-b", "tol": "tainted"}
    assert result.outcomes["default/nowhere"].reason_code


@BOTH
def test_cordoned_and_not_ready_nodes_get_nothing(settings: PlacementSettings) -> None:
    nodes = [
        make_node("cordoned", unschedulable=True),
        make_node("down", ready=False),
        make_node("ok", gpus=1),
    ]
    gangs = [make_gang(f"g{i}", 1, queue="a", gpus=1, created=i) for i in range(3)]
    result = run(snapshot(nodes, QUEUES, gangs), settings)
    assert {a.node for a in result.assignments} == {"ok"}
    assert len(result.assignments) == 1


@BOTH
def test_extras_go_after_every_admissible_gang(settings: PlacementSettings) -> None:
    nodes = [make_node("n0", gpus=4)]
    elastic = make_gang("elastic", 4, queue="a", gpus=1, min_member=2, created=0)
    other = make_gang("other", 1, queue="a", gpus=1, created=1)
    result = run(snapshot(nodes, QUEUES, [elastic, other]), settings)
    assert placed(result) == {"elastic", "other"}
    assert len(result.outcomes["default/elastic"].pods) == 3


def test_gang_with_too_few_pods_created_waits() -> None:
    nodes = [make_node("n0")]
    gang, pods = make_gang("g", 3, queue="a", gpus=1, min_member=4)
    result = run(snapshot(nodes, QUEUES, [(gang, pods)]), CPSAT)
    assert result.assignments == ()
    assert result.outcomes["default/g"].reason_code == "GangIncomplete"


def test_cpsat_admits_more_work_than_greedy_order() -> None:
    nodes = [make_node("n0")]
    gangs = [
        make_gang("first", 1, queue="a", gpus=5, created=0),
        make_gang("second", 1, queue="a", gpus=4, created=1),
        make_gang("third", 1, queue="a", gpus=4, created=2),
    ]
    snap = snapshot(nodes, QUEUES, gangs)
    greedy = run(snap, GREEDY)
    assert placed(greedy) == {"first"}
    # The relaxation-guided pass already reaches the bound: admission is proven optimal, so
    # by default the model (placement quality only) is not built...
    guided = run(snap, CPSAT)
    assert guided.status == SolveStatus.GREEDY
    assert placed(guided) == {"second", "third"}
    assert guided.objective > guided.greedy_objective
    assert guided.objective <= guided.best_bound
    # ...and when asked for, CP-SAT proves the same admission.
    best = run(snap, replace(CPSAT, quality_when_admission_proven=True))
    assert best.status in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE)
    assert placed(best) == {"second", "third"}
    assert best.objective > best.greedy_objective
    assert best.objective <= best.best_bound


def test_spread_uses_the_emptiest_nodes() -> None:
    nodes = [make_node("n0", gpus=4), make_node("n1", gpus=4)]
    gangs = [make_gang(f"g{i}", 1, queue="a", gpus=1, created=i) for i in range(2)]
    for settings in (
        PlacementSettings(gpu_strategy="spread", greedy_only=True),
        PlacementSettings(gpu_strategy="spread"),
    ):
        result = run(snapshot(nodes, QUEUES, gangs), settings)
        assert {a.node for a in result.assignments} == {"n0", "n1"}
    packed = run(snapshot(nodes, QUEUES, gangs), CPSAT)
    assert len({a.node for a in packed.assignments}) == 1


def test_missing_queue_is_reported_not_scheduled() -> None:
    nodes = [make_node("n0")]
    gangs = [make_gang("lost", 1, queue="nope", gpus=1)]
    result = run(snapshot(nodes, QUEUES, gangs), CPSAT)
    assert result.assignments == ()
    assert result.outcomes["default/lost"].reason_code


def test_cpsat_improves_packing_quality_over_greedy_order() -> None:
    nodes = [make_node("n0", gpus=4), make_node("n1", gpus=4)]
    running = [make_pod("r", queue="a", gpus=2, node="n1", grant=((0, 1000), (1, 1000)))]
    gangs = [
        make_gang("one", 1, queue="a", gpus=1, created=0),
        make_gang("two", 1, queue="a", gpus=2, created=1),
    ]
    snap = snapshot(nodes, QUEUES, gangs, running)
    greedy = run(snap, GREEDY)
    assert {a.pod_key: a.node for a in greedy.assignments}["default/one-0"] == "n1"
    best = run(snap, CPSAT)
    assert best.status is SolveStatus.OPTIMAL
    assert {a.pod_key: a.node for a in best.assignments} == {
        "default/two-0": "n1",
        "default/one-0": "n0",
    }
    assert best.objective > best.greedy_objective


@BOTH
def test_gpu_memory_request_is_sized_per_node(settings: PlacementSettings) -> None:
    nodes = [
        make_node("small", gpus=1, gpu_memory_mib=20000),
        make_node("large", gpus=1, gpu_memory_mib=80000),
    ]
    gangs = [make_gang("m", 1, queue="a", gpu_memory_mib=40000)]
    result = run(snapshot(nodes, QUEUES, gangs), settings)
    assert [(a.node, a.gpu_grant) for a in result.assignments] == [("large", ((0, 500),))]


def test_lower_priority_stage_is_optimised_too() -> None:
    nodes = [make_node("n0", labels={"zone": "a"}), make_node("n1", labels={"zone": "b"})]
    top = [
        make_gang(
            n,
            1,
            queue="a",
            gpus=8,
            priority=100,
            preemptible=True,
            created=i,
            selector={"zone": "a"},
        )
        for i, n in enumerate(["top-a", "top-b"])
    ]
    low = [
        make_gang("first", 1, queue="a", gpus=5, priority=50, created=10),
        make_gang("second", 1, queue="a", gpus=4, priority=50, created=11),
        make_gang("third", 1, queue="a", gpus=4, priority=50, created=12),
    ]
    snap = snapshot(nodes, QUEUES, [*top, *low])
    assert placed(run(snap, GREEDY)) == {"top-a", "first"}
    assert placed(run(snap, CPSAT)) == {"top-a", "first"}  # lower tiers: greedy backfill
    staged = PlacementSettings(time_limit_seconds=2.0, lower_tier_stages=True)
    best = run(snap, staged)
    assert placed(best) == {"top-a", "second", "third"}
    assert best.status in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE)


@BOTH
def test_priority_beats_fairness_across_queues(settings: PlacementSettings) -> None:
    queues = [make_queue("root"), make_queue("a", "root", gpu_quota=8), make_queue("b", "root")]
    nodes = [make_node("n0")]
    low = [make_gang(f"low{i}", 1, queue="a", gpus=2, priority=50, created=i) for i in range(4)]
    high = make_gang("high", 1, queue="b", gpus=8, priority=80, created=99)
    result = run(snapshot(nodes, queues, [*low, high]), settings)
    assert placed(result) == {"high"}
