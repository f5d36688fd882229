"""Model-aware scarcity in the fragmentation scorer, and the batch judged as a whole."""

from __future__ import annotations

import pytest

from scheduler.cluster import GPU, GpuRequest, Node, Pod, Resources
from scheduler.cluster.node import GPU_MODEL_LABEL
from scheduler.cluster.selectors import NodeSelectorRequirement, NodeSelectorTerm
from scheduler.cluster.snapshot import Snapshot
from scheduler.framework.scoring import PodDemand
from scheduler.plugins.fragmentation import (
    FragmentationScorer,
    TaskType,
    WorkloadMix,
    free_gpu_by_model,
    model_scarcity,
    pinned_demand,
)


def test_scarcity_is_pinned_demand_over_free_capacity() -> None:
    # Half the GPU demand may only run on T4, which has a tenth of the free capacity:
    # expected T4 demand 0.5 * 10000 = 5000 > 1000 free, so T4 is fully spoken for.
    free = {"T4": 1000, "G2": 9000}
    s = model_scarcity({("T4",): 500.0, (): 500.0}, free)
    assert s == {"T4": 1.0, "G2": 0.0}
    # A small pinned share: 0.05 * 10000 / 1000 = 0.5 of T4's room.
    s = model_scarcity({("T4",): 50.0, (): 950.0}, free)
    assert s["T4"] == pytest.approx(0.5) and s["G2"] == 0.0
    # A set of models shares its demand in proportion to their free capacity.
    s = model_scarcity({("T4", "V100"): 100.0, (): 900.0}, {"T4": 1000, "V100": 1000, "G2": 8000})
    assert s["T4"] == pytest.approx(0.5) and s["V100"] == pytest.approx(0.5)


def test_unpinned_and_covering_sets_and_empty_inputs_rank_nothing() -> None:
    free = {"T4": 1000, "G2": 9000}
    assert model_scarcity({(): 1000.0}, free) == {"T4": 0.0, "G2": 0.0}
    assert model_scarcity({("T4", "G2"): 1000.0}, free) == {"T4": 0.0, "G2": 0.0}
    assert model_scarcity({}, free) == {"T4": 0.0, "G2": 0.0}
    assert model_scarcity({("T4",): 10.0}, {"T4": 0, "G2": 0}) == {"T4": 0.0, "G2": 0.0}
    # A pin to a model with no free capacity left protects nothing.
    assert model_scarcity({("A10",): 10.0, (): 10.0}, free) == {"T4": 0.0, "G2": 0.0}


def test_pinned_demand_weighs_gpu_thousandths_and_skips_cpu_only() -> None:
    mix = WorkloadMix()
    mix.add(TaskType(1000, 1024, 1, 500, ("T4",)), 2)
    mix.add(TaskType(1000, 1024, 2, 1000))
    mix.add(TaskType(1000, 1024, 0, 0))
    assert pinned_demand(mix) == {("T4",): 1000.0, (): 2000.0}
    assert free_gpu_by_model([("T4", [1000, 300]), (None, []), ("T4", [-5])]) == {"T4": 1300}


def _view(model: str) -> object:
    class View:
        node = Node(
            f"n-{model}",
            Resources({"cpu": 32000, "memory": 64 << 30, GPU: 2}),
            labels=((GPU_MODEL_LABEL, model),),
        )
        free = {"cpu": 32000, "memory": 64 << 30}
        gpu_free = (1000, 1000)

    return View()


