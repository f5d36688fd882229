"""Scenario tests for taking back (docs/taking-back.md), in the KAI style: running and pending
gangs in -> who is evicted, under which rule, and who gets placed, out.

Every solve here is also checked by both validators (placement and evictions).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from scheduler.bench.synthetic import make_gang, make_node, make_pod, make_queue
from scheduler.cluster import Gang, Node, Pod, Queue, Snapshot
from scheduler.cluster.disruption import DisruptionBudget
from scheduler.fairness import compute_fair_shares
from scheduler.solver import Placement, PlacementSettings, solve, validate
from scheduler.solver.placement import Eviction
from scheduler.solver.validate_evictions import validate_evictions

NOW = 10_000.0
GREEDY = PlacementSettings(greedy_only=True)
CPSAT = PlacementSettings(time_limit_seconds=2.0)
BOTH = pytest.mark.parametrize("settings", [GREEDY, CPSAT], ids=["greedy", "cpsat"])


def running(
    name: str,
    queue: str,
    placement: list[tuple[str, tuple[int, ...]]],
    *,
    priority: int = 0,
    started: float = 0.0,
    min_member: int | None = None,
    preemptible: bool | None = None,
) -> tuple[Gang, list[Pod]]:
    """A running gang: one pod per (node, devices) entry, each with those whole GPUs."""
    gang = Gang(
        "default",
        name,
        min_member=len(placement) if min_member is None else min_member,
        queue=queue,
        priority=priority,
        preemptible=priority < 100 if preemptible is None else preemptible,
        creation_time=started,
    )
    pods = [
        replace(
            make_pod(
                f"{name}-{i}",
                gang=name,
                queue=queue,
                gpus=len(devices),
                priority=priority,
                node=node,
                grant=tuple((d, 1000) for d in devices),
                created=started,
            ),
            start_time=started,
        )
        for i, (node, devices) in enumerate(placement)
    ]
    return gang, pods


def snap(
    nodes: list[Node],
    queues: list[Queue],
    *groups: tuple[Gang, list[Pod]],
    budgets: tuple[DisruptionBudget, ...] = (),
) -> Snapshot:
    return Snapshot(
        tuple(nodes),
        tuple(p for _, ps in groups for p in ps),
        tuple(g for g, _ in groups),
        tuple(queues),
        now=NOW,
        budgets=budgets,
    )


def run(s: Snapshot, settings: PlacementSettings = CPSAT) -> Placement:
    placement = solve(s, settings)
    evicted = placement.freed
    assert validate(s, placement.assignments, evicted=evicted) == []
    nominated = [a for a in placement.assignments if a.gang in placement.waits_for]
    plain = [a for a in placement.assignments if a.gang not in placement.waits_for]
    report = compute_fair_shares(s)
    assert (
        validate_evictions(
            s, report, plain, nominated, placement.evictions, placement.waits_for, settings
        )
        == []
    )
    return placement


def evicted_gangs(p: Placement) -> dict[str, str]:
    return {e.gang.split("/")[1]: e.action for e in p.evictions}


def placed(p: Placement) -> set[str]:
    return {k.split("/")[1] for k, o in p.outcomes.items() if o.placed}


def two_queues(a_quota: float = 8, b_quota: float = 8, **extra: object) -> list[Queue]:
    root = make_queue("root")
    a = make_queue("a", "root", gpu_quota=a_quota)
    b = make_queue("b", "root", gpu_quota=b_quota)
    return [root, replace(a, **extra), b]  # type: ignore[arg-type]


def full_of_a(started: float = 0.0, **kw: object) -> list[tuple[Gang, list[Pod]]]:
    """Queue a holds both 8-GPU nodes with four 4-GPU single-pod gangs."""
    return [
        running(
            f"a{i}",
            "a",
            [(f"n{i // 2}", tuple(range(4 * (i % 2), 4 * (i % 2) + 4)))],
            started=started + i,
            **kw,
        )  # type: ignore[arg-type]
        for i in range(4)
    ]


NODES = [make_node("n0"), make_node("n1")]


# --- reclaim -------------------------------------------------------------------------------


@BOTH
def test_reclaim_restores_starved_queue_to_fair_share_and_stops(
    settings: PlacementSettings,
) -> None:
    pending = [make_gang(f"b{i}", 1, queue="b", gpus=4, created=NOW - 10) for i in range(3)]
    p = run(snap(NODES, two_queues(), *full_of_a(), *pending), settings)
    actions = evicted_gangs(p)
    assert len(actions) == 2 and set(actions.values()) == {"reclaim"}
    assert p.min_evicted_gpu_milli == 8000  # two 4-GPU gangs on a full cluster
    assert len(placed(p) & {"b0", "b1", "b2"}) == 2
    # Queue a keeps exactly its fair share (8 GPUs): two of its four gangs stay.
    gone = {f"default/{g}" for g in actions}
    assert sum(1 for g in ("a0", "a1", "a2", "a3") if f"default/{g}" not in gone) == 2
    # Each preemptor waits for the pods evicted for it, and the message says why.
    for gang, uids in p.waits_for.items():
        assert uids and all(e.for_gang == gang for e in p.evictions if e.pod_uid in uids)
    assert all("below its fair share" in e.message for e in p.evictions)


@BOTH
def test_no_reclaim_ping_pong_after_fair_share_is_reached(settings: PlacementSettings) -> None:
    """After the reclaim, queue a's evicted gangs come back pending: nothing is evicted."""
    s = snap(
        NODES,
        two_queues(),
        running("a0", "a", [("n0", (0, 1, 2, 3))]),
        running("a1", "a", [("n0", (4, 5, 6, 7))]),
        running("b0", "b", [("n1", (0, 1, 2, 3))], started=NOW - 5),
        running("b1", "b", [("n1", (4, 5, 6, 7))], started=NOW - 5),
        make_gang("a2", 1, queue="a", gpus=4, created=NOW - 5),
        make_gang("a3", 1, queue="a", gpus=4, created=NOW - 5),
    )
    p = run(s, settings)
    assert p.evictions == ()
    assert not placed(p)


