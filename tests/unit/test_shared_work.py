"""Work a cycle does once and reuses: the class ranking shared by the greedy's two passes
(``greedy.shared_index``) and the per-kind-of-node sizing kept while CP-SAT's patterns are
enumerated (``enumerate_patterns(sized=...)``)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from scheduler.cluster import GPU, GpuRequest, Node, Pod, Resources, Snapshot
from scheduler.cluster.node import GPU_MODEL_LABEL, Taint
from scheduler.framework.scoring import Candidate
from scheduler.plugins.fragmentation import FragmentationScorer, scorer_for_snapshot
from scheduler.solver import ClusterState, GangRequest, place_gangs
from scheduler.solver.greedy import shared_index
from scheduler.solver.hybrid import current_classes
from scheduler.solver.patterns import canonical, enumerate_patterns


def _node(name: str, gpus: int, cpu: int, taint: bool = False) -> Node:
    return Node(
        name,
        Resources({"cpu": cpu, "memory": 256 << 30, GPU: gpus}),
        labels=((GPU_MODEL_LABEL, "A"),),
        taints=(Taint("dedicated", "x", "NoSchedule"),) if taint else (),
    )


def _pod(name: str, milli: int, count: int = 1, node: str | None = None) -> Pod:
    requests: dict[str, int] = {"cpu": 2000, "memory": 1 << 30}
    if milli >= 1000:
        requests[GPU] = count
    return Pod(
        uid=name,
        namespace="ns",
        name=name,
        requests=Resources(requests),
        gpu=GpuRequest(count, milli),
        gang=f"ns/{name}",
        queue="q",
        node_name=node,
        gpu_grant=tuple((d, milli) for d in range(count)) if node else (),
    )


def _cluster() -> tuple[Snapshot, list[GangRequest]]:
    """Nodes in several states (so many classes), a batch of mixed shapes whose size order
    differs from its admission order."""
    nodes = [_node(f"n{i}", 4, 16000 + 1000 * (i % 5), taint=i % 4 == 3) for i in range(12)]
    running = [_pod(f"r{i}", 1000, 1 + i % 3, node=f"n{i}") for i in range(0, 12, 2)]
    pending = [
        _pod("s1", 300),
        _pod("w1", 1000, 2),
        _pod("s2", 700),
        _pod("w2", 1000),
        _pod("s3", 500),
    ]
    snap = Snapshot(nodes=tuple(nodes), pods=(*running, *pending))
    return snap, [GangRequest(p.gang, "q", required=(p,)) for p in pending]


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    counts: list[int] = []
    score_many = FragmentationScorer.score_many

    def counted(self: FragmentationScorer, candidates: Sequence[Candidate]) -> list[float]:
        counts.append(len(candidates))
        return score_many(self, candidates)

    monkeypatch.setattr(FragmentationScorer, "score_many", counted)
    return counts


def _placed(result: object) -> dict[str, list[tuple[str, tuple[tuple[int, int], ...]]]]:
    return {
        k: [(a.node, a.gpu_grant) for a in v]
        for k, v in result.placed.items()  # type: ignore[attr-defined]
    }


def test_the_second_pass_reuses_the_first_passes_ranking(monkeypatch: pytest.MonkeyPatch) -> None:
    """After the first pass and its release, a pass in another order over the same index
    scores only classes the first never saw, and places exactly as a pass with a fresh index
    (the scores are the same ones)."""
    snap, gangs = _cluster()
    counts = _counting(monkeypatch)
    state = ClusterState.from_snapshot(snap)
    scorer = scorer_for_snapshot(snap)
    index = shared_index(state, scorer, gangs)
    try:
        first = place_gangs(state, gangs, scorer, index=index)
        for a in reversed(first.assignments):
            state.release(a.pod_uid)
        scored_first, counts[:] = sum(counts), []
        second = place_gangs(state, gangs[::-1], scorer, index=index)
        scored_second = sum(counts)
    finally:
        index.close()
    assert scored_first > 0 and scored_second < scored_first / 2, (scored_first, scored_second)
    fresh_state = ClusterState.from_snapshot(snap)
    fresh = place_gangs(fresh_state, gangs[::-1], scorer_for_snapshot(snap))
    assert _placed(second) == _placed(fresh)


def test_patterns_sized_once_per_kind_of_node() -> None:
    """With the sizing cache kept over a model's classes, every class gets the same patterns
    as without it, and the cache holds one entry per shape and kind of node (the tainted
    nodes refuse every shape: no pattern there)."""
    snap, gangs = _cluster()
    state = ClusterState.from_snapshot(snap)
    classes = current_classes(state)
    shapes = canonical([g.required[0] for g in gangs])
    demand = [1] * len(shapes)
    sized: dict[tuple[int, object], object] = {}
    for info in classes:
        plain = enumerate_patterns(info, shapes, demand, [], gpu="binpack", quality=None, cap=48)
        kept = enumerate_patterns(
            info,
            shapes,
            demand,
            [],
            gpu="binpack",
            quality=None,
            cap=48,
            sized=sized,  # type: ignore[arg-type]
        )
        assert kept.patterns == plain.patterns
        if info.node.taints:
            assert kept.patterns == []
    kinds = {info.key[0] for info in classes}
    assert len(classes) > len(kinds) > 1
    assert set(sized) == {(s, k) for s in range(len(shapes)) for k in kinds}
