"""The per-cycle shortcuts of the solver and explainer give what the plain computation gives.

Each test compares a remembered or written-out computation (pod queue usage kept on the
pod, take-back units built without the dataclass ``__init__``, the explainer's packing with
its per-shape memo, the relaxation's per-free-state capacity) with the straightforward one.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import fields, replace

from scheduler.bench.synthetic import ClusterSpec, synthetic_snapshot
from scheduler.cluster.pod import GpuRequest, Pod, PodPhase
from scheduler.cluster.queue import QUEUE_RESOURCES, pod_queue_usage
from scheduler.cluster.resources import CPU, GPU, MEMORY, PODS, Resources
from scheduler.explain.capacity import Shape, pod_fits, pod_slots, share_milli
from scheduler.explain.fit import _room, _size, _take, pack_group
from scheduler.solver.bound import _capacity, _most
from scheduler.solver.hybrid import current_classes
from scheduler.solver.state import ClusterState, selected_label_keys
from scheduler.solver.victims import Unit, build_units

# --- pod queue usage, kept on the pod ---------------------------------------------------


def test_pod_queue_usage_gives_each_caller_its_own_dict() -> None:
    pod = Pod("u1", "ns", "p", Resources({CPU: 2000, MEMORY: 5}), phase=PodPhase.RUNNING)
    first = pod_queue_usage(pod)
    first["gpu"] = 999  # a caller changing its copy (the validator does)
    assert pod_queue_usage(pod) == {"gpu": 0, "cpu": 2000, "memory": 5}


def test_pod_queue_usage_of_a_changed_copy_is_its_own() -> None:
    pod = Pod("u1", "ns", "p", gpu=GpuRequest(2, 500), gpu_grant=((0, 500), (1, 500)))
    assert pod_queue_usage(pod)["gpu"] == 1000
    # replace() makes a new pod: what was remembered for the old one does not carry over
    assert pod_queue_usage(replace(pod, gpu_grant=((3, 500),)))["gpu"] == 500
    assert pod_queue_usage(replace(pod, gpu_grant=()))["gpu"] == 1000
    assert pod_queue_usage(pod)["gpu"] == 1000


def test_active_and_pending_read_the_phase_as_before() -> None:
    for phase in PodPhase:
        pod = Pod("u", "ns", "p", phase=phase)
        done = phase in (PodPhase.SUCCEEDED, PodPhase.FAILED)
        assert pod.active is not done
        assert pod.pending is not done  # managed, unbound, not deleting, not gated
        assert replace(pod, node_name="n").pending is False
        assert replace(pod, deleting=True).pending is False
        assert replace(pod, scheduling_gates=("g",)).pending is False
        assert replace(pod, managed=False).pending is False


# --- take-back units ---------------------------------------------------------------------


def test_units_equal_the_dataclass_built_ones() -> None:
    snap = synthetic_snapshot(
        ClusterSpec(40, 8, 20, 0.7, 3, 0, (50, 100), running_fill=0.5, constraints=0.0)
    )
    units = build_units(snap)
    assert units, "the snapshot must have running preemptible work"
    for u in units:
        usage = dict.fromkeys(QUEUE_RESOURCES, 0)
        for p in u.pods:
            for r, v in pod_queue_usage(p).items():
                usage[r] += v
        started = min(p.started for p in u.pods)
        plain = Unit(u.id, u.gang, u.queue, u.priority, u.pods, u.whole, started, usage)
        assert u == plain
        assert repr(u) == repr(plain)
        assert [f.name for f in fields(u)] == [f.name for f in fields(plain)]
        assert u.nodes == frozenset(p.node_name for p in u.pods if p.node_name)
        assert list(u.usage) == list(QUEUE_RESOURCES)
        assert u.work(snap.now) == plain.work(snap.now)


# --- explainer packing -------------------------------------------------------------------


def _plain_pod_fits(pod: Pod, shape: Shape, *, empty: bool = False) -> bool:
    resources = dict(shape.allocatable if empty else shape.free)
    if not Resources(pod.requests).fits_in(resources):
        return False
    slots = pod_slots(shape, empty=empty)
    if slots is not None and slots < 1:
        return False
    if pod.gpu is None:
        return True
    milli = share_milli(pod.gpu, shape.gpu_memory_mib)
    if milli is None:
        return False
    if empty:
        return resources.get(GPU, 0) >= pod.gpu.count
    return sum(1 for f in shape.gpu_free if f >= milli) >= pod.gpu.count


def _plain_pack_group(group: list[Pod], shapes: Counter[Shape]) -> bool:
    work = Counter(shapes)
    for pod in sorted(group, key=_size, reverse=True):
        fitting = [s for s, n in work.items() if n > 0 and _plain_pod_fits(pod, s)]
        if not fitting:
            return False
        best = min(fitting, key=_room)
        work[best] -= 1
        work[_take(best, pod)] += 1
    return True


def _random_shape(rng: random.Random) -> Shape:
    devices = rng.choice([0, 4, 8])
    alloc = {CPU: 64000, MEMORY: 512, GPU: devices}
    if rng.random() < 0.7:
        alloc[PODS] = rng.choice([1, 3, 110])
    free = {r: rng.randint(-1, v) if r != GPU else v for r, v in alloc.items()}
    gpu_free = tuple(
        sorted((rng.choice([0, 250, 500, 1000]) for _ in range(devices)), reverse=True)
    )
    return Shape(
        free=tuple(sorted(free.items())),
        gpu_free=gpu_free,
        gpu_memory_mib=rng.choice([None, 40960, 81920]),
        allocatable=tuple(sorted(alloc.items())),
    )


def _random_pod(rng: random.Random, i: int) -> Pod:
    gpu = rng.choice(
        [None, GpuRequest(1), GpuRequest(2), GpuRequest(1, 500), GpuRequest(1, 0, 20480)]
    )
    requests = {CPU: rng.choice([0, 1000, 8000, 70000]), MEMORY: rng.choice([0, 16, 128])}
    if gpu is not None and gpu.whole:
        requests[GPU] = gpu.count
    return Pod(f"u{i}", "ns", f"p{i}", Resources(requests), gpu=gpu)


def test_pod_fits_and_packing_answer_as_the_plain_checks() -> None:
    rng = random.Random(7)
    for _ in range(300):
        shapes = Counter({_random_shape(rng): rng.randint(1, 3) for _ in range(rng.randint(1, 6))})
        group = [_random_pod(rng, i) for i in range(rng.randint(1, 8))]
        if rng.random() < 0.5:  # pods of one size, as gangs mostly are
            group = [replace(group[0], uid=f"c{i}", name=f"c{i}") for i in range(len(group))]
        for pod in group:
            for shape in shapes:
                for empty in (False, True):
                    assert pod_fits(pod, shape, empty=empty) == _plain_pod_fits(
                        pod, shape, empty=empty
                    )
        assert pack_group(group, shapes) == _plain_pack_group(group, shapes)


# --- relaxation capacity -----------------------------------------------------------------


def test_relaxation_capacity_is_the_same_with_hostname_classes() -> None:
    snap = synthetic_snapshot(ClusterSpec(60, 8, 30, 0.6, 5, 0, (50, 100), constraints=0.5))
    state = ClusterState.from_snapshot(snap, label_keys=selected_label_keys(snap.pods))
    classes = current_classes(state)
    shapes = list({p.requests: p for p in snap.pods if p.pending}.values())
    caps = _capacity(classes, shapes)
    for static_id, got in caps.items():
        most: Counter[int] = Counter()
        for info in classes:
            if info.key[0] != static_id:
                continue
            for s, d in got.demand.items():
                if d is not None:
                    most[s] += len(info.members) * _most(info.free, info.gpu_free, d)
        assert got.most == most