@BOTH
def test_reclaimer_never_goes_above_its_fair_share(settings: PlacementSettings) -> None:
    # b deserves 8 GPUs; an 12-GPU gang would take it above: no reclaim for it.
    pending = make_gang("big", 3, queue="b", gpus=4, created=NOW - 10)
    p = run(snap(NODES, two_queues(), *full_of_a(), pending), settings)
    assert p.evictions == ()
    assert p.outcomes["default/big"].reason


@BOTH
def test_reclaim_judged_where_branches_meet(settings: PlacementSettings) -> None:
    """Two teams under dept-x (quota 8) and dept-y (quota 8). x1 and x2 share dept-x's
    8 GPUs; y is idle so x borrowed. y1 reclaims from x; x2 (in x's own branch) may not
    reclaim from x1 even though x2 is below its own leaf share."""
    queues = [
        make_queue("root"),
        make_queue("x", "root", gpu_quota=8),
        make_queue("y", "root", gpu_quota=8),
        make_queue("x1", "x", gpu_quota=4),
        make_queue("x2", "x", gpu_quota=4),
        make_queue("y1", "y", gpu_quota=8),
    ]
    held = [
        running(
            f"h{i}", "x1", [(f"n{i // 2}", tuple(range(4 * (i % 2), 4 * (i % 2) + 4)))], started=i
        )
        for i in range(4)
    ]
    y = make_gang("y", 1, queue="y1", gpus=4, created=NOW - 1)
    p = run(snap(NODES, queues, *held, y), settings)
    assert set(evicted_gangs(p).values()) == {"reclaim"}
    assert "y" in placed(p)


# --- preemption ----------------------------------------------------------------------------


@BOTH
def test_preemption_by_priority_inside_one_queue_only(settings: PlacementSettings) -> None:
    queues = [
        make_queue("root"),
        make_queue("a", "root", gpu_quota=16),
        make_queue("b", "root", gpu_quota=0, gpu_weight=0),
    ]
    hi_a = make_gang("hi-a", 1, queue="a", gpus=4, priority=75, created=NOW - 1)
    hi_b = make_gang("hi-b", 1, queue="b", gpus=4, priority=75, created=NOW - 1)
    p = run(snap(NODES, queues, *full_of_a(priority=50), hi_a, hi_b), settings)
    assert set(evicted_gangs(p).values()) == {"preempt"}
    assert len(evicted_gangs(p)) == 1
    assert "hi-a" in placed(p) and "hi-b" not in placed(p)
    assert all("priority 75" in e.message for e in p.evictions)


@BOTH
def test_equal_priority_does_not_preempt(settings: PlacementSettings) -> None:
    queues = [make_queue("root"), make_queue("a", "root", gpu_quota=16)]
    same = make_gang("same", 1, queue="a", gpus=4, priority=50, created=NOW - 1)
    p = run(snap(NODES, queues, *full_of_a(priority=50), same), settings)
    assert p.evictions == ()


