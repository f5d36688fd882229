"""Values pods and nodes derive once (labels, selected label keys, one per node), and the
per-node free state that ClusterState and the topology explainer share."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Iterable

import pytest

from scheduler.bench.synthetic import ClusterSpec, make_node, make_pod, synthetic_snapshot
from scheduler.cluster.codec import decode, encode
from scheduler.cluster.node import Node
from scheduler.cluster.pod import Pod, PodPhase
from scheduler.cluster.podaffinity import HOSTNAME_LABEL, LabelSelector, PodAffinityTerm
from scheduler.cluster.resources import PODS
from scheduler.cluster.selectors import NodeSelectorRequirement, NodeSelectorTerm
from scheduler.cluster.snapshot import Snapshot, bound_usage
from scheduler.explain.topology import TopologyExplainer
from scheduler.solver.state import ClusterState, selected_label_keys

ZONE_OR_NAME = (
    NodeSelectorTerm((NodeSelectorRequirement("zone", "In", ("a", "b")),)),
    NodeSelectorTerm((NodeSelectorRequirement("metadata.name", "In", ("n1",)),)),
)


def _apart(job: str, *, namespaces: tuple[str, ...] | None = None) -> PodAffinityTerm:
    return PodAffinityTerm(HOSTNAME_LABEL, LabelSelector((("job", job),)), namespaces)


def test_pod_label_map_is_built_once_and_read_only() -> None:
    pod = make_pod("p", labels={"job": "a", "app": "web"})
    labels = pod.label_map
    assert labels == {"job": "a", "app": "web"}
    assert pod.label_map is labels
    with pytest.raises(TypeError):
        labels["job"] = "b"  # type: ignore[index]
    assert pod.label_map == {"job": "a", "app": "web"}
    assert {**labels, "extra": "1"} == {"job": "a", "app": "web", "extra": "1"}


def test_node_label_map_is_built_once_and_read_only() -> None:
    node = make_node("n", labels={"zone": "a", "nvidia.com/gpu.product": "H100"})
    labels = node.label_map
    assert labels == {"zone": "a", "nvidia.com/gpu.product": "H100"}
    assert node.label_map is labels
    assert node.gpu_model == "H100"
    with pytest.raises(TypeError):
        labels["zone"] = "b"  # type: ignore[index]


@pytest.mark.parametrize("kind", ["pod", "node"])
def test_derived_values_are_not_data(kind: str) -> None:
    """Once derived, the values change neither equality, hashing, repr, JSON nor copies."""
    obj: Pod | Node
    if kind == "pod":
        obj = make_pod(
            "p", labels={"job": "a"}, selector={"zone": "a"}, anti_affinity=[_apart("a")]
        )
        fresh: Pod | Node = make_pod(
            "p", labels={"job": "a"}, selector={"zone": "a"}, anti_affinity=[_apart("a")]
        )
        assert isinstance(obj, Pod)
        assert obj.one_per_node and obj.node_label_keys == {"zone"}
    else:
        obj = make_node("n", labels={"zone": "a"})
        fresh = make_node("n", labels={"zone": "a"})
    data = encode(obj)
    assert obj.label_map == ({"job": "a"} if kind == "pod" else {"zone": "a"})
    assert obj == fresh and hash(obj) == hash(fresh) and repr(obj) == repr(fresh)
    assert encode(obj) == data == encode(fresh)
    assert not any(k.startswith("_") for k in data)
    assert decode(type(obj), data) == obj
    again = pickle.loads(pickle.dumps(obj))
    assert again == obj and again.label_map == obj.label_map
    changed = dataclasses.replace(obj, labels=(("job", "b"),))
    assert changed.label_map == {"job": "b"}
    assert obj.label_map != changed.label_map


def test_one_per_node() -> None:
    mine = make_pod("p", labels={"job": "a"}, anti_affinity=[_apart("a")])
    other = make_pod("q", labels={"job": "a"}, anti_affinity=[_apart("b")])
    elsewhere = make_pod("r", labels={"job": "a"}, anti_affinity=[_apart("a", namespaces=("x",))])
    zone = make_pod(
        "s", labels={"job": "a"}, anti_affinity=[PodAffinityTerm("zone", LabelSelector())]
    )
    plain = make_pod("t", labels={"job": "a"})
    for _ in range(2):  # computed, then remembered
        assert mine.one_per_node
        assert not other.one_per_node
        assert not elsewhere.one_per_node
        assert not zone.one_per_node
        assert not plain.one_per_node


def test_node_label_keys() -> None:
    assert make_pod("p").node_label_keys == frozenset()
    pod = make_pod("p", selector={"pool": "x", "zone": "a"}, affinity=ZONE_OR_NAME)
    assert pod.node_label_keys == {"pool", "zone", "metadata.name"}
    assert pod.node_label_keys is pod.node_label_keys


def _walk(pods: Iterable[Pod]) -> frozenset[str]:
    """selected_label_keys as it read before: every pod, term and requirement."""
    keys: set[str] = set()
    for p in pods:
        keys.update(k for k, _ in p.node_selector)
        keys.update(r.key for t in p.affinity for r in t.requirements)
    return frozenset(keys)


def test_selected_label_keys_matches_a_plain_walk() -> None:
    snap = synthetic_snapshot(ClusterSpec(nodes=60, gangs=80, constraints=0.3, seed=3))
    extra = (
        make_pod("by-name", affinity=ZONE_OR_NAME),
        make_pod("bound", selector={"rack": "r1"}, node="node-00000"),
    )
    for pods in (snap.pods, snap.pods + extra, extra[:1], ()):
        assert selected_label_keys(pods) == _walk(pods)
        assert selected_label_keys(pods) == _walk(pods)  # the pods' keys now remembered
    assert selected_label_keys(snap.pods + extra) >= {"zone", "metadata.name", "rack"}


def _snapshot() -> Snapshot:
    nodes = (
        make_node("n1", gpus=4, labels={"zone": "a"}),
        make_node("n2", gpus=8, labels={"zone": "b"}, max_pods=3),
        make_node("n3", gpus=2, labels={"zone": "a"}),
    )
    pods = (
        make_pod("r1", gpus=2, node="n1", grant=((0, 1000), (1, 1000))),
        make_pod("r2", fraction=0.5, node="n1", grant=((2, 500),)),
        make_pod("r3", gpus=3, node="n2"),  # bound without a grant: takes the freest
        make_pod("r4", cpu=3, node="n2"),
        dataclasses.replace(make_pod("done", gpus=2, node="n3"), phase=PodPhase.SUCCEEDED),
        make_pod("w1", gpus=1, labels={"job": "w"}, anti_affinity=[_apart("w")]),
        make_pod("w2", gpus=1, labels={"job": "w"}, anti_affinity=[_apart("w")]),
    )
    return Snapshot(nodes, pods)


def test_cluster_state_and_explainer_start_from_the_same_free_state() -> None:
    snap = _snapshot()
    usage = bound_usage(snap)
    state = ClusterState.from_snapshot(snap)
    explainer = TopologyExplainer(snap, (), ())
    assert set(state.nodes) == set(explainer.views) == {"n1", "n2", "n3"}
    for n in snap.nodes:
        used = usage.used[n.name]
        want = {k: v - used.get(k, 0) for k, v in n.allocatable.items()}
        want[PODS] -= usage.pod_count[n.name]
        for slot in (state.nodes[n.name], explainer.views[n.name]):
            assert slot.node is n
            assert slot.free == want
            assert slot.gpu_free == usage.gpu_free[n.name]
    assert state.nodes["n2"].free[PODS] == 1
    assert state.nodes["n1"].gpu_free == [0, 0, 500, 1000]
    assert state.nodes["n3"].gpu_free == [1000, 1000]
    # the two do not share rows: the explainer's trial placements leave the state alone
    assert state.nodes["n1"].free is not explainer.views["n1"].free
    assert state.nodes["n1"].gpu_free is not explainer.views["n1"].gpu_free


def test_explainer_leaves_its_free_state_as_it_found_it() -> None:
    snap = _snapshot()
    explainer = TopologyExplainer(snap, (), ())
    before = {n: (dict(v.free), list(v.gpu_free)) for n, v in explainer.views.items()}
    pending = [p for p in snap.pods if p.pending]
    assert explainer.problem(pending) is None  # one per node: three nodes, two pods
    after = {n: (dict(v.free), list(v.gpu_free)) for n, v in explainer.views.items()}
    assert after == before
