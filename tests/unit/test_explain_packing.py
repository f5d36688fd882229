"""The explainer's packing check: its shortcut for gangs of alike pods gives the answer
first-fit decreasing gives, on random node shapes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cluster.node import GPU_MILLI
from scheduler.cluster.pod import GpuRequest, Pod
from scheduler.cluster.resources import CPU, GPU, MEMORY, PODS, Resources
from scheduler.explain.capacity import Shape
from scheduler.explain.fit import first_fit_decreasing, pack_group

GIB = 2**30


@st.composite
def node_shape(draw: st.DrawFn) -> Shape:
    devices = draw(st.integers(0, 4))
    gpu_free = tuple(
        sorted((draw(st.sampled_from([0, 250, 500, 750, GPU_MILLI])) for _ in range(devices)),
               reverse=True)
    )  # fmt: skip
    cpu = draw(st.integers(0, 8)) * 1000
    memory = draw(st.integers(0, 8)) * GIB
    slots = draw(st.integers(0, 4))
    free = {CPU: cpu, MEMORY: memory, GPU: sum(1 for f in gpu_free if f == GPU_MILLI)}
    allocatable = {CPU: 8000, MEMORY: 8 * GIB, GPU: devices}
    if slots:
        free[PODS], allocatable[PODS] = slots, 4
    return Shape(
        free=tuple(sorted(free.items())),
        gpu_free=gpu_free,
        gpu_memory_mib=None,
        allocatable=tuple(sorted(allocatable.items())),
    )


@st.composite
def pod_of(draw: st.DrawFn, name: str = "p") -> Pod:
    cpu = draw(st.integers(0, 4)) * 1000
    memory = draw(st.integers(0, 4)) * GIB
    kind = draw(st.sampled_from(["none", "whole", "share"]))
    gpu = None
    requests = {CPU: cpu, MEMORY: memory}
    if kind == "whole":
        count = draw(st.integers(1, 2))
        gpu = GpuRequest(count)
        requests[GPU] = count
    elif kind == "share":
        gpu = GpuRequest(1, milli=draw(st.sampled_from([250, 500, 750])))
    return Pod(name, "ns", name, Resources(requests), gpu=gpu)


@settings(max_examples=400, deadline=None)
@given(
    shapes=st.dictionaries(node_shape(), st.integers(0, 3), max_size=6),
    pod=pod_of(),
    count=st.integers(1, 6),
    other=st.one_of(st.none(), pod_of("q")),
)
def test_shortcut_answers_as_first_fit_decreasing(
    shapes: dict[Shape, int], pod: Pod, count: int, other: Pod | None
) -> None:
    group = [pod] * count + ([other] if other is not None else [])
    assert pack_group(group, shapes) == first_fit_decreasing(group, shapes)


def test_alike_pods_fit_one_per_node_without_the_search() -> None:
    free = Shape(
        free=((CPU, 4000), (GPU, 1), (MEMORY, 4 * GIB)),
        gpu_free=(GPU_MILLI,),
        gpu_memory_mib=None,
        allocatable=((CPU, 4000), (GPU, 1), (MEMORY, 4 * GIB)),
    )
    full = Shape(
        free=((CPU, 0), (GPU, 0), (MEMORY, 0)),
        gpu_free=(0,),
        gpu_memory_mib=None,
        allocatable=((CPU, 4000), (GPU, 1), (MEMORY, 4 * GIB)),
    )
    pod = Pod("p", "ns", "p", Resources({CPU: 1000, GPU: 1}), gpu=GpuRequest(1))
    assert pack_group([pod] * 3, {free: 3, full: 10})
    assert not pack_group([pod] * 4, {free: 3, full: 10})