@BOTH
def test_non_preemptible_work_is_never_evicted(settings: PlacementSettings) -> None:
    queues = [make_queue("root"), make_queue("a", "root", gpu_quota=16)]
    top = make_gang("top", 1, queue="a", gpus=4, priority=200, created=NOW - 1)
    p = run(snap(NODES, queues, *full_of_a(priority=100), top), settings)
    assert p.evictions == ()
    assert "top" not in placed(p)


@BOTH
def test_preemption_policy_never_does_not_evict(settings: PlacementSettings) -> None:
    queues = [make_queue("root"), make_queue("a", "root", gpu_quota=16)]
    gang, pods = make_gang("polite", 1, queue="a", gpus=4, priority=75, created=NOW - 1)
    p = run(
        snap(NODES, queues, *full_of_a(priority=50), (replace(gang, may_preempt=False), pods)),
        settings,
    )
    assert p.evictions == ()


# --- elastic, least disruption, anti-thrash, budgets ----------------------------------------


@BOTH
def test_elastic_gang_shrinks_before_any_whole_gang_goes(settings: PlacementSettings) -> None:
    queues = [make_queue("root"), make_queue("a", "root", gpu_quota=16)]
    elastic = running(
        "elastic",
        "a",
        [("n0", (i, i + 1)) for i in range(0, 8, 2)],
        priority=50,
        min_member=2,
        started=5000,
    )
    whole = running("whole", "a", [("n1", tuple(range(8)))], priority=10, started=9000)
    want = make_gang("want", 1, queue="a", gpus=4, priority=75, created=NOW - 1)
    p = run(snap(NODES, queues, elastic, whole, want), settings)
    assert {e.action for e in p.evictions} == {"shrink"}
    assert len(p.evictions) == 2  # exactly minMember is left running
    assert "want" in placed(p)


@BOTH
def test_fewest_gpus_evicted_when_several_choices_are_valid(settings: PlacementSettings) -> None:
    queues = [make_queue("root"), make_queue("a", "root", gpu_quota=16)]
    small = running("small", "a", [("n0", (0, 1))], priority=50, started=100)
    big = running("big", "a", [("n1", tuple(range(8)))], priority=50, started=100)
    filler = running("filler", "a", [("n0", tuple(range(2, 8)))], priority=90, started=100)
    want = make_gang("want", 1, queue="a", gpus=2, priority=75, created=NOW - 1)
    p = run(snap(NODES, queues, small, big, filler, want), settings)
    assert set(evicted_gangs(p)) == {"small"}
    # The reported lower bound: two devices had to be freed, and two were.
    assert p.min_evicted_gpu_milli == 2000


def low_and_mid(settings: PlacementSettings) -> Placement:
    """Two whole nodes held by gangs of priority 10 and 40; a pending 8-GPU gang of 75."""
    queues = [make_queue("root"), make_queue("a", "root", gpu_quota=16)]
    low = running("low", "a", [("n0", tuple(range(8)))], priority=10, started=100)
    mid = running("mid", "a", [("n1", tuple(range(8)))], priority=40, started=9_900)
    want = make_gang("want", 1, queue="a", gpus=8, priority=75, created=NOW - 1)
    return run(snap(NODES, queues, low, mid, want), settings)


@BOTH
def test_lower_priority_victims_go_first(settings: PlacementSettings) -> None:
    assert set(evicted_gangs(low_and_mid(settings))) == {"low"}


@BOTH
def test_min_runtime_protects_young_gangs(settings: PlacementSettings) -> None:
    queues = two_queues(reclaim_min_runtime=600.0)
    pending = make_gang("b0", 1, queue="b", gpus=4, created=NOW - 10)
    young = full_of_a(started=NOW - 100)
    p = run(snap(NODES, queues, *young, pending), settings)
    assert p.evictions == ()
    old = full_of_a(started=NOW - 1000)
    p = run(snap(NODES, queues, *old, pending), settings)
    assert len(evicted_gangs(p)) == 1


@BOTH
def test_min_runtime_is_inherited_from_the_parent(settings: PlacementSettings) -> None:
    queues = two_queues()
    queues[0] = replace(queues[0], reclaim_min_runtime=600.0)
    pending = make_gang("b0", 1, queue="b", gpus=4, created=NOW - 10)
    p = run(snap(NODES, queues, *full_of_a(started=NOW - 100), pending), settings)
    assert p.evictions == ()


