"""The CP-SAT stage's quality measure with the fragmentation scorer: the batch is judged by
what it leaves free on the nodes, not pod by pod (issue #16)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from scheduler.cluster import GPU, Gang, GpuRequest, Node, Pod, Queue, Resources
from scheduler.cluster.node import GPU_MODEL_LABEL
from scheduler.cluster.snapshot import Snapshot
from scheduler.framework.scoring import PodDemand
from scheduler.plugins.fragmentation import (
    MIB,
    PRICE_WEIGHT,
    FragmentationScorer,
    TaskType,
    WorkloadMix,
    scorer_for_snapshot,
)
from scheduler.plugins.packing import PackingScorer, node_cost
from scheduler.solver import solve
from scheduler.solver.placement import PlacementSettings, PodAssignment
from scheduler.solver.quality import FragmentationQuality, PackingQuality, quality_for
from scheduler.solver.state import ClusterState


def _node(name: str, gpus: int, model: str = "G2") -> Node:
    return Node(
        name,
        Resources({"cpu": 32000, "memory": 64 << 30, GPU: gpus}),
        labels=((GPU_MODEL_LABEL, model),),
    )


def _pod(name: str, milli: int) -> Pod:
    return Pod(
        uid=name,
        namespace="ns",
        name=name,
        requests=Resources({"cpu": 1000, "memory": 1 << 30}),
        gpu=GpuRequest(1, milli) if milli < 1000 else GpuRequest(1),
        gang=f"ns/{name}",
        queue="q",
    )


def _mix() -> WorkloadMix:
    mix = WorkloadMix()
    mix.add(TaskType(1000, 1024, 1, 300, ("T4",)), 3)
    mix.add(TaskType(1000, 1024, 1, 500), 2)
    mix.add(TaskType(2000, 2048, 2, 1000), 1)
    return mix


class _View:
    def __init__(self, node: Node, gpu_free: tuple[int, ...]) -> None:
        self.node = node
        self.free = {"cpu": 16000, "memory": 32 << 30}
        self.gpu_free = gpu_free


def test_the_cost_change_of_a_placement_is_the_scorer_score() -> None:
    """Greedy and model judge a placement alike: cost(after) - cost(before) is the scorer's
    score of it (fragmentation change plus the model scarcity of what it takes), to the
    rounding of a thousandth and the scorer's sub-unit tie-break."""
    scorer = FragmentationScorer(_mix(), ["G2", "T4"], capacity=lambda: {"T4": 2000, "G2": 8000})
    quality = FragmentationQuality(scorer)
    node = _node("t", 2, "T4")
    view = _View(node, (1000, 600))
    scorer._mix("T4")
    assert scorer.scarcity["T4"] > 0  # the scarcity part is in play
    demand = PodDemand(Resources({"cpu": 1000, "memory": 1 << 30}), 1, 500)
    after = {"cpu": 15000, "memory": 31 << 30}
    for grant, devices in (([(0, 500)], [500, 600]), ([(1, 500)], [1000, 100])):
        before_cost, after_cost = quality.costs(node, [(view.free, [1000, 600]), (after, devices)])
        score = scorer.score(view, demand, grant)
        assert after_cost - before_cost == pytest.approx(score, abs=1.0)


def test_many_states_are_measured_as_one_by_one() -> None:
    scorer = FragmentationScorer(_mix(), ["G2", "T4"])
    rnd = random.Random(7)
    rows = [
        (
            rnd.randrange(0, 9000),
            rnd.randrange(0, 9000),
            tuple(rnd.randrange(-5, 1001) for _ in range(4)),
        )
        for _ in range(50)
    ]
    rows += rows[:5]  # repeats come from the memo
    many = scorer.node_fragmentations(rows, "G2")
    one = [
        FragmentationScorer(_mix(), ["G2", "T4"]).node_fragmentation(c, m, list(g), "G2")
        for c, m, g in rows
    ]
    assert many == pytest.approx(one)


def test_costs_lie_within_the_span() -> None:
    scorer = FragmentationScorer(_mix(), ["G2", "T4"], capacity=lambda: {"T4": 1000, "G2": 1000})
    quality = FragmentationQuality(scorer)
    rnd = random.Random(3)
    for model in ("T4", "G2"):
        node = _node("n", 4, model)
        states = [
            ({"cpu": rnd.randrange(0, 32000), "memory": rnd.randrange(0, 64) << 30},
             [rnd.choice([0, 100, 500, 1000]) for _ in range(4)])
            for _ in range(40)
        ]  # fmt: skip
        costs = quality.costs(node, states)
        assert all(0 <= c <= quality.span(node) for c in costs)
        assert max(costs) > 0
    # Nodes of several models and sizes measured together: as one by one.
    items = [
        (_node(f"n{i}", gpus, model), ({"cpu": 4000 * i, "memory": 8 << 30}, [300] * gpus))
        for i, (gpus, model) in enumerate([(2, "T4"), (4, "G2"), (2, "T4"), (2, "G2"), (4, "T4")])
    ]
    assert quality.node_costs(items) == [quality.costs(n, [st])[0] for n, st in items]
    packing = PackingQuality("binpack", "binpack")
    assert packing.node_costs(items) == [packing.costs(n, [st])[0] for n, st in items]


