"""API Pod objects to domain pods: effective requests, GPU annotations, placement rules."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.cluster.node import Node, Taint
from scheduler.cluster.pod import GpuRequest, PodPhase
from scheduler.cluster.podspec import PodSpecError, effective_requests, pod_from_k8s
from scheduler.cluster.resources import Resources
from scheduler.cluster.selectors import (
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Toleration,
    affinity_matches,
    node_accepts,
    tolerates,
)

GIB = 2**30


def container(
    requests: dict[str, Any] | None = None, limits: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if requests is not None:
        res["requests"] = requests
    if limits is not None:
        res["limits"] = limits
    return {"name": "c", "resources": res, **extra}


def k8s_pod(
    spec: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    **meta: Any,
) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ns",
            "name": "p",
            "uid": "u1",
            "annotations": annotations or {},
            "labels": labels or {},
            **meta,
        },
        "spec": {"schedulerName": "kai", "containers": [container({"cpu": "1"})], **(spec or {})},
        "status": {"phase": "Pending"},
    }


def convert(obj: dict[str, Any]) -> Any:
    return pod_from_k8s(obj, scheduler_name="kai", default_queue="default")


# --- effective requests -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        # app containers add up
        ({"containers": [container({"cpu": "1"}), container({"cpu": "500m"})]}, {"cpu": 1500}),
        # regular init containers: the largest one, not the sum
        (
            {
                "containers": [container({"cpu": "1"})],
                "initContainers": [container({"cpu": "2"}), container({"cpu": "3"})],
            },
            {"cpu": 3000},
        ),
        # app sum wins when it is larger than any init container
        (
            {
                "containers": [container({"cpu": "2"}), container({"cpu": "2"})],
                "initContainers": [container({"cpu": "3"})],
            },
            {"cpu": 4000},
        ),
        # sidecars (restartable init containers) add to the apps and to later init containers
        (
            {
                "containers": [container({"cpu": "1"})],
                "initContainers": [
                    container({"cpu": "500m"}, restartPolicy="Always"),
                    container({"cpu": "2"}),
                ],
            },
            {"cpu": 2500},
        ),
        (
            {
                "containers": [container({"cpu": "1"})],
                "initContainers": [container({"cpu": "500m"}, restartPolicy="Always")],
            },
            {"cpu": 1500},
        ),
        # overhead is added on top
        ({"containers": [container({"cpu": "1"})], "overhead": {"cpu": "250m"}}, {"cpu": 1250}),
        # a limit alone becomes the request (API server defaulting)
        (
            {"containers": [container(limits={"cpu": "2", "memory": "1Gi"})]},
            {"cpu": 2000, "memory": GIB},
        ),
        # an explicit request wins over the limit
        ({"containers": [container({"cpu": "1"}, {"cpu": "4"})]}, {"cpu": 1000}),
        # pod-level requests win where set, container sums elsewhere
        (
            {
                "containers": [container({"cpu": "1", "memory": "1Gi"})],
                "resources": {"requests": {"cpu": "3"}},
            },
            {"cpu": 3000, "memory": GIB},
        ),
        ({"containers": []}, {}),
    ],
)
def test_effective_requests(spec: dict[str, Any], expected: dict[str, int]) -> None:
    assert effective_requests(spec) == Resources(expected)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"containers": [container({"cpu": "lots"})]}, "spec.containers[0].resources"),
        ({"initContainers": [container({"memory": "x"})]}, "spec.initContainers[0].resources"),
        ({"overhead": {"cpu": "?"}}, "spec.overhead"),
        ({"resources": {"requests": {"cpu": "-"}}}, "spec.resources.requests"),
    ],
)
def test_effective_requests_errors_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(PodSpecError) as err:
        effective_requests(spec)
    assert err.value.field == field


def test_effective_requests_memo_tells_specs_apart_and_never_keeps_errors() -> None:
    """Specs that differ in any resource-relevant part get their own answer, however many
    were seen before; an unreadable spec fails every time, also after a readable twin."""

    def spec(cpu: str, *, init: str | None = None, policy: str | None = None) -> dict[str, Any]:
        s: dict[str, Any] = {"containers": [{"resources": {"requests": {"cpu": cpu}}}]}
        if init is not None:
            c: dict[str, Any] = {"resources": {"requests": {"cpu": init}}}
            if policy:
                c["restartPolicy"] = policy
            s["initContainers"] = [c]
        return s

    for _ in range(2):  # the second round is answered from the memo
        assert effective_requests(spec("1")) == Resources({"cpu": 1000})
        assert effective_requests(spec("2")) == Resources({"cpu": 2000})
        assert effective_requests(spec("1", init="3")) == Resources({"cpu": 3000})
        # A sidecar (restartPolicy Always) adds to the app containers instead.
        assert effective_requests(spec("1", init="3", policy="Always")) == Resources({"cpu": 4000})
        with_limit = {"containers": [{"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}
        assert effective_requests(with_limit) == Resources({"cpu": 1000, "memory": 2**30})
        assert effective_requests({**spec("1"), "overhead": {"cpu": "250m"}}) == Resources(
            {"cpu": 1250}
        )
        with pytest.raises(PodSpecError):
            effective_requests(spec("lots"))
        with pytest.raises(PodSpecError):  # unhashable where a quantity belongs
            effective_requests({"containers": [{"resources": {"requests": {"cpu": ["1"]}}}]})


# --- GPU annotations ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotations", "limits", "expected"),
    [
        ({}, {"nvidia.com/gpu": "2"}, GpuRequest(2, 1000)),
        ({"gpu-fraction": "0.5"}, {}, GpuRequest(1, 500)),
        ({"gpu-fraction": "0.25", "gpu-fraction-num-devices": "2"}, {}, GpuRequest(2, 250)),
        ({"gpu-fraction": "0.3333"}, {}, GpuRequest(1, 334)),  # rounded up
        ({"gpu-memory": "20000"}, {}, GpuRequest(1, 1000, memory_mib=20000)),
        ({}, {}, None),
    ],
)
def test_gpu_requests(
    annotations: dict[str, str], limits: dict[str, str], expected: GpuRequest | None
) -> None:
    spec = {"containers": [container(limits={"cpu": "1", **limits})]}
    assert convert(k8s_pod(spec, annotations)).gpu == expected


@pytest.mark.parametrize(
    ("annotations", "limits", "field"),
    [
        ({"gpu-fraction": "0"}, {}, "metadata.annotations[gpu-fraction]"),
        ({"gpu-fraction": "1.5"}, {}, "metadata.annotations[gpu-fraction]"),
        ({"gpu-fraction": "1"}, {}, "metadata.annotations[gpu-fraction]"),
        ({"gpu-fraction": "half"}, {}, "metadata.annotations[gpu-fraction]"),
        ({"gpu-memory": "-5"}, {}, "metadata.annotations[gpu-memory]"),
        ({"gpu-memory": "lots"}, {}, "metadata.annotations[gpu-memory]"),
        ({"gpu-fraction": "0.5", "gpu-memory": "100"}, {}, "metadata.annotations[gpu-fraction]"),
        ({"gpu-fraction": "0.5"}, {"nvidia.com/gpu": "1"}, "metadata.annotations[gpu-fraction]"),
        (
            {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "0"},
            {},
            "metadata.annotations[gpu-fraction-num-devices]",
        ),
        (
            {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "two"},
            {},
            "metadata.annotations[gpu-fraction-num-devices]",
        ),
    ],
)
def test_invalid_gpu_annotations_name_the_field(
    annotations: dict[str, str], limits: dict[str, str], field: str
) -> None:
    spec = {"containers": [container(limits={"cpu": "1", **limits})]}
    with pytest.raises(PodSpecError) as err:
        convert(k8s_pod(spec, annotations))
    assert err.value.field == field
    assert field in str(err.value)


def test_bound_pod_with_bad_spec_still_occupies_its_node() -> None:
    obj = k8s_pod({"nodeName": "n1"}, {"gpu-fraction": "7"})
    pod = convert(obj)
    assert pod.node_name == "n1" and pod.requests == Resources()


def test_pod_fields_from_k8s() -> None:
    obj = k8s_pod(
        {"priority": 50, "nodeSelector": {"b": "2", "a": "1"}},
        {"pod-group-name": "train"},
        {"kai.scheduler/queue": "team-a"},
        creationTimestamp="2024-01-01T00:00:00Z",
    )
    pod = convert(obj)
    assert pod.key == "ns/p" and pod.uid == "u1"
    assert pod.gang == "ns/train" and pod.queue == "team-a"
    assert pod.priority == 50 and pod.node_selector == (("a", "1"), ("b", "2"))
    assert pod.phase is PodPhase.PENDING and pod.pending and pod.managed
    assert pod.creation_time == 1704067200.0
    other = convert(k8s_pod({"schedulerName": "default-scheduler"}))
    assert not other.managed and not other.pending
    assert convert(k8s_pod()).gang == "ns/p" and convert(k8s_pod()).queue == "default"
    assert convert(k8s_pod(annotations={"scheduling.k8s.io/group-name": "g"})).gang == "ns/g"


# --- selectors -------------------------------------------------------------------------


def req(key: str, op: Any, *values: str) -> NodeSelectorRequirement:
    return NodeSelectorRequirement(key, op, values)


LABELS = {"zone": "a", "gpus": "8", "name": "x"}


@pytest.mark.parametrize(
    ("requirement", "matches"),
    [
        (req("zone", "In", "a", "b"), True),
        (req("zone", "In", "b"), False),
        (req("missing", "In", "a"), False),
        (req("zone", "NotIn", "b"), True),
        (req("zone", "NotIn", "a"), False),
        (req("missing", "NotIn", "a"), True),
        (req("zone", "Exists"), True),
        (req("missing", "Exists"), False),
        (req("missing", "DoesNotExist"), True),
        (req("zone", "DoesNotExist"), False),
        (req("gpus", "Gt", "4"), True),
        (req("gpus", "Gt", "8"), False),
        (req("gpus", "Lt", "9"), True),
        (req("gpus", "Lt", "8"), False),
        (req("name", "Gt", "1"), False),  # not an integer label
        (req("gpus", "Gt", "x"), False),  # not an integer value
        (req("missing", "Lt", "1"), False),
        (req("gpus", "Gt", "1", "2"), False),  # Gt takes exactly one value
    ],
)
def test_affinity_operators(requirement: NodeSelectorRequirement, matches: bool) -> None:
    assert requirement.matches(LABELS) is matches


def test_affinity_terms_are_or_of_ands() -> None:
    yes = NodeSelectorTerm((req("zone", "In", "a"), req("gpus", "Exists")))
    no = NodeSelectorTerm((req("zone", "In", "a"), req("missing", "Exists")))
    assert affinity_matches((), LABELS)
    assert affinity_matches((no, yes), LABELS)
    assert not affinity_matches((no,), LABELS)
    assert not affinity_matches((NodeSelectorTerm(),), LABELS)  # empty term matches nothing


@pytest.mark.parametrize(
    ("toleration", "taint", "ok"),
    [
        (Toleration("k", "Equal", "v", "NoSchedule"), Taint("k", "v", "NoSchedule"), True),
        (Toleration("k", "Equal", "w", "NoSchedule"), Taint("k", "v", "NoSchedule"), False),
        (Toleration("k", "Exists"), Taint("k", "v", "NoExecute"), True),
        (Toleration("k", "Exists", effect="NoSchedule"), Taint("k", "v", "NoExecute"), False),
        (Toleration("", "Exists"), Taint("anything", "v", "NoExecute"), True),
        (Toleration("", "Equal"), Taint("anything", "", "NoSchedule"), False),
        (Toleration("other", "Exists"), Taint("k", "", "NoSchedule"), False),
        (Toleration("k", "Equal", "", ""), Taint("k", "", "NoSchedule"), True),
    ],
)
def test_tolerations(toleration: Toleration, taint: Taint, ok: bool) -> None:
    assert toleration.tolerates(taint) is ok


def test_taint_effects() -> None:
    assert tolerates((), (Taint("soft", effect="PreferNoSchedule"),))
    assert not tolerates((), (Taint("hard", effect="NoSchedule"),))
    assert not tolerates((), (Taint("evict", effect="NoExecute"),))
    assert tolerates((Toleration("hard", "Exists"),), (Taint("hard"),))


def test_node_accepts_and_match_fields() -> None:
    node = Node("n1", labels=(("zone", "a"),), taints=(Taint("dedicated", "infer"),))
    tol = (Toleration("dedicated", "Equal", "infer", "NoSchedule"),)
    by_name = (NodeSelectorTerm((req("metadata.name", "In", "n1"),)),)
    assert node_accepts(node, tol, (("zone", "a"),), by_name)
    assert not node_accepts(node, (), (("zone", "a"),), ())
    assert not node_accepts(node, tol, (("zone", "b"),), ())


def test_affinity_from_k8s_and_bad_operator() -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}],
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["n1"]}
                        ],
                    }
                ]
            }
        }
    }
    pod = convert(k8s_pod({"affinity": affinity, "tolerations": [{"operator": "Exists"}]}))
    assert pod.affinity == (
        NodeSelectorTerm((req("gpu", "In", "h100"), req("metadata.name", "In", "n1"))),
    )
    assert pod.tolerations == (Toleration("", "Exists"),)
    expr = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    expr["nodeSelectorTerms"][0]["matchExpressions"][0]["operator"] = "Near"
    with pytest.raises(PodSpecError, match="matchExpressions") as err:
        convert(k8s_pod({"affinity": affinity}))
    assert err.value.field.endswith(".operator")
    with pytest.raises(PodSpecError) as terr:
        convert(k8s_pod({"tolerations": [{"key": "k", "operator": "Has"}]}))
    assert terr.value.field == "spec.tolerations[0].operator"