@BOTH
def test_preemption_delay_makes_the_gang_wait(settings: PlacementSettings) -> None:
    gang, pods = make_gang("b0", 1, queue="b", gpus=4, created=NOW - 100)
    delayed = (replace(gang, preemption_delay_seconds=300.0), pods)
    p = run(snap(NODES, two_queues(), *full_of_a(), delayed), settings)
    assert p.evictions == ()
    ready = (replace(gang, preemption_delay_seconds=60.0), pods)
    p = run(snap(NODES, two_queues(), *full_of_a(), ready), settings)
    assert len(p.evictions) == 1


@BOTH
def test_disruption_budget_steers_to_another_victim(settings: PlacementSettings) -> None:
    groups = full_of_a()
    protected = [p.uid for p in groups[3][1]]  # a3 started last: the cheapest victim
    pdb = DisruptionBudget("default", "keep-a3", tuple(protected), allowed=0)
    pending = make_gang("b0", 1, queue="b", gpus=4, created=NOW - 10)
    p = run(snap(NODES, two_queues(), *groups, pending, budgets=(pdb,)), settings)
    assert len(evicted_gangs(p)) == 1 and "a3" not in evicted_gangs(p)
    open_pdb = replace(pdb, allowed=1)
    p = run(snap(NODES, two_queues(), *groups, pending, budgets=(open_pdb,)), settings)
    assert set(evicted_gangs(p)) == {"a3"}


@BOTH
def test_gang_is_evicted_whole(settings: PlacementSettings) -> None:
    queues = [make_queue("root"), make_queue("a", "root", gpu_quota=16)]
    spread = running(
        "spread", "a", [("n0", (0, 1, 2, 3)), ("n1", (0, 1, 2, 3))], priority=10, started=100
    )
    rest = running("rest", "a", [("n0", (4, 5, 6, 7)), ("n1", (4, 5, 6, 7))], priority=60)
    want = make_gang("want", 1, queue="a", gpus=4, priority=75, created=NOW - 1)
    p = run(snap(NODES, queues, spread, rest, want), settings)
    assert Counter(e.gang for e in p.evictions) == {"default/spread": 2}


# --- consolidation -------------------------------------------------------------------------


def test_consolidation_moves_a_pod_only_when_it_fits_elsewhere() -> None:
    queues = [make_queue("root"), make_queue("a", "root", gpu_quota=16)]
    left = running("left", "a", [("n0", (0, 1, 2, 3))], priority=50, started=100)
    right = running("right", "a", [("n1", (0, 1, 2, 3))], priority=50, started=200)
    want = make_gang("want", 1, queue="a", gpus=8, priority=50, created=NOW - 1)
    p = run(snap(NODES, queues, left, right, want))
    assert [e.action for e in p.evictions] == ["consolidate"]
    assert "want" in placed(p)
    # Six GPUs used on each node: nothing can move, nothing is evicted.
    left6 = running("left", "a", [("n0", tuple(range(6)))], priority=50, started=100)
    right6 = running("right", "a", [("n1", tuple(range(6)))], priority=50, started=200)
    p = run(snap(NODES, queues, left6, right6, want))
    assert p.evictions == ()


@BOTH
def test_a_moved_gang_is_placed_before_anything_else(settings: PlacementSettings) -> None:
    """Consolidation promised a moved gang a place: while it restarts (``restoring``) it is
    admitted first, even before higher-priority work that would take the same room."""
    queues = [make_queue("root"), make_queue("a", "root", gpu_quota=8)]
    held = running("held", "a", [("n0", (0, 1, 2, 3))], priority=50, preemptible=False)
    moved = make_gang("moved", 1, queue="a", gpus=4, priority=50, created=NOW - 1)
    rival = make_gang("rival", 1, queue="a", gpus=4, priority=75, created=NOW - 100)
    s = snap([make_node("n0")], queues, held, moved, rival)
    assert placed(run(s, settings)) == {"rival"}
    assert placed(run(replace(s, restoring=frozenset({"default/moved"})), settings)) == {"moved"}


