"""``python -m scheduler.bench solver --running-fill F``: clusters that make cycles reclaim."""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict

import pytest

from scheduler.bench.__main__ import main
from scheduler.bench.solver import after_evictions, evicted_gpus
from scheduler.bench.synthetic import OVER_QUOTA_LEAVES, ClusterSpec, synthetic_snapshot
from scheduler.cluster.pod import PodPhase
from scheduler.cluster.queue import pod_queue_usage
from scheduler.fairness import compute_fair_shares
from scheduler.solver.placement import Eviction, Placement, PodAssignment


def _gpu_by_queue(spec: ClusterSpec) -> tuple[dict[str, int], int]:
    snap = synthetic_snapshot(spec)
    held: dict[str, int] = defaultdict(int)
    for p in snap.pods:
        if p.bound:
            held[p.queue] += pod_queue_usage(p)["gpu"]
    return dict(held), sum(n.gpu_count for n in snap.nodes) * 1000


def test_running_fill_puts_preemptible_over_quota_gangs_on_the_cluster() -> None:
    spec = ClusterSpec(200, 8, 60, 0.7, 4, 0, (50, 100), running_fill=0.5)
    snap = synthetic_snapshot(spec)
    total = sum(n.gpu_count for n in snap.nodes) * 1000
    held, _ = _gpu_by_queue(spec)
    over = sum(held[q] for q in OVER_QUOTA_LEAVES)
    assert 0.45 * total <= over <= 0.55 * total
    assert 0.65 * total <= sum(held.values()) <= 0.75 * total  # --fill is the total
    report = compute_fair_shares(snap)
    for q in OVER_QUOTA_LEAVES:
        status = report.queues[q]
        assert status.allocated["gpu"] > 2 * status.quota["gpu"], q
    gangs = snap.gang_by_key
    pending = {p.gang for p in snap.pods if p.pending}
    assert pending and all(gangs[g].queue not in OVER_QUOTA_LEAVES for g in pending)
    over_gangs = [g for g in snap.gangs if g.name.startswith("over-")]
    assert over_gangs and all(g.preemptible and g.queue in OVER_QUOTA_LEAVES for g in over_gangs)
    assert {g.min_member for g in over_gangs} >= {1, 2, 3, 4}  # gangs spanning nodes
    over_pods = [p for p in snap.pods if p.gang.startswith("default/over-")]
    assert all(600 <= snap.now - p.start_time <= 7200 for p in over_pods)
    # Whole devices, never more than a node has, never shared with other running pods.
    for state in snap.node_states().values():
        assert all(0 <= free <= 1000 for free in state.gpu_free)
    # The other leaves stay below their quota: they are the ones that reclaim.
    for q, status in report.queues.items():
        if q.count("-") == 2 and q not in OVER_QUOTA_LEAVES:
            assert status.allocated["gpu"] < status.quota["gpu"], q


def test_without_running_fill_the_snapshots_are_the_same_as_before() -> None:
    """Benchmarks and solver tests rely on the seeds: running_fill 0 draws exactly as before
    it existed (fingerprint taken from the generator without running_fill)."""
    plain = synthetic_snapshot(ClusterSpec(40, 8, 20, 0.7, 2, 0, (50, 100)))
    rows: list[object] = [
        (p.uid, p.node_name, p.gpu_grant, p.queue, p.priority, sorted(p.requests.items()))
        for p in plain.pods
    ]
    rows += [(g.key, g.queue, g.min_member, g.priority, g.preemptible) for g in plain.gangs]
    assert hashlib.sha256(repr(rows).encode()).hexdigest()[:16] == "1d3848649e3c248c"
    assert not any(g.name.startswith("over-") for g in plain.gangs)


def test_after_evictions_frees_the_victims_and_counts_their_gpus() -> None:
    snap = synthetic_snapshot(ClusterSpec(20, 8, 5, 0.7, 1, 0, (50,), running_fill=0.5))
    victims = [p for p in snap.pods if p.gang.startswith("default/over-")][:3]
    moved = victims[2]
    placement = Placement(
        assignments=(PodAssignment(moved.uid, moved.key, moved.gang, "node-00000", ()),),
        evictions=tuple(
            Eviction(v.uid, v.key, v.gang, v.queue, v.node_name or "", "reclaim", "x/y")
            for v in victims
        ),
    )
    after = after_evictions(snap, placement)
    uids = {p.uid: p for p in after.pods}
    assert victims[0].uid not in uids and victims[1].uid not in uids
    again = uids[moved.uid]
    assert again.pending and again.phase == PodPhase.PENDING and not again.gpu_grant
    assert len(after.pods) == len(snap.pods) - 2
    gpus = sum(pod_queue_usage(v)["gpu"] for v in victims) / 1000
    assert evicted_gpus(snap, placement) == gpus > 0
    assert after_evictions(snap, Placement()) is snap


def _bench(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, object]:
    args = ["solver", "--nodes", "30", "--gangs", "30", "--cycles", "2", "--greedy-only"]
    assert main([*args, "--time-limit", "0.2", *extra]) == 0
    data: dict[str, object] = json.loads(capsys.readouterr().out)
    return data


def test_bench_prints_evicted_gpus_per_cycle(capsys: pytest.CaptureFixture[str]) -> None:
    """The eviction numbers come from the solver's take-back stage."""
    data = _bench(capsys, "--running-fill", "0.5")
    assert data["running_fill"] == 0.5 and data["take_back"] is True
    assert data["validator"] == "ok"
    evicted = data["evicted_gpus"]
    assert isinstance(evicted, list) and len(evicted) == 2
    assert sum(evicted) > 0, "the pending gangs should reclaim from the over-quota queues"
    assert "reclaim" in data["evictions_by_action"]  # type: ignore[operator]
    for key in ("cycle_seconds_p50", "peak_rss_mb", "evicted_gpus_p50", "evicted_pods"):
        assert key in data, key


def test_bench_without_take_back_evicts_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    data = _bench(capsys, "--running-fill", "0.5", "--no-take-back")
    assert data["take_back"] is False
    assert data["evicted_gpus"] == [0.0, 0.0] and data["evictions_by_action"] == {}


def test_bench_rejects_a_running_fill_outside_0_to_1() -> None:
    with pytest.raises(SystemExit, match="running-fill"):
        main(["solver", "--running-fill", "1.5"])
