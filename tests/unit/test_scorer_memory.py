"""The fragmentation scorer kept across cycles, and the greedy's device check by class key."""

from __future__ import annotations

import pytest

from scheduler.cluster import GPU, Gang, GpuRequest, Node, Pod, PodPhase, Queue, Resources, Snapshot
from scheduler.cluster.node import GPU_MODEL_LABEL
from scheduler.framework.scoring import NodeView, PodDemand
from scheduler.plugins.fragmentation import (
    FragmentationScorer,
    TaskType,
    WorkloadMix,
    model_scarcity,
    pinned_demand,
    scorer_for_snapshot,
)
from scheduler.plugins.scorer_memory import ScorerMemory, mix_distance
from scheduler.solver import ClusterState, GangRequest, place_gangs, solve
from scheduler.solver.placement import PlacementSettings


def _node(name: str, gpus: int, model: str) -> Node:
    return Node(
        name,
        Resources({"cpu": 64000, "memory": 256 << 30, GPU: gpus}),
        labels=((GPU_MODEL_LABEL, model),),
    )


def _pod(name: str, milli: int, *, model: str | None = None, **kw: object) -> Pod:
    return Pod(
        uid=name,
        namespace="ns",
        name=name,
        requests=Resources({"cpu": 1000, "memory": 1 << 30}),
        gpu=GpuRequest(1, milli),
        gang=f"ns/{name}",
        queue="q",
        node_selector=((GPU_MODEL_LABEL, model),) if model else (),
        **kw,  # type: ignore[arg-type]
    )


def _snapshot(pods: list[Pod]) -> Snapshot:
    return Snapshot(
        nodes=(_node("a1", 4, "A"), _node("b1", 4, "B")),
        pods=tuple(pods),
        gangs=tuple(Gang("ns", p.name, queue="q") for p in pods),
        queues=(Queue("q"),),
    )


def _mix(*counts: tuple[int, float]) -> WorkloadMix:
    mix = WorkloadMix()
    for milli, n in counts:
        mix.add(TaskType(1000, 1024, 1, milli), n)
    return mix


def test_mix_distance_is_l1_between_distributions() -> None:
    assert mix_distance(_mix((500, 2)), _mix((500, 7))) == 0.0
    assert mix_distance(_mix((500, 1)), _mix((300, 1))) == 2.0
    # 3:1 against 1:1: |0.75 - 0.5| + |0.25 - 0.5|
    assert mix_distance(_mix((500, 3), (300, 1)), _mix((500, 1), (300, 1))) == pytest.approx(0.5)
    assert mix_distance(WorkloadMix(), WorkloadMix()) == 0.0
    assert mix_distance(WorkloadMix(), _mix((500, 1))) == 2.0


def test_close_mix_reuses_the_scorer_and_what_it_measured() -> None:
    """40 pods of one shape, then one more: the mix moved by 1/41 of one type, within the
    tolerance, so the second cycle gets the same scorer with its measured node states."""
    pods = [_pod(f"p{i}", 500) for i in range(40)]
    memory = ScorerMemory(tolerance=0.05)
    first = memory.scorer_for(_snapshot(pods))
    first.node_fragmentation(4000, 4096, (1000, 500), "A")
    measured = dict(first._memo)
    assert measured
    second = memory.scorer_for(_snapshot([*pods, _pod("late", 300)]))
    assert second is first
    assert (memory.built, memory.reused) == (1, 1)
    assert second.mix.counts != first_mix_counts(pods)  # it reads this cycle's pods
    assert second._memo == measured  # nothing was re-measured
    # A mix that moved further (half the pods now a new shape) gets a new scorer.
    third = memory.scorer_for(_snapshot([*pods, *(_pod(f"q{i}", 300) for i in range(40))]))
    assert third is not first
    assert (memory.built, memory.reused) == (2, 1)


def first_mix_counts(pods: list[Pod]) -> dict[TaskType, float]:
    return dict(scorer_for_snapshot(_snapshot(pods)).mix.counts)


def test_zero_tolerance_builds_every_cycle_unless_the_mix_is_identical() -> None:
    pods = [_pod(f"p{i}", 500) for i in range(4)]
    memory = ScorerMemory(tolerance=0.0)
    a = memory.scorer_for(_snapshot(pods))
    assert memory.scorer_for(_snapshot(pods)) is a  # identical distribution
    assert memory.scorer_for(_snapshot([*pods, _pod("x", 300)])) is not a


def test_a_reused_scorer_reads_what_is_free_this_cycle() -> None:
    """The model-scarcity term follows the free capacity of each cycle, as a fresh scorer's
    would; only the fragmentation measure is kept."""
    pods = [_pod(f"p{i}", 500, model="A") for i in range(4)]
    pods += [_pod(f"u{i}", 500) for i in range(36)]
    memory = ScorerMemory()
    first = memory.scorer_for(_snapshot(pods), {"A": 4000, "B": 4000})
    first.node_fragmentation(4000, 4096, (1000,), "A")  # first use: the measure is built
    early = dict(first.scarcity)
    later_free = {"A": 2000, "B": 4000}
    reused = memory.scorer_for(_snapshot(pods), later_free)
    assert reused is first
    fresh = scorer_for_snapshot(_snapshot(pods), later_free)
    fresh.node_fragmentation(4000, 4096, (1000,), "A")
    assert reused.scarcity == fresh.scarcity == model_scarcity(pinned_demand(fresh.mix), later_free)
    assert reused.scarcity != early


def test_solve_takes_the_memory_across_cycles() -> None:
    pods = [_pod(f"p{i}", 500) for i in range(3)]
    memory = ScorerMemory()
    settings = PlacementSettings(scoring="fragmentation")
    for _ in range(2):
        placement = solve(_snapshot(pods), settings, scorers=memory)
        assert len(placement.assignments) == 3
    assert (memory.built, memory.reused) == (1, 1)