def test_consolidation_moves_a_pod_to_a_node_the_gang_cannot_use() -> None:
    """n0 has 2 GPUs free, too few for the new gang but room for the 2-GPU pod on n1; moving
    it frees 4 on n1. (Found by the side-by-side run against KAI-Scheduler.)"""
    queues = [make_queue("root"), make_queue("a", "root", gpu_quota=16)]
    fixed0 = running("fixed0", "a", [("n0", tuple(range(6)))], priority=100, started=100)
    fixed1 = running("fixed1", "a", [("n1", (0, 1, 2, 3))], priority=100, started=100)
    mover = running("mover", "a", [("n1", (4, 5))], priority=50, started=200)
    want = make_gang("want", 1, queue="a", gpus=4, priority=50, created=NOW - 1)
    p = run(snap(NODES, queues, fixed0, fixed1, mover, want))
    assert [(e.gang, e.action) for e in p.evictions] == [("default/mover", "consolidate")]
    assert "want" in placed(p)
    assert {a.node for a in p.outcomes["default/want"].pods} == {"n1"}


def test_consolidation_respects_the_pod_cap() -> None:
    queues = [make_queue("root"), make_queue("a", "root", gpu_quota=16)]
    # Four single-GPU pods in one gang on n0, spread so no 8-GPU node is free.
    left = running("left", "a", [("n0", (i,)) for i in range(4)], priority=50, started=100)
    right = running("right", "a", [("n1", (0, 1, 2, 3))], priority=50, started=200)
    want = make_gang("want", 1, queue="a", gpus=8, priority=50, created=NOW - 1)
    capped = PlacementSettings(time_limit_seconds=2.0, consolidation_max_pods=0)
    p = run(snap(NODES, queues, left, right, want), capped)
    assert p.evictions == ()


# --- the validator on its own --------------------------------------------------------------


def test_validator_rejects_partial_gangs_and_non_preemptible_victims() -> None:
    queues = [make_queue("root"), make_queue("a", "root", gpu_quota=16)]
    spread = running("spread", "a", [("n0", (0, 1, 2, 3)), ("n1", (0, 1, 2, 3))], priority=10)
    keep = running("keep", "a", [("n0", (4, 5, 6, 7))], priority=100)
    want_g, want_p = make_gang("want", 1, queue="a", gpus=4, priority=75, created=NOW - 1)
    s = snap(NODES, queues, spread, keep, (want_g, want_p))
    report = compute_fair_shares(s)
    from scheduler.solver.placement import PodAssignment

    nominated = [PodAssignment(want_p[0].uid, want_p[0].key, want_g.key, "n0", ((0, 1000),) * 1)]
    half = spread[1][0]
    evs = [Eviction(half.uid, half.key, half.gang, "a", "n0", "preempt", want_g.key)]
    found = validate_evictions(s, report, [], nominated, evs, {want_g.key: (half.uid,)}, CPSAT)
    assert any("evicted partly" in v for v in found)
    k = keep[1][0]
    evs = [Eviction(k.uid, k.key, k.gang, "a", "n0", "preempt", want_g.key)]
    found = validate_evictions(s, report, [], nominated, evs, {want_g.key: (k.uid,)}, CPSAT)
    assert any("not preemptible" in v for v in found)
    assert any("not above its own" in v for v in found)


def test_validator_rejects_reclaim_below_fair_share() -> None:
    groups = full_of_a()
    want_g, want_p = make_gang("b0", 1, queue="b", gpus=4, created=NOW - 1)
    s = snap(NODES, two_queues(), *groups, (want_g, want_p))
    report = compute_fair_shares(s)
    from scheduler.solver.placement import PodAssignment

    nominated = [PodAssignment(want_p[0].uid, want_p[0].key, want_g.key, "n0", ((0, 1000),))]
    victims = [p for _, ps in groups[:3] for p in ps]  # 12 of a's 16 GPUs: a ends at 4 < 8
    evs = [
        Eviction(v.uid, v.key, v.gang, "a", v.node_name or "", "reclaim", want_g.key)
        for v in victims
    ]
    found = validate_evictions(
        s, report, [], nominated, evs, {want_g.key: tuple(v.uid for v in victims)}, CPSAT
    )
    assert any("below its fair share" in v for v in found)