def test_a_pod_that_can_go_anywhere_leaves_the_scarce_model_alone() -> None:
    """Two identical empty nodes but for the model; T4 is spoken for by pods pinned to it.
    Without the capacity the scores tie (the tie-break does not see models); with it the
    unpinned pod scores the G2 node better."""
    mix = WorkloadMix()
    mix.add(TaskType(1000, 1024, 1, 500, ("T4",)), 5)
    mix.add(TaskType(1000, 1024, 1, 500), 5)
    demand = PodDemand(Resources({"cpu": 1000, "memory": 1 << 30}), 1, 500)
    plain = FragmentationScorer(mix, ["G2", "T4"])
    aware = FragmentationScorer(mix, ["G2", "T4"], capacity=lambda: {"T4": 2000, "G2": 8000})
    t4, g2 = _view("T4"), _view("G2")
    aware._mix("T4")  # builds the arrays, and with them the scarcity
    assert aware.scarcity["T4"] == 1.0 and aware.scarcity["G2"] == 0.0
    gap_plain = plain.score(t4, demand, [(0, 500)]) - plain.score(g2, demand, [(0, 500)])  # type: ignore[arg-type]
    gap_aware = aware.score(t4, demand, [(0, 500)]) - aware.score(g2, demand, [(0, 500)])  # type: ignore[arg-type]
    assert gap_aware == pytest.approx(gap_plain + 500)
    assert gap_aware > 0


def _pod(name: str, milli: int, model: str | None = None, cpu: int = 1000) -> Pod:
    affinity: tuple[NodeSelectorTerm, ...] = ()
    if model:
        affinity = (NodeSelectorTerm((NodeSelectorRequirement(GPU_MODEL_LABEL, "In", (model,)),)),)
    return Pod(
        uid=name,
        namespace="ns",
        name=name,
        requests=Resources({"cpu": cpu, "memory": 1 << 30}),
        gpu=GpuRequest(1, milli),
        affinity=affinity,
        gang=f"ns/{name}",
        queue="q",
    )


def _node(name: str, gpus: int, model: str) -> Node:
    return Node(
        name,
        Resources({"cpu": 32000, "memory": 64 << 30, GPU: gpus}),
        labels=((GPU_MODEL_LABEL, model),),
    )


def test_the_live_solve_keeps_the_scarce_model_for_the_pod_pinned_to_it() -> None:
    """Through ``solve()`` with ``scoring: fragmentation``: T4 has one device, G2 eight (four
    of them hold a 100-thousandths pod pinned to G2). The cycle's pods: an unpinned
    whole-GPU pod, then one pinned to T4. By popularity the G2-pinned pods dominate the mix,
    so fragmentation alone sends the unpinned pod to the T4 device (capacity those pods cannot
    use) and the pinned one finds no room; the scarcity term sees that T4's only device is
    spoken for and sends it to G2, and both run."""
    from scheduler.cluster import Gang, PodPhase, Queue
    from scheduler.solver import solve
    from scheduler.solver.placement import PlacementSettings

    running = [
        Pod(
            uid=f"r{i}",
            namespace="ns",
            name=f"r{i}",
            requests=Resources({"cpu": 1000, "memory": 1 << 30}),
            gpu=GpuRequest(1, 100),
            affinity=_pod(f"r{i}", 100, model="G2").affinity,
            gang=f"ns/r{i}",
            queue="q",
            node_name="g2",
            phase=PodPhase.RUNNING,
            gpu_grant=((i, 100),),
        )
        for i in range(4)
    ]
    snap = Snapshot(
        nodes=(_node("t4", 1, "T4"), _node("g2", 8, "G2")),
        pods=(*running, _pod("free", 1000), _pod("pinned", 1000, model="T4")),
        gangs=(
            *(Gang("ns", f"r{i}", queue="q") for i in range(4)),
            Gang("ns", "free", queue="q", creation_time=1),
            Gang("ns", "pinned", queue="q", creation_time=2),
        ),
        queues=(Queue("q"),),
    )
    placement = solve(snap, PlacementSettings(scoring="fragmentation", greedy_only=True))
    where = {a.pod_uid: a.node for a in placement.assignments}
    assert where == {"free": "g2", "pinned": "t4"}


def _batch(pods: list[Pod], gpus: int = 2) -> tuple[object, list[object], FragmentationScorer]:
    from scheduler.plugins.fragmentation import task_type
    from scheduler.solver import ClusterState, GangRequest

    state = ClusterState.from_snapshot(Snapshot(nodes=(_node("n", gpus, "T4"),), pods=tuple(pods)))
    scorer = FragmentationScorer()
    scorer.mix.extend(task_type(p) for p in pods)
    gangs = [GangRequest(p.gang, "q", required=(p,)) for p in pods]
    return state, gangs, scorer