def test_the_measure_follows_the_scorer() -> None:
    packing = quality_for(PackingScorer(), "binpack", "binpack")
    assert isinstance(packing, PackingQuality)
    node = _node("n", 2)
    state = ({"cpu": 1000}, [1000, 300])
    assert packing.costs(node, [state]) == [node_cost(node, *state, "binpack", "binpack")]
    assert isinstance(
        quality_for(FragmentationScorer(), "binpack", "binpack"), FragmentationQuality
    )
    assert quality_for(object(), "binpack", "binpack") is None  # type: ignore[arg-type]


def _left_free(snap: Snapshot, assignments: tuple[PodAssignment, ...]) -> float:
    """Fragmentation the assignments add to the nodes they land on, for the cluster's mix."""
    state = ClusterState.from_snapshot(snap)
    scorer = scorer_for_snapshot(snap, price_weight=0.0)

    def frag(name: str) -> float:
        s = state.nodes[name]
        return scorer.node_fragmentation(
            s.free.get("cpu", 0), s.free.get("memory", 0) // MIB, s.gpu_free, s.node.gpu_model
        )

    touched = {a.node for a in assignments}
    before = sum(frag(n) for n in touched)
    for a in assignments:
        state.apply(a)
    return sum(frag(n) for n in touched) - before


def test_the_model_places_the_batch_for_what_it_leaves_free() -> None:
    """Two nodes of two devices; the batch is a whole GPU, a 500 share and two 300 shares.
    Pod by pod (in either order the greedy tries) the two 300s end up on different nodes;
    judged as a batch, the model puts them on one device, beside a free one, and the whole
    GPU and the 500 share together on the other node: less stranded for the same pods."""
    pods = (_pod("p0", 1000), _pod("p1", 500), _pod("p2", 300), _pod("p3", 300))
    snap = Snapshot(
        nodes=(_node("n0", 2), _node("n1", 2)),
        pods=pods,
        gangs=tuple(Gang("ns", p.name, queue="q", creation_time=i) for i, p in enumerate(pods)),
        queues=(Queue("q"),),
    )
    # Fragmentation alone (no share prices): what the batch objective adds to the greedy.
    plain = PlacementSettings(scoring="fragmentation", share_price_weight=0.0)
    greedy = solve(snap, replace(plain, greedy_only=True))
    batch = solve(snap, plain)
    assert {a.pod_uid for a in batch.assignments} == {p.uid for p in pods}
    assert {a.pod_uid for a in greedy.assignments} == {p.uid for p in pods}
    assert batch.status.value in ("OPTIMAL", "FEASIBLE")
    assert _left_free(snap, batch.assignments) < _left_free(snap, greedy.assignments) - 1
    where = {a.pod_uid: (a.node, a.gpu_grant[0][0]) for a in batch.assignments}
    assert where["p2"] == where["p3"]
    # With the share prices (the default) a 300 beside the 500 spoils room a 500 could use
    # (this batch's mix is half 300s), so the greedy alone already pairs the 300s.
    priced = solve(snap, replace(plain, greedy_only=True, share_price_weight=PRICE_WEIGHT))
    assert _left_free(snap, priced.assignments) == pytest.approx(
        _left_free(snap, batch.assignments)
    )
    where = {a.pod_uid: (a.node, a.gpu_grant[0][0]) for a in priced.assignments}
    assert where["p2"] == where["p3"]


def test_a_model_answer_is_kept_only_for_a_real_gain() -> None:
    """The model's quality is an estimate (merged classes, canonical packing); the answer
    measured on the real nodes decides. A 300 share beside a 700 one fills a device; on an
    empty node it strands 700: that answer is refused against the filling one, and the
    filling one is taken against it."""
    from scheduler.cluster import PodPhase
    from scheduler.solver import GangRequest
    from scheduler.solver.cpsat import CpResult
    from scheduler.solver.hybrid import _quality_only_worse

    running = Pod(
        uid="r",
        namespace="ns",
        name="r",
        requests=Resources({"cpu": 1000, "memory": 1 << 30}),
        gpu=GpuRequest(1, 700),
        gang="ns/r",
        queue="q",
        node_name="n0",
        phase=PodPhase.RUNNING,
        gpu_grant=((0, 700),),
    )
    share = _pod("s", 300)
    snap = Snapshot(nodes=(_node("n0", 1), _node("n1", 1)), pods=(running, share))
    state = ClusterState.from_snapshot(snap)
    quality = FragmentationQuality(scorer_for_snapshot(snap))
    gang = GangRequest("ns/s", "q", required=(share,))
    fill = PodAssignment("s", "ns/s", "ns/s", "n0", ((0, 300),))
    strand = PodAssignment("s", "ns/s", "ns/s", "n1", ((0, 300),))
    first = CpResult("OPTIMAL", 0, 0, 0, admitted={"ns/s"})
    for applied, hint, worse in ((strand, fill, True), (fill, strand, False)):
        state.apply(applied)
        got = _quality_only_worse(
            state, [gang], [applied], first, {"ns/s": [hint]}, {"ns/s"}, quality
        )
        state.release(applied.pod_uid)
        assert got is worse
    # Another set of gangs admitted: admission decided, quality is not compared.
    state.apply(strand)
    assert not _quality_only_worse(state, [gang], [strand], first, {}, set(), quality)