@BOTH
def test_gang_is_held_for_terminating_pods_instead_of_evicting_more(
    settings: PlacementSettings,
) -> None:
    """A new leader sees pods evicted before it started still terminating: the gang they
    were evicted for is held for them; nothing more is evicted."""
    queues = [make_queue("root"), make_queue("a", "root", gpu_quota=16)]
    low = [running(f"low{i}", "a", [("n0", (i,))], priority=10, started=100) for i in range(8)]
    leaving = [(g, [replace(p, deleting=True) for p in ps]) for g, ps in low[4:]]
    want = make_gang("want", 1, queue="a", gpus=4, priority=75, created=NOW - 1)
    p = run(snap([NODES[0]], queues, *low[:4], *leaving, want), settings)
    assert p.evictions == ()
    assert set(p.waits_for) == {"default/want"}
    assert set(p.waits_for["default/want"]) == {ps[0].uid for _, ps in leaving}
    assert "want" in placed(p)


@BOTH
def test_reclaim_next_to_a_victim_still_terminating_waits_for_it(
    settings: PlacementSettings,
) -> None:
    """The cycle after a reclaim: the victim is terminating and its device is already held
    for the gang it was evicted for. Another pending gang of the same queue reclaims on the
    same node; it waits for the terminating pod too (whose room this stage counts as free),
    and the plan passes the validator (it used to be refused whole: the terminating pod and
    the held one were both counted on the node, 9 GPUs of 8)."""
    queues = two_queues(a_quota=4, b_quota=4)
    a = [running(f"a{i}", "a", [("n0", (i,))], started=100) for i in range(5)]
    gx, (x,) = running("ax", "a", [("n0", (7,))], started=100)
    b = [running(f"b{i}", "b", [("n0", (5 + i,))], started=200) for i in range(2)]
    gf, (f,) = running("bf", "b", [("n0", (7,))], started=NOW)
    want = make_gang("bq", 1, queue="b", gpus=1, created=NOW - 5)
    s = snap(
        [NODES[0]],
        queues,
        *a,
        (gx, [replace(x, deleting=True)]),
        *b,
        (gf, [replace(f, nominated=True)]),
        want,
    )
    p = run(s, settings)
    assert "bq" in placed(p)
    assert set(evicted_gangs(p).values()) == {"reclaim"} and len(p.evictions) == 1
    assert x.uid in p.waits_for["default/bq"]
    assert p.evictions[0].pod_uid in p.waits_for["default/bq"]


def test_first_gang_is_tried_even_when_building_units_spends_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Building the victim units counts toward the stage's budget; on a cluster where that
    alone takes the whole budget, the first gang is still tried (taking back never stalls)."""
    import time

    import scheduler.solver.takeback as takeback
    from scheduler.solver.victims import Unit, build_units

    monkeypatch.setattr(takeback, "MIN_BUDGET_SHARE", 0.0)

    def slow_build(snapshot: Snapshot) -> list[Unit]:
        units = build_units(snapshot)
        deadline = time.perf_counter() + 0.05
        while time.perf_counter() < deadline:  # longer than the whole budget
            pass
        return units

    monkeypatch.setattr(takeback, "build_units", slow_build)
    queues = [
        make_queue("root"),
        make_queue("a", "root", gpu_quota=16),
        make_queue("b", "root", gpu_quota=0, gpu_weight=0),
    ]
    first = make_gang("hi-a", 1, queue="a", gpus=4, priority=75, created=NOW - 2)
    second = make_gang("hi-a2", 1, queue="a", gpus=4, priority=75, created=NOW - 1)
    settings = PlacementSettings(greedy_only=True, time_limit_seconds=0.001)
    p = run(snap(NODES, queues, *full_of_a(priority=50), first, second), settings)
    assert "hi-a" in placed(p)
    assert set(evicted_gangs(p).values()) == {"preempt"}
    # The budget was spent before the first gang: no second gang was started.
    assert "hi-a2" not in placed(p)


@pytest.mark.parametrize("least", [0.0, 100.0], ids=["time-left", "budget-spent"])
def test_a_gang_gets_its_model_only_within_the_budget(
    monkeypatch: pytest.MonkeyPatch, least: float
) -> None:
    """Past the cycle's budget a gang's victims are the greedy's choice (as placement keeps
    the greedy's answer when time runs out); within it, its CP-SAT model decides."""
    import scheduler.solver.takeback as takeback
    from scheduler.solver.takeback_model import solve_gang

    monkeypatch.setattr(takeback, "MIN_MODEL_SECONDS", least)
    asked: list[bool] = []

    def spy(*args: object, **kwargs: object) -> object:
        asked.append(bool(kwargs["greedy_only"]))
        return solve_gang(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(takeback, "solve_gang", spy)
    assert set(evicted_gangs(low_and_mid(CPSAT))) == {"low"}
    assert asked == [least > 0]