def test_the_batch_placed_largest_first_when_that_admits_more_work() -> None:
    """A 500-thousandths pod ahead of a 2-GPU pod on a 2-device node: in admission order the
    share splits a device and the 2-GPU pod cannot start; largest first admits 2000
    thousandths instead of 500, and the state holds that answer."""
    from scheduler.solver import place_gangs
    from scheduler.solver.batch_order import better_batch

    share = _pod("share", 500)
    pair = Pod(
        uid="pair",
        namespace="ns",
        name="pair",
        requests=Resources({"cpu": 1000, "memory": 1 << 30, GPU: 2}),
        gpu=GpuRequest(2),
        gang="ns/pair",
        queue="q",
    )
    state, gangs, scorer = _batch([share, pair])
    fifo = place_gangs(state, gangs, scorer)  # type: ignore[arg-type]
    assert set(fifo.placed) == {"ns/share"}
    asks = {g.key: g.ask["gpu"] for g in gangs}  # type: ignore[attr-defined]

    def place(order: object) -> object:
        return place_gangs(state, order, scorer)  # type: ignore[arg-type]

    def admission(keys: set[str]) -> int:
        return sum(asks[k] for k in keys)

    got = better_batch(state, gangs, fifo, scorer, place, admission)  # type: ignore[arg-type]
    assert set(got.placed) == {"ns/pair"}
    assert sorted(state.nodes["n"].gpu_free) == [0, 0]  # type: ignore[attr-defined]


def test_the_admission_order_is_kept_when_largest_first_is_no_better() -> None:
    """Both orders place everything equally well: the admission-order answer stays, and the
    state holds it again after the second pass was tried."""
    from scheduler.solver import place_gangs
    from scheduler.solver.batch_order import better_batch

    pods = [_pod("a", 300), _pod("b", 700)]
    state, gangs, scorer = _batch(pods)
    fifo = place_gangs(state, gangs, scorer)  # type: ignore[arg-type]
    before = {a.pod_uid: (a.node, a.gpu_grant) for a in fifo.assignments}
    got = better_batch(
        state,  # type: ignore[arg-type]
        gangs,  # type: ignore[arg-type]
        fifo,
        scorer,
        lambda order: place_gangs(state, order, scorer),  # type: ignore[arg-type]
        lambda keys: len(keys),
    )
    assert got is fifo
    assert {u: (a.node, a.gpu_grant) for u, a in state.placed.items()} == before  # type: ignore[attr-defined]


def test_no_second_pass_for_other_scorers_or_batches_too_large(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Packing (the default) and a batch above the size cap: the batch is not placed again
    (``place`` is never called) and the first answer stands; within the cap it is."""
    from scheduler.plugins.packing import PackingScorer
    from scheduler.solver import batch_order, place_gangs
    from scheduler.solver.batch_order import better_batch

    share = _pod("share", 500)
    pair = Pod(
        uid="pair",
        namespace="ns",
        name="pair",
        requests=Resources({"cpu": 1000, "memory": 1 << 30, GPU: 2}),
        gpu=GpuRequest(2),
        gang="ns/pair",
        queue="q",
    )
    state, gangs, scorer = _batch([share, pair])
    fifo = place_gangs(state, gangs, scorer)  # type: ignore[arg-type]
    calls: list[object] = []

    def place(order: object) -> object:
        calls.append(order)
        return place_gangs(state, order, scorer)  # type: ignore[arg-type]

    def admission(keys: set[str]) -> int:
        return sum(2000 if k == "ns/pair" else 500 for k in keys)

    packing = PackingScorer("binpack", "binpack")
    assert better_batch(state, gangs, fifo, packing, place, admission) is fifo  # type: ignore[arg-type]
    monkeypatch.setattr(batch_order, "MAX_BATCH_GANGS", 1)
    assert better_batch(state, gangs, fifo, scorer, place, admission) is fifo  # type: ignore[arg-type]
    assert calls == []
    monkeypatch.setattr(batch_order, "MAX_BATCH_GANGS", 2)
    got = better_batch(state, gangs, fifo, scorer, place, admission)  # type: ignore[arg-type]
    assert len(calls) == 1 and set(got.placed) == {"ns/pair"}
