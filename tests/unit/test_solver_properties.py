"""Property tests: on random snapshots every placement respects the hard rules.

The checks here are written from scratch against the domain types (not via
``scheduler.solver.validate``), so the validator is tested too.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.bench.synthetic import make_gang, make_node, make_pod, make_queue
from scheduler.cluster import GPU, Gang, Pod, Snapshot, Taint, Toleration, pod_queue_usage
from scheduler.fairness import compute_fair_shares
from scheduler.solver import Placement, PlacementSettings, solve, validate
from scheduler.solver.validate_evictions import validate_evictions

TAINT = Taint("dedicated", "x")
TOLERATION = Toleration("dedicated", "Equal", "x")


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    nodes = []
    running: list[Pod] = []
    for i in range(draw(st.integers(1, 5))):
        gpus = draw(st.sampled_from([0, 1, 2, 4, 8]))
        node = make_node(
            f"n{i}",
            gpus=gpus,
            cpu=draw(st.sampled_from([4, 16, 64])),
            memory_gib=64,
            labels={"zone": draw(st.sampled_from(["a", "b"]))},
            taints=[TAINT] if draw(st.booleans()) and i > 0 else [],
            unschedulable=draw(st.integers(0, 9)) == 0,
            max_pods=draw(st.sampled_from([3, 110])),
        )
        nodes.append(node)
        used = draw(st.integers(0, gpus))
        if used:
            grant = tuple((d, 1000) for d in range(used))
            running.append(
                make_pod(f"run{i}", queue="a", gpus=used, cpu=1, node=node.name, grant=grant)
            )
    limit = draw(st.sampled_from([-1, 2, 6]))
    quota = draw(st.sampled_from([0, 2, 8]))
    queues = [
        make_queue("root", gpu_limit=draw(st.sampled_from([-1, 10]))),
        make_queue("a", "root", gpu_quota=quota, gpu_limit=limit),
        make_queue("b", "root", gpu_weight=2, gpu_quota=quota),
    ]
    gangs: list[tuple[Gang, list[Pod]]] = []
    for g in range(draw(st.integers(1, 7))):
        kind = draw(st.sampled_from(["whole", "frac", "cpu"]))
        extra: dict[str, object] = {}
        if kind == "whole":
            extra["gpus"] = draw(st.sampled_from([1, 2, 4]))
        elif kind == "frac":
            extra["fraction"] = draw(st.sampled_from([0.25, 0.5, 0.75]))
        if draw(st.booleans()):
            extra["tolerations"] = [TOLERATION]
        if draw(st.integers(0, 3)) == 0:
            extra["selector"] = {"zone": "a"}
        size = draw(st.integers(1, 4))
        gangs.append(
            make_gang(
                f"g{g}",
                size,
                queue=draw(st.sampled_from(["a", "b"])),
                min_member=draw(st.integers(1, size)),
                priority=draw(st.sampled_from([50, 100])),
                cpu=draw(st.sampled_from([1, 4, 8])),
                memory_gib=4,
                created=float(g),
                **extra,  # type: ignore[arg-type]
            )
        )
    pods = [p for _, ps in gangs for p in ps] + running
    all_gangs = [g for g, _ in gangs] + [Gang(p.namespace, p.name, 1, p.queue) for p in running]
    return Snapshot(tuple(nodes), tuple(pods), tuple(all_gangs), tuple(queues))


def check(full: Snapshot, placement: Placement) -> None:
    pods = {p.uid: p for p in full.pods}
    # Evicted pods leave: what they hold is where the gangs waiting for them go.
    gone = placement.freed
    snap = replace(full, pods=tuple(p for p in full.pods if p.uid not in gone))
    nodes = snap.node_by_name
    states = snap.node_states()
    load: dict[str, Counter[str]] = defaultdict(Counter)
    count: Counter[str] = Counter(p.node_name or "" for p in snap.pods if p.bound and p.active)
    device: Counter[tuple[str, int]] = Counter()
    for a in placement.assignments:
        pod, node = pods[a.pod_uid], nodes[a.node]
        assert pod.pending
        assert node.schedulable
        for taint in node.taints:
            assert any(t.tolerates(taint) for t in pod.tolerations)
        labels = node.label_map
        assert all(labels.get(k) == v for k, v in pod.node_selector)
        load[a.node].update(pod.requests)
        count[a.node] += 1
        for d, m in a.gpu_grant:
            device[(a.node, d)] += m
        want = pod.gpu.count if pod.gpu else 0
        assert len({d for d, _ in a.gpu_grant}) == want == len(a.gpu_grant)
    for name, extra in load.items():
        st_ = states[name]
        for r, v in extra.items():
            assert st_.used[r] + v <= st_.node.allocatable[r], (name, r)
        assert count[name] <= st_.node.allocatable["pods"]
        assert st_.used[GPU] + extra[GPU] <= st_.node.gpu_count
    for (name, d), m in device.items():
        assert m <= states[name].gpu_free[d]
    per_gang = Counter(a.gang for a in placement.assignments)
    for gang in snap.gangs:
        members = snap.pods_by_gang.get(gang.key, [])
        running = sum(1 for p in members if p.bound)
        if per_gang[gang.key]:
            assert running + per_gang[gang.key] >= gang.min_member
    used: Counter[str] = Counter()
    for p in snap.pods:
        if p.bound:
            used[p.queue] += pod_queue_usage(p)["gpu"]
    for a in placement.assignments:
        used[pods[a.pod_uid].queue] += sum(m for _, m in a.gpu_grant)
    tree = snap.queue_tree
    added = {pods[a.pod_uid].queue for a in placement.assignments if a.gpu_grant}
    for q in tree:
        limit = q.resource("gpu").limit
        subtree = [q.name] if q.name != "root" else ["a", "b"]
        touched = any(s in added for s in subtree)
        if limit >= 0 and touched:
            assert sum(used[s] for s in subtree) <= limit, q.name


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(snapshots(), st.booleans(), st.booleans(), st.sampled_from(["binpack", "spread"]))
def test_placements_respect_every_hard_rule(
    snap: Snapshot, greedy_only: bool, staged: bool, strategy: str
) -> None:
    settings_ = PlacementSettings(
        gpu_strategy="spread" if strategy == "spread" else "binpack",
        greedy_only=greedy_only,
        time_limit_seconds=0.3,
        max_model_classes=2,
        lower_tier_stages=staged,
    )
    placement = solve(snap, settings_)
    check(snap, placement)
    evicted = placement.freed
    assert validate(snap, placement.assignments, evicted=evicted) == []
    nominated = [a for a in placement.assignments if a.gang in placement.waits_for]
    plain = [a for a in placement.assignments if a.gang not in placement.waits_for]
    found = validate_evictions(
        snap,
        compute_fair_shares(snap),
        plain,
        nominated,
        placement.evictions,
        placement.waits_for,
        settings_,
    )
    assert found == []
    by_uid = {p.uid: p for p in snap.pods}
    evicted_milli = sum(pod_queue_usage(by_uid[e.pod_uid])["gpu"] for e in placement.evictions)
    assert evicted_milli >= placement.min_evicted_gpu_milli  # a lower bound holds
    assert not placement.violations
    pending = {g.key for g in snap.gangs if any(p.pending for p in snap.pods_by_gang[g.key])}
    assert set(placement.outcomes) == pending
    for outcome in placement.outcomes.values():
        assert outcome.placed == bool(outcome.pods)
        assert outcome.placed or outcome.reason_code


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_cpsat_never_worse_than_greedy(snap: Snapshot) -> None:
    placement = solve(snap, PlacementSettings(time_limit_seconds=0.3))
    assert placement.objective >= placement.greedy_objective
    if placement.best_bound:
        assert placement.objective <= placement.best_bound
