"""Snapshot: per-node usage and free GPU devices, derived views, exact JSON round-trip."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cluster.gang import Gang
from scheduler.cluster.node import Node, Taint
from scheduler.cluster.pod import GpuRequest, Pod, PodPhase
from scheduler.cluster.queue import Queue, QueueResource
from scheduler.cluster.resources import Resources
from scheduler.cluster.selectors import NodeSelectorRequirement, NodeSelectorTerm, Toleration
from scheduler.cluster.snapshot import Snapshot

G = "nvidia.com/gpu"


def gpu_node(name: str, gpus: int = 4, memory_mib: int | None = None) -> Node:
    return Node(
        name, Resources({G: gpus, "cpu": 32000, "memory": 2**36}), gpu_memory_mib=memory_mib
    )


def bound(name: str, node: str, **kw: Any) -> Pod:
    kw.setdefault("phase", PodPhase.RUNNING)
    return Pod(uid=name, namespace="ns", name=name, node_name=node, gang=f"ns/{name}", **kw)


def test_node_states_usage_and_devices() -> None:
    snap = Snapshot(
        nodes=(gpu_node("n1"), gpu_node("n2", memory_mib=40000)),
        pods=(
            bound(
                "granted",
                "n1",
                requests=Resources({G: 1, "cpu": 1000}),
                gpu=GpuRequest(1),
                gpu_grant=((2, 1000),),
            ),
            bound("frac", "n1", gpu=GpuRequest(1, 250), gpu_grant=((0, 250),)),
            # whole-GPU pod bound by someone else: takes the lowest-indexed free device
            bound("foreign", "n1", requests=Resources({G: 1})),
            # fractional without a grant: its share of the freest device
            bound("mem", "n2", gpu=GpuRequest(1, 1000, memory_mib=10000)),
            bound("done", "n2", requests=Resources({G: 4}), phase=PodPhase.SUCCEEDED),
            bound("elsewhere", "ghost", requests=Resources({G: 4})),
            Pod("p", "ns", "pending", requests=Resources({G: 2})),
        ),
    )
    states = snap.node_states()
    n1, n2 = states["n1"], states["n2"]
    assert n1.used == Resources({G: 2, "cpu": 1000})
    assert n1.gpu_free == (750, 0, 0, 1000)
    assert n1.whole_free_gpus == 1
    assert n1.free[G] == 2 and n1.free["cpu"] == 31000
    assert n2.used == Resources()
    assert n2.gpu_free == (750, 1000, 1000, 1000)
    assert n2.whole_free_gpus == 3


def test_derived_views() -> None:
    pods = (bound("a", "n1"), Pod("b", "ns", "b", gang="ns/g"), Pod("c", "ns", "c", gang="ns/g"))
    snap = Snapshot(
        nodes=(gpu_node("n1"),), pods=pods, gangs=(Gang("ns", "g", 2),), queues=(Queue("q"),)
    )
    assert set(snap.pods_by_gang) == {"ns/a", "ns/g"}
    assert [p.name for p in snap.pods_by_gang["ns/g"]] == ["b", "c"]
    assert snap.gang_by_key["ns/g"].min_member == 2
    assert snap.node_by_name["n1"].gpu_count == 4
    assert snap.queue_tree.roots() == ["q"]


def test_version_mismatch_is_an_error() -> None:
    data = Snapshot().to_dict()
    data["version"] = 99
    with pytest.raises(ValueError, match="version 99"):
        Snapshot.from_dict(data)


# --- JSON round-trip ----------------------------------------------------------------------

names = st.text(st.characters(codec="utf-8"), min_size=1, max_size=8)
small = st.integers(min_value=0, max_value=10**6)
times = st.floats(min_value=0, max_value=2e9, allow_nan=False, allow_infinity=False)
resources = st.dictionaries(
    st.sampled_from(["cpu", "memory", G, "pods", "example.com/fpga"]),
    st.integers(min_value=-(10**15), max_value=10**15),
    max_size=4,
).map(Resources)
labels = st.lists(st.tuples(names, names), max_size=3).map(tuple)
taints = st.builds(
    Taint, names, names, st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"])
)
nodes = st.builds(
    Node,
    names,
    resources,
    labels,
    st.lists(taints, max_size=2).map(tuple),
    st.booleans(),
    st.booleans(),
    st.none() | small,
)
tolerations = st.builds(
    Toleration,
    names | st.just(""),
    st.sampled_from(["Equal", "Exists"]),
    names,
    st.sampled_from(["", "NoSchedule", "NoExecute"]),
)
requirement = st.builds(
    NodeSelectorRequirement,
    names,
    st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]),
    st.lists(names, max_size=2).map(tuple),
)
terms = st.lists(
    st.builds(NodeSelectorTerm, st.lists(requirement, max_size=2).map(tuple)), max_size=2
).map(tuple)
gpu_requests = st.none() | st.builds(
    GpuRequest, st.integers(1, 8), st.integers(1, 1000), st.none() | small
)
pods = st.builds(
    Pod,
    names,
    names,
    names,
    resources,
    gpu_requests,
    st.integers(-1000, 1000),
    labels,
    terms,
    st.lists(tolerations, max_size=2).map(tuple),
    names,
    names,
    st.sampled_from(list(PodPhase)),
    st.none() | names,
    st.lists(st.tuples(st.integers(0, 7), small), max_size=2).map(tuple),
    times,
    st.booleans(),
    st.booleans(),
)
gangs = st.builds(
    Gang,
    names,
    names,
    st.integers(1, 64),
    names,
    st.integers(-100, 1000),
    st.booleans(),
    times,
    times,
    st.booleans(),
)
queue_resources = st.tuples(
    st.sampled_from(["gpu", "cpu", "memory"]),
    st.builds(QueueResource, st.integers(-1, 10**9), st.integers(0, 10), st.integers(-1, 10**9)),
)
queues = st.builds(
    Queue,
    names,
    names | st.just(""),
    st.integers(-10, 1000),
    st.lists(queue_resources, max_size=3).map(tuple),
    names,
    times,
)
snapshots = st.builds(
    Snapshot,
    st.lists(nodes, max_size=4).map(tuple),
    st.lists(pods, max_size=5).map(tuple),
    st.lists(gangs, max_size=3).map(tuple),
    st.lists(queues, max_size=3).map(tuple),
    times,
)


@settings(max_examples=150, deadline=None)
@given(snapshots)
def test_json_round_trip_is_exact(snap: Snapshot) -> None:
    text = snap.to_json()
    back = Snapshot.from_json(text)
    assert back == snap
    assert back.to_json() == text
    json.loads(text)  # plain JSON, nothing custom
