"""Fragmentation measure: hand-computed cases, incremental == from scratch, live scorer."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cluster import GPU, Gang, GpuRequest, Node, Pod, PodPhase, Resources, Snapshot
from scheduler.cluster.node import GPU_MODEL_LABEL
from scheduler.plugins.fragmentation import (
    Candidates,
    FragmentationScorer,
    TaskType,
    WorkloadMix,
    candidate_fragmentation,
    device_sums,
    fragmentation,
)

MODELS = ["A", "B"]


def frag_of(
    mix: WorkloadMix, gpu: list[int], cpu: int = 10**6, mem: int = 10**6, model: int = 0
) -> float:
    arrays = mix.arrays(MODELS)
    g = np.array([gpu], dtype=np.int64)
    return float(
        fragmentation(
            arrays,
            g.sum(axis=1),
            device_sums(g, arrays.thresholds),
            np.array([cpu]),
            np.array([mem]),
            np.array([model]),
        )[0]
    )


def one_type(task: TaskType, measure: str = "single") -> WorkloadMix:
    mix = WorkloadMix(measure=measure)  # type: ignore[arg-type]
    mix.add(task)
    return mix


def test_single_task_measure_by_hand() -> None:
    half = TaskType(1000, 100, 1, 500)
    # Fits on the full device; the 300 left on the other device is too small for it.
    assert frag_of(one_type(half), [1000, 300]) == 300
    # Whole-GPU type: the partly used device is the fragment.
    assert frag_of(one_type(TaskType(1000, 100, 1, 1000)), [1000, 300]) == 300
    # A 2-GPU type does not fit at all: every free thousandth is a fragment.
    assert frag_of(one_type(TaskType(1000, 100, 2, 1000)), [1000, 300]) == 1300
    # Too little CPU or memory, or a model the type may not use: all free GPU is fragment.
    assert frag_of(one_type(half), [1000, 300], cpu=999) == 1300
    assert frag_of(one_type(half), [1000, 300], mem=99) == 1300
    assert frag_of(one_type(TaskType(1000, 100, 1, 500, ("B",))), [1000, 300], model=0) == 1300
    # Popularity weighs the types: half the tasks see 300, half see 1300.
    mix = one_type(half)
    mix.add(TaskType(1000, 100, 2, 1000))
    assert frag_of(mix, [1000, 300]) == pytest.approx(800)


def test_fill_measure_counts_what_copies_can_take() -> None:
    t = TaskType(4000, 100, 1, 470)
    # Two 470 tasks per device: 60 left on each.
    assert frag_of(one_type(t, "fill"), [1000, 1000]) == 120
    # CPU for only one task: 1000 + 1000 - 470 unusable.
    assert frag_of(one_type(t, "fill"), [1000, 1000], cpu=4000) == 2000 - 470
    # Whole 2-GPU type on 3 free devices: one stays unusable.
    assert frag_of(one_type(TaskType(1, 1, 2, 1000), "fill"), [1000, 1000, 1000]) == 1000


def test_empty_mix_measures_nothing() -> None:
    assert frag_of(WorkloadMix(), [1000, 500]) == 0


def test_coverage_keeps_the_popular_types() -> None:
    mix = WorkloadMix(coverage=0.9)
    for _ in range(95):
        mix.add(TaskType(1, 1, 1, 1000))
    for _ in range(5):
        mix.add(TaskType(1, 1, 1, 300))
    assert len(mix.arrays(MODELS).weight) == 1


device = st.integers(0, 1000)
node_state = st.tuples(
    st.lists(device, min_size=1, max_size=4),
    st.integers(0, 20000),
    st.integers(0, 2),
    st.integers(0, 1),
)


@settings(max_examples=60, deadline=None)
@given(
    states=st.lists(node_state, min_size=1, max_size=5),
    milli=st.sampled_from([100, 470, 810, 1000]),
    measure=st.sampled_from(["single", "fill", "mixed"]),
    data=st.data(),
)
def test_incremental_candidates_match_from_scratch(
    states: list[tuple[list[int], int, int, int]], milli: int, measure: str, data: st.DataObject
) -> None:
    mix = WorkloadMix(measure=measure)  # type: ignore[arg-type]
    for t in (
        TaskType(2000, 1, 1, 470),
        TaskType(8000, 1, 1, 1000),
        TaskType(4000, 1, 2, 1000),
        TaskType(1000, 1, 1, 810, ("B",)),
        TaskType(6000, 1, 0, 0),
    ):
        mix.add(t)
    arrays = mix.arrays(MODELS)
    width = 4
    gpu = np.array([s[0] + [0] * (width - len(s[0])) for s in states], dtype=np.int64)
    cpu = np.array([s[1] for s in states])
    mem = np.array([s[2] for s in states])
    model = np.array([s[3] for s in states])
    terms = device_sums(gpu, arrays.thresholds)
    rows, befores = [], []
    for i in range(len(states)):
        for v in set(gpu[i].tolist()):
            if v >= milli:
                rows.append(i)
                befores.append(v)
    if not rows:
        return
    cand = Candidates(
        np.array(rows),
        np.array(befores),
        np.array(befores) - milli,
        np.ones(len(rows), dtype=np.int64),
    )
    cpu_after = cpu[cand.node] - data.draw(st.integers(0, 3000))
    got = candidate_fragmentation(
        arrays, cand, gpu.sum(axis=1), terms, cpu_after, mem[cand.node], model
    )
    for k, (i, v) in enumerate(zip(rows, befores, strict=True)):
        after = gpu[i].copy()
        after[int(np.nonzero(after == v)[0][0])] -= milli
        want = fragmentation(
            arrays,
            after[None, :].sum(axis=1),
            device_sums(after[None, :], arrays.thresholds),
            cpu_after[k : k + 1],
            mem[i : i + 1],
            model[i : i + 1],
        )[0]
        assert got[k] == pytest.approx(want)


def _node(name: str, gpus: int, model: str) -> Node:
    return Node(
        name,
        Resources({"cpu": 32000, "memory": 64 << 30, GPU: gpus}),
        labels=((GPU_MODEL_LABEL, model),),
    )


def _pod(name: str, milli: int, **kw: object) -> Pod:
    return Pod(
        uid=name,
        namespace="ns",
        name=name,
        requests=Resources({"cpu": 1000, "memory": 1 << 30}),
        gpu=GpuRequest(1, milli),
        gang=f"ns/{name}",
        queue="q",
        **kw,  # type: ignore[arg-type]
    )


def test_scorer_in_the_solver_greedy_fills_the_matching_hole() -> None:
    """Through H4a's greedy: a 500 pod goes onto the device with exactly 500 free."""
    from scheduler.solver import ClusterState, GangRequest, place_gangs

    bound = _pod("old", 500, node_name="n2", phase=PodPhase.RUNNING, gpu_grant=((1, 500),))
    new = _pod("new", 500)
    snap = Snapshot(
        nodes=(_node("n1", 2, "T4"), _node("n2", 2, "T4")),
        pods=(bound, new),
        gangs=(Gang("ns", "new", min_member=1, queue="q"),),
    )
    scorer = FragmentationScorer()
    for milli in (1000, 1000, 500, 300):
        scorer.mix.add(TaskType(1000, 1024, 1, milli))
    state = ClusterState.from_snapshot(snap)
    result = place_gangs(state, [GangRequest("ns/new", "q", required=(new,))], scorer)
    (a,) = result.assignments
    assert (a.node, a.gpu_grant) == ("n2", ((1, 500),))