class _Counting(FragmentationScorer):
    """Counts how often the greedy asks it to pick devices."""

    picks = 0

    def pick_devices(self, node: NodeView, demand: PodDemand) -> tuple[int, ...] | None:
        type(self).picks += 1
        return super().pick_devices(node, demand)


def _place_beside(
    node: Node, used: tuple[int, ...], gpu: GpuRequest
) -> list[tuple[tuple[int, int], ...]]:
    """Grants of a new pod asking ``gpu`` on ``node``, whose devices already hold ``used``;
    counts the picker's calls in ``_Counting.picks``."""
    running = [
        _pod(f"old{d}", u, node_name=node.name, phase=PodPhase.RUNNING, gpu_grant=((d, u),))
        for d, u in enumerate(used)
        if u
    ]
    new = Pod(
        uid="new",
        namespace="ns",
        name="new",
        requests=Resources({"cpu": 1000, "memory": 1 << 30}),
        gpu=gpu,
        gang="ns/new",
        queue="q",
    )
    snap = Snapshot(nodes=(node,), pods=(*running, new))
    _Counting.picks = 0
    result = place_gangs(
        ClusterState.from_snapshot(snap), [GangRequest("ns/new", "q", required=(new,))], _Counting()
    )
    return [a.gpu_grant for a in result.assignments]


@pytest.mark.parametrize(
    ("used", "count", "milli", "fits"),
    [
        ((500, 500, 500, 500), 1, 1000, False),  # 2000 free in all, no whole device
        ((500, 0, 500, 500), 1, 1000, True),
        ((500, 500, 300, 500), 2, 600, False),  # one device with 700 free: 2 x 600 needs two
        ((0, 500, 300, 500), 2, 600, True),
        ((500, 500, 300, 300), 2, 600, True),
        ((500, 500, 500, 300), 2, 600, False),
    ],
)
def test_devices_are_checked_on_the_class_before_any_picker(
    used: tuple[int, ...], count: int, milli: int, fits: bool
) -> None:
    """The class key's sorted free devices decide whether ``count`` devices of ``milli``
    exist; a class that fails costs no picker call, one that passes gets its devices."""
    placed = _place_beside(_node("a1", 4, "A"), used, GpuRequest(count, milli))
    if fits:
        (grant,) = placed
        assert len(grant) == count and all(used[i] + m <= 1000 for i, m in grant)
    else:
        assert placed == [] and _Counting.picks == 0


def test_a_kept_scorer_remembers_a_bounded_number_of_states() -> None:
    """It lives as long as the scheduler: past ``max_states`` its memo starts over."""
    memory = ScorerMemory(max_states=3)
    scorer = memory.scorer_for(_snapshot([_pod("p", 500)]))
    for free in range(0, 1000, 100):
        scorer.node_fragmentation(4000, 4096, (free, 1000), "A")
        assert len(scorer._memo) <= 4
    assert scorer.node_fragmentation(4000, 4096, (0, 1000), "A") == pytest.approx(
        scorer_for_snapshot(_snapshot([_pod("p", 500)])).node_fragmentation(
            4000, 4096, (0, 1000), "A"
        )
    )


@pytest.mark.parametrize(("used", "fits"), [((600, 600), False), ((600, 0), True)])
def test_a_request_by_gpu_memory_is_checked_once_sized_for_the_node(
    used: tuple[int, ...], fits: bool
) -> None:
    """8 GiB of a 16 GiB device is 500 thousandths there: it fits a device with 1000 free,
    not two with 400 (800 free in all)."""
    node = Node(
        "m1",
        Resources({"cpu": 64000, "memory": 256 << 30, GPU: 2}),
        labels=((GPU_MODEL_LABEL, "A"),),
        gpu_memory_mib=16 * 1024,
    )
    placed = _place_beside(node, used, GpuRequest(1, memory_mib=8 * 1024))
    if fits:
        assert placed == [((1, 500),)]
    else:
        assert placed == [] and _Counting.picks == 0


def test_score_many_equals_scoring_one_by_one() -> None:
    """Candidates of two models and two device counts, measured together, score exactly as
    they do alone (with the model-scarcity term on)."""
    import random

    from scheduler.framework.scoring import BatchScorer

    rng = random.Random(7)
    pods = [
        _pod(f"p{i}", rng.choice((300, 500, 1000)), model=rng.choice((None, "A")))
        for i in range(30)
    ]
    nodes = [_node(f"n{i}", rng.choice((2, 4)), rng.choice(("A", "B"))) for i in range(12)]

    class View:
        def __init__(self, node: Node, gpu_free: list[int], cpu: int) -> None:
            self.node = node
            self.gpu_free = gpu_free
            self.free = {"cpu": cpu, "memory": 64 << 30}

    candidates = []
    for n in nodes:
        gpus = n.allocatable[GPU]
        free = [rng.choice((0, 200, 500, 700, 1000)) for _ in range(gpus)]
        i = max(range(gpus), key=free.__getitem__)
        milli = min(free[i], rng.choice((300, 500)))
        demand = PodDemand(Resources({"cpu": 1000, "memory": 1 << 30}), 1, milli)
        candidates.append((View(n, free, rng.choice((2000, 16000))), demand, ((i, milli),)))
    batch = scorer_for_snapshot(_snapshot(pods), {"A": 3000, "B": 9000})
    alone = scorer_for_snapshot(_snapshot(pods), {"A": 3000, "B": 9000})
    assert isinstance(batch, BatchScorer)
    together = batch.score_many(candidates)
    assert batch.scarcity  # the term is on
    assert together == [alone.score(*c) for c in candidates]
    assert len(set(together)) > 3  # the candidates differ
