"""The take-back stage's per-cycle shortcuts give what the per-unit code they replace gives:
actions_for against action_for unit by unit, and UnitIndex.per_node against sums over the
allowed units."""

from __future__ import annotations

from scheduler.bench.synthetic import ClusterSpec, synthetic_snapshot
from scheduler.fairness import compute_fair_shares
from scheduler.solver.greedy import GangRequest
from scheduler.solver.problem import build_problem
from scheduler.solver.takeback_greedy import UnitIndex
from scheduler.solver.takeback_model import unit_costs
from scheduler.solver.victims import action_for, actions_for, build_units


def _setup() -> tuple[object, object, list[GangRequest]]:
    snapshot = synthetic_snapshot(ClusterSpec(80, 8, 60, 0.8, 5, 0, (50, 50, 100), 0.5, 0.0))
    report = compute_fair_shares(snapshot)
    return snapshot, report, list(build_problem(snapshot, report).order)


def test_actions_for_is_action_for_per_unit() -> None:
    snapshot, report, order = _setup()
    units = build_units(snapshot)  # type: ignore[arg-type]
    assert units and order
    skip = {u.id for u in units[::7]}
    skip_gangs = {units[3].gang}
    allowed = 0
    for g in order:
        want = {}
        for u in units:
            if u.id in skip or u.gang in skip_gangs:
                continue
            act = action_for(g, u, snapshot.queue_tree, report, {}, snapshot.now)  # type: ignore[attr-defined,arg-type]
            if act is not None:
                want[u.id] = act
        got = actions_for(g, units, skip, skip_gangs, snapshot.queue_tree, report, {}, snapshot.now)  # type: ignore[attr-defined,arg-type]
        assert list(got.items()) == list(want.items())
        allowed += len(got)
    assert allowed  # the comparison saw units that may be taken


def test_per_node_totals_are_sums_over_the_allowed_units() -> None:
    snapshot, _, _ = _setup()
    units = build_units(snapshot)  # type: ignore[arg-type]
    cost = unit_costs(units, snapshot.now)  # type: ignore[attr-defined]
    index = UnitIndex(units, cost)
    nodes = sorted({n for u in units for n in u.nodes})
    accepting = set(nodes[::2])
    # Both ways of summing: most units allowed (totals minus the rest), and few.
    for allowed in ({u.id for u in units if u.id % 5}, {u.id for u in units if u.id % 5 == 0}):
        actions = {i: "preempt" for i in sorted(allowed)}
        want: dict[str, tuple[int, int, int]] = {}
        for i in actions:
            u = units[i]
            for n in u.nodes & accepting:
                dev = sum(len(p.gpu_grant) for p in u.pods if p.node_name == n)
                k, c, d = want.get(n, (0, 0, 0))
                want[n] = (k + 1, c + cost[i], d + dev)
        assert index.per_node(actions, accepting) == want  # type: ignore[arg-type]
        for n in want:
            least = min(cost[i] for i in actions if n in units[i].nodes)
            assert index.cheapest_on(n, actions) == least  # type: ignore[arg-type]