def test_scorer_score_is_fragmentation_increase() -> None:
    from scheduler.framework.scoring import PodDemand

    class View:
        node = _node("n", 2, "T4")
        free = {"cpu": 8000, "memory": 8 << 30}
        gpu_free = (1000, 400)

    scorer = FragmentationScorer()
    scorer.observe(PodDemand(Resources({"cpu": 1000, "memory": 1 << 30}), 1, 1000))
    demand = PodDemand(Resources({"cpu": 1000, "memory": 1 << 30}), 1, 400)
    # Filling the 400 hole removes a fragment; breaking the whole device creates one.
    assert scorer.score(View(), demand, [(1, 400)]) < scorer.score(View(), demand, [(0, 400)])
    assert scorer.pick_devices(View(), demand) == (1,)


def test_live_solve_with_fragmentation_scoring_keeps_gpus_usable() -> None:
    """Through ``solve()`` with ``scoring: fragmentation``: a CPU-only pod that would use up
    the CPU of a node with 8 idle GPUs goes elsewhere; binpack puts it there (least CPU left).
    The target workload is the snapshot's own pods (GPU pods asking 4 cores each)."""
    from scheduler.cluster import Queue
    from scheduler.solver import solve
    from scheduler.solver.placement import PlacementSettings

    gpu_box = Node(
        "gpu-box",
        Resources({"cpu": 4000, "memory": 64 << 30, GPU: 8}),
        labels=((GPU_MODEL_LABEL, "T4"),),
    )
    cpu_box = Node("cpu-box", Resources({"cpu": 16000, "memory": 64 << 30}))
    waiting = [
        Pod(
            uid=f"train-{i}",
            namespace="ns",
            name=f"train-{i}",
            requests=Resources({"cpu": 4000, "memory": 1 << 30, GPU: 1}),
            gpu=GpuRequest(1),
            gang="ns/train",
            queue="q",
        )
        for i in range(3)
    ]
    etl = Pod(
        uid="etl",
        namespace="ns",
        name="etl",
        requests=Resources({"cpu": 4000, "memory": 1 << 30}),
        gang="ns/etl",
        queue="q",
    )
    # The training gang cannot start (needs 3 x 4 cores); it only shapes the workload mix.
    snap = Snapshot(
        nodes=(gpu_box, cpu_box),
        pods=(*waiting, etl),
        gangs=(Gang("ns", "train", min_member=3, queue="q"), Gang("ns", "etl", queue="q")),
        queues=(Queue("q"),),
    )
    where = {}
    for scoring in ("packing", "fragmentation"):
        placement = solve(snap, PlacementSettings(scoring=scoring))  # type: ignore[arg-type]
        where[scoring] = {a.pod_uid: a.node for a in placement.assignments}["etl"]
    assert where == {"packing": "gpu-box", "fragmentation": "cpu-box"}


def test_nodes_without_a_model_label_are_scored() -> None:
    """GPU nodes need no ``nvidia.com/gpu.product`` label (found by the e2e test: the model
    table was empty and indexing it failed)."""
    from scheduler.solver import ClusterState, GangRequest, place_gangs

    plain = Node("n1", Resources({"cpu": 32000, "memory": 64 << 30, GPU: 2}))
    new = _pod("new", 500)
    snap = Snapshot(nodes=(plain,), pods=(new,), gangs=(Gang("ns", "new", queue="q"),))
    scorer = FragmentationScorer()
    scorer.mix.add(TaskType(1000, 1024, 1, 500, ("T4",)))
    result = place_gangs(
        ClusterState.from_snapshot(snap), [GangRequest("ns/new", "q", required=(new,))], scorer
    )
    assert [a.node for a in result.assignments] == ["n1"]


def test_task_type_reads_the_model_pin_from_selector_or_affinity() -> None:
    from scheduler.cluster.selectors import NodeSelectorRequirement, NodeSelectorTerm
    from scheduler.plugins.fragmentation import task_type

    pinned = _pod("a", 500, node_selector=((GPU_MODEL_LABEL, "A10"),))
    assert task_type(pinned) == TaskType(1000, 1024, 1, 500, ("A10",))
    term = NodeSelectorTerm((NodeSelectorRequirement(GPU_MODEL_LABEL, "In", ("T4", "P100")),))
    assert task_type(_pod("b", 300, affinity=(term,))).models == ("P100", "T4")
    # A second term without a model pin allows every model.
    other = NodeSelectorTerm((NodeSelectorRequirement("zone", "In", ("z1",)),))
    assert task_type(_pod("c", 300, affinity=(term, other))).models == ()
    # By GPU memory: the share depends on the node, so only CPU and memory count.
    by_memory = Pod(uid="m", namespace="ns", name="m", gpu=GpuRequest(1, memory_mib=4096))
    assert task_type(by_memory).gpus == 0


def test_task_type_is_kept_on_the_pod_and_the_mix_counts_every_live_pod() -> None:
    import dataclasses

    from scheduler.plugins.fragmentation import snapshot_mix, task_type

    pod = _pod("a", 500)
    first = task_type(pod)
    assert task_type(pod) is first  # measured once per pod object
    # A changed pod is a new object: measured again.
    changed = dataclasses.replace(pod, gpu=GpuRequest(1, milli=250))
    assert task_type(changed).milli == 250 and task_type(pod) is first
    pods = [
        pod,
        _pod("b", 500),
        changed,
        dataclasses.replace(pod, uid="d", phase=PodPhase.SUCCEEDED),
    ]
    mix, _ = snapshot_mix(Snapshot(pods=tuple(pods)))
    assert mix.counts == {first: 2.0, task_type(changed): 1.0}


def test_a_failing_scorer_falls_back_to_packing_for_the_cycle() -> None:
    """A plug-in scorer that raises costs the cycle its ranking, not its placements."""
    from scheduler.cluster import Queue
    from scheduler.solver import solve

    class Broken:
        def score(self, node: object, demand: object, grant: object) -> float:
            raise RuntimeError("scorer bug")

    new = _pod("new", 500)
    snap = Snapshot(
        nodes=(_node("n1", 2, "T4"),),
        pods=(new,),
        gangs=(Gang("ns", "new", queue="q"),),
        queues=(Queue("q"),),
    )
    placement = solve(snap, scorer=Broken())
    assert [(a.pod_uid, a.node) for a in placement.assignments] == [("new", "n1")]


def test_a_share_of_several_devices_uses_partly_used_ones() -> None:
    """``gpu-fraction`` with ``gpu-fraction-num-devices: 2``: half of two devices fits on a
    node whose two GPUs are each half used (the picker once asked for whole devices)."""
    from scheduler.solver import ClusterState, GangRequest, place_gangs

    running = [
        _pod(f"old-{d}", 500, node_name="n1", phase=PodPhase.RUNNING, gpu_grant=((d, 500),))
        for d in (0, 1)
    ]
    new = Pod(
        uid="new",
        namespace="ns",
        name="new",
        requests=Resources({"cpu": 1000, "memory": 1 << 30}),
        gpu=GpuRequest(2, 500),
        gang="ns/new",
        queue="q",
    )
    snap = Snapshot(
        nodes=(_node("n1", 2, "T4"),),
        pods=(*running, new),
        gangs=(Gang("ns", "new", queue="q"),),
    )
    result = place_gangs(
        ClusterState.from_snapshot(snap),
        [GangRequest("ns/new", "q", required=(new,))],
        FragmentationScorer(),
    )
    assert [(a.node, a.gpu_grant) for a in result.assignments] == [("n1", ((0, 500), (1, 500)))]
