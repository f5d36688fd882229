"""The differential test's independent checker on hand-made cases taken from the Kubernetes
documentation (Pod Topology Spread Constraints, Assigning Pods to Nodes, Taints and
Tolerations, Resource Management). Each case has a placement the rules allow and one they
forbid, so every test can fail both ways."""

from __future__ import annotations

import json
import re
from fractions import Fraction
from typing import Any

import pytest

from tests.differential.cases import CASE_LABEL, CASE_TAINT, generate
from tests.differential.checker import (
    Violation,
    check,
    effective_requests,
    parse_quantity,
    tolerates,
)

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"


def node(
    name: str,
    zone: str | None = None,
    *,
    cpu: str = "4",
    memory: str = "8Gi",
    pods: str = "110",
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    all_labels = {HOST: name, **(labels or {})}
    if zone is not None:
        all_labels[ZONE] = zone
    alloc = {"cpu": cpu, "memory": memory, "pods": pods}
    return {
        "metadata": {"name": name, "labels": all_labels},
        "spec": {"taints": taints or []},
        "status": {"allocatable": alloc, "capacity": dict(alloc)},
    }


def pod(
    name: str,
    on: str | None,
    labels: dict[str, str] | None = None,
    *,
    cpu: str = "100m",
    memory: str = "64Mi",
    **spec: Any,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "c",
        "image": "x",
        "resources": {"requests": {"cpu": cpu, "memory": memory}},
    }
    if "ports" in spec:
        container["ports"] = spec.pop("ports")
    body: dict[str, Any] = {"containers": [container], **spec}
    if on is not None:
        body["nodeName"] = on
    return {
        "metadata": {"name": name, "namespace": "ns", "labels": labels or {}},
        "spec": body,
    }


def rules(violations: list[Violation]) -> list[str]:
    return sorted({v.rule for v in violations})


# ----------------------------------------------------------------------- topology spread


def spread(max_skew: int = 1, key: str = ZONE, **extra: Any) -> dict[str, Any]:
    return {
        "topologySpreadConstraints": [
            {
                "maxSkew": max_skew,
                "topologyKey": key,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"foo": "bar"}},
                **extra,
            }
        ]
    }


FOUR_NODES_TWO_ZONES = [
    node("node1", "zoneA"),
    node("node2", "zoneA"),
    node("node3", "zoneB"),
    node("node4", "zoneB"),
]


def test_zone_spread_max_skew_1() -> None:
    # The docs' example: with maxSkew 1, a third pod in zoneA next to one in zoneB is a skew
    # of 2; a 2/2 split is fine.
    labels = {"foo": "bar"}
    balanced = [
        pod("p1", "node1", labels, **spread()),
        pod("p2", "node2", labels, **spread()),
        pod("p3", "node3", labels, **spread()),
        pod("p4", "node4", labels, **spread()),
    ]
    assert check(FOUR_NODES_TWO_ZONES, balanced) == []
    skewed = [
        pod("p1", "node1", labels, **spread()),
        pod("p2", "node2", labels, **spread()),
        pod("p3", "node1", labels, **spread()),
        pod("p4", "node3", labels, **spread()),
    ]
    violations = check(FOUR_NODES_TWO_ZONES, skewed)
    assert rules(violations) == ["topologySpread"], violations
    assert "skew 2 > maxSkew 1" in violations[0].detail


def test_spread_max_skew_2_allows_what_1_forbids() -> None:
    labels = {"foo": "bar"}
    three_one = [
        pod("p1", "node1", labels, **spread(2)),
        pod("p2", "node2", labels, **spread(2)),
        pod("p3", "node1", labels, **spread(2)),
        pod("p4", "node3", labels, **spread(2)),
    ]
    assert check(FOUR_NODES_TWO_ZONES, three_one) == []
    four_zero = [pod(f"p{i}", "node1", labels, **spread(2)) for i in range(3)]
    assert rules(check(FOUR_NODES_TWO_ZONES, four_zero)) == ["topologySpread"]


def test_spread_counts_only_matching_pods_and_eligible_nodes() -> None:
    # Pods that do not match the selector do not count; nodes the pod's nodeSelector excludes
    # (zoneB's node3 has no disk label) are no domain: zoneB counts only through node4.
    nodes = [
        node("node1", "zoneA", labels={"disk": "ssd"}),
        node("node3", "zoneB"),
        node("node4", "zoneB", labels={"disk": "ssd"}),
    ]
    sel = {"nodeSelector": {"disk": "ssd"}, **spread()}
    ok = [
        pod("other1", "node1", {"foo": "baz"}),
        pod("other2", "node1", {"foo": "baz"}),
        pod("p1", "node1", {"foo": "bar"}, **sel),
        pod("p2", "node4", {"foo": "bar"}, **sel),
    ]
    assert check(nodes, ok) == []
    # A matching pod on node3 counts nowhere (not eligible), so zoneB still has 0 while
    # zoneA gets its second pod: skew 2.
    bad = [
        pod("q", "node3", {"foo": "bar"}),
        pod("p1", "node1", {"foo": "bar"}, **sel),
        pod("p2", "node1", {"foo": "bar"}, **sel),
    ]
    assert rules(check(nodes, bad)) == ["topologySpread"]


def test_spread_node_without_the_topology_key_is_forbidden() -> None:
    nodes = [node("node1", "zoneA"), node("bare", None)]
    assert check(nodes, [pod("p", "node1", {"foo": "bar"}, **spread())]) == []
    violations = check(nodes, [pod("p", "bare", {"foo": "bar"}, **spread())])
    assert rules(violations) == ["topologySpread"]
    assert "no label" in violations[0].detail


def test_schedule_anyway_is_not_checked() -> None:
    c = spread()
    c["topologySpreadConstraints"][0]["whenUnsatisfiable"] = "ScheduleAnyway"
    pods = [pod(f"p{i}", "node1", {"foo": "bar"}, **c) for i in range(4)]
    assert check(FOUR_NODES_TWO_ZONES, pods) == []


def test_min_domains() -> None:
    # One zone only and minDomains 2: the global minimum counts as 0, so with maxSkew 1 the
    # zone takes a single matching pod. Without minDomains the minimum is the zone's own count.
    nodes = [node("node1", "zoneA"), node("node2", "zoneA")]
    labels = {"foo": "bar"}
    two = [pod("p1", "node1", labels, **spread()), pod("p2", "node2", labels, **spread())]
    assert check(nodes, two) == []
    with_min = [
        pod("p1", "node1", labels, **spread(minDomains=2)),
        pod("p2", "node2", labels, **spread(minDomains=2)),
    ]
    assert rules(check(nodes, with_min)) == ["topologySpread"]
    assert check(nodes, with_min[:1]) == []
    # With two zones minDomains 2 is met and the usual skew applies: zoneA 2, zoneB 0.
    assert rules(check(FOUR_NODES_TWO_ZONES, with_min)) == ["topologySpread"]
    split = [with_min[0], pod("p2", "node3", labels, **spread(minDomains=2))]
    assert check(FOUR_NODES_TWO_ZONES, split) == []


def test_match_label_keys_counts_only_the_same_version() -> None:
    def versioned(name: str, on: str, version: str) -> dict[str, Any]:
        return pod(name, on, {"foo": "bar", "v": version}, **spread(matchLabelKeys=["v"]))

    # Two versions each spread on their own: v1 in zoneA and v2 in zoneA is fine...
    ok = [versioned("a", "node1", "1"), versioned("b", "node2", "2")]
    assert check(FOUR_NODES_TWO_ZONES, ok) == []
    # ...but two v1 in zoneA and none in zoneB is a skew of 2.
    bad = [versioned("a", "node1", "1"), versioned("b", "node2", "1")]
    assert rules(check(FOUR_NODES_TWO_ZONES, bad)) == ["topologySpread"]


def test_spread_is_judged_in_some_valid_order() -> None:
    # An unconstrained matching pod and a constrained one in zoneA, one constrained in zoneB:
    # fine if the zoneB pod came before the second zoneA pod, which some order allows.
    labels = {"foo": "bar"}
    pods = [
        pod("plain", "node1", labels),
        pod("late", "node2", labels, **spread()),
        pod("b", "node3", labels, **spread()),
    ]
    assert check(FOUR_NODES_TWO_ZONES, pods) == []


# ------------------------------------------------------------------------- anti-affinity


def anti(app: str, key: str = HOST) -> dict[str, Any]:
    term = {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}
    return {
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    }


def test_anti_affinity_one_per_node() -> None:
    nodes = [node("n1", "z1"), node("n2", "z1"), node("n3", "z2")]
    web = {"app": "web"}
    spread_out = [pod(f"w{i}", f"n{i}", web, **anti("web")) for i in (1, 2, 3)]
    assert check(nodes, spread_out) == []
    doubled = [
        pod("w1", "n1", web, **anti("web")),
        pod("w2", "n1", web, **anti("web")),
        pod("w3", "n3", web, **anti("web")),
    ]
    violations = check(nodes, doubled)
    assert rules(violations) == ["podAntiAffinity"]
    assert {v.pod for v in violations} == {"ns/w1", "ns/w2"}
    # Per zone: n1 and n2 share z1.
    per_zone = [
        pod("w1", "n1", web, **anti("web", ZONE)),
        pod("w2", "n2", web, **anti("web", ZONE)),
    ]
    assert rules(check(nodes, per_zone)) == ["podAntiAffinity"]


def test_anti_affinity_of_an_existing_pod_is_symmetric() -> None:
    # The existing pod forbids app=web next to it; the incoming web pod has no rule itself.
    nodes = [node("n1"), node("n2")]
    guard = pod("guard", "n1", {"app": "db"}, **anti("web"))
    assert check(nodes, [guard, pod("web", "n2", {"app": "web"})]) == []
    violations = check(nodes, [guard, pod("web", "n1", {"app": "web"})])
    assert [(v.pod, v.rule) for v in violations] == [("ns/guard", "podAntiAffinity")]


def test_anti_affinity_other_namespace_does_not_count() -> None:
    nodes = [node("n1")]
    other = pod("web", "n1", {"app": "web"})
    other["metadata"]["namespace"] = "elsewhere"
    assert check(nodes, [pod("guard", "n1", {"app": "db"}, **anti("web")), other]) == []


# ------------------------------------------------------------------------------ affinity


def affinity(app: str, key: str = HOST) -> dict[str, Any]:
    term = {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}
    return {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}}


def test_affinity_to_a_cache_pod() -> None:
    # The docs' web-store/cache example: each web pod on a node with a cache pod.
    nodes = [node("n1", "z1"), node("n2", "z1"), node("n3", "z2")]
    cache = pod("cache", "n1", {"app": "cache"})
    assert check(nodes, [cache, pod("web", "n1", {"app": "web"}, **affinity("cache"))]) == []
    violations = check(nodes, [cache, pod("web", "n2", {"app": "web"}, **affinity("cache"))])
    assert rules(violations) == ["podAffinity"]
    # Same zone is enough with topologyKey zone, another zone is not.
    same_zone = [cache, pod("web", "n2", {"app": "web"}, **affinity("cache", ZONE))]
    assert check(nodes, same_zone) == []
    other_zone = [cache, pod("web", "n3", {"app": "web"}, **affinity("cache", ZONE))]
    assert rules(check(nodes, other_zone)) == ["podAffinity"]
    # No cache pod at all: the web pod does not match its own term, so no exception.
    assert rules(check(nodes, [pod("web", "n1", {"app": "web"}, **affinity("cache"))])) == [
        "podAffinity"
    ]
    # A cache pod that is not placed does not count.
    pending = pod("cache", None, {"app": "cache"})
    assert rules(
        check(nodes, [pending, pod("web", "n1", {"app": "web"}, **affinity("cache"))])
    ) == ["podAffinity"]


def test_self_affinity_first_pod_exception() -> None:
    # A group with affinity to itself per zone: the first may go anywhere, the rest follow it.
    nodes = [node("n1", "z1"), node("n2", "z1"), node("n3", "z2")]
    web = {"app": "web"}
    together = [pod(f"w{i}", f"n{i}", web, **affinity("web", ZONE)) for i in (1, 2)]
    assert check(nodes, together) == []
    apart = [
        pod("w1", "n1", web, **affinity("web", ZONE)),
        pod("w3", "n3", web, **affinity("web", ZONE)),
    ]
    assert rules(check(nodes, apart)) == ["podAffinity"]
    # A third group member split off from two together: no order explains it.
    split = [*together, pod("w3", "n3", web, **affinity("web", ZONE))]
    assert rules(check(nodes, split)) == ["podAffinity"]


def test_affinity_node_without_the_topology_key() -> None:
    nodes = [node("n1", "z1"), node("bare", None)]
    cache = pod("cache", "n1", {"app": "cache"})
    violations = check(
        nodes, [cache, pod("web", "bare", {"app": "web"}, **affinity("cache", ZONE))]
    )
    assert rules(violations) == ["podAffinity"]


# ---------------------------------------------------------------------------- host ports


def test_host_ports() -> None:
    nodes = [node("n1"), node("n2")]

    def with_port(name: str, on: str, port: int, protocol: str = "TCP", ip: str = "") -> Any:
        spec = {"containerPort": port, "hostPort": port, "protocol": protocol}
        if ip:
            spec["hostIP"] = ip
        return pod(name, on, ports=[spec])

    assert check(nodes, [with_port("a", "n1", 8080), with_port("b", "n2", 8080)]) == []
    assert check(nodes, [with_port("a", "n1", 8080), with_port("b", "n1", 9090)]) == []
    assert check(nodes, [with_port("a", "n1", 8080), with_port("b", "n1", 8080, "UDP")]) == []
    assert rules(check(nodes, [with_port("a", "n1", 8080), with_port("b", "n1", 8080)])) == [
        "hostPorts"
    ]
    # Distinct host IPs do not conflict; 0.0.0.0 (or none) conflicts with every IP.
    distinct = [with_port("a", "n1", 80, ip="10.0.0.1"), with_port("b", "n1", 80, ip="10.0.0.2")]
    assert check(nodes, distinct) == []
    wildcard = [with_port("a", "n1", 80, ip="10.0.0.1"), with_port("b", "n1", 80)]
    assert rules(check(nodes, wildcard)) == ["hostPorts"]


# -------------------------------------------------------------------------------- taints


def test_taints_and_tolerations() -> None:
    taint = {"key": "key1", "value": "value1", "effect": "NoSchedule"}
    nodes = [node("n1", taints=[taint])]
    assert rules(check(nodes, [pod("p", "n1")])) == ["taints"]
    equal = [{"key": "key1", "operator": "Equal", "value": "value1", "effect": "NoSchedule"}]
    exists = [{"key": "key1", "operator": "Exists", "effect": "NoSchedule"}]
    wrong_value = [{"key": "key1", "operator": "Equal", "value": "other", "effect": "NoSchedule"}]
    assert check(nodes, [pod("p", "n1", tolerations=equal)]) == []
    assert check(nodes, [pod("p", "n1", tolerations=exists)]) == []
    assert check(nodes, [pod("p", "n1", tolerations=[{"operator": "Exists"}])]) == []
    assert rules(check(nodes, [pod("p", "n1", tolerations=wrong_value)])) == ["taints"]
    soft = [node("n1", taints=[{**taint, "effect": "PreferNoSchedule"}])]
    assert check(soft, [pod("p", "n1")]) == []
    hard = [node("n1", taints=[{**taint, "effect": "NoExecute"}])]
    assert rules(check(hard, [pod("p", "n1", tolerations=equal)])) == ["taints"]


def test_toleration_matching() -> None:
    taint = {"key": "k", "value": "v", "effect": "NoExecute"}
    assert tolerates({"key": "k", "value": "v"}, taint)  # empty effect matches all
    assert tolerates({"key": "k", "operator": "Exists"}, taint)
    assert not tolerates({"key": "k", "operator": "Exists", "effect": "NoSchedule"}, taint)
    assert not tolerates({"key": "other", "operator": "Exists"}, taint)


# ---------------------------------------------------------- selectors, affinity, resources


def test_node_selector_and_required_node_affinity() -> None:
    nodes = [node("n1", "z1", labels={"disk": "ssd"}), node("n2", "z2")]
    assert check(nodes, [pod("p", "n1", nodeSelector={"disk": "ssd"})]) == []
    assert rules(check(nodes, [pod("p", "n2", nodeSelector={"disk": "ssd"})])) == ["nodeSelector"]

    def required(*terms: dict[str, Any]) -> dict[str, Any]:
        return {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": list(terms)
                    }
                }
            }
        }

    not_z1 = required({"matchExpressions": [{"key": ZONE, "operator": "NotIn", "values": ["z1"]}]})
    assert check(nodes, [pod("p", "n2", **not_z1)]) == []
    # NotIn also matches a node without the label at all (DoesNotExist is not needed).
    assert check([node("bare")], [pod("p", "bare", **not_z1)]) == []
    assert rules(check(nodes, [pod("p", "n1", **not_z1)])) == ["nodeAffinity"]
    has_disk = required({"matchExpressions": [{"key": "disk", "operator": "Exists"}]})
    assert rules(check(nodes, [pod("p", "n2", **has_disk)])) == ["nodeAffinity"]
    # Terms are ORed.
    either = required(
        {"matchExpressions": [{"key": "disk", "operator": "Exists"}]},
        {"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["z2"]}]},
    )
    assert check(nodes, [pod("p", "n1", **either), pod("q", "n2", **either)]) == []


def test_resources_and_pod_count() -> None:
    nodes = [node("n1", cpu="1", memory="1Gi", pods="2")]
    fits = [pod("a", "n1", cpu="500m", memory="512Mi"), pod("b", "n1", cpu="0.5", memory="512Mi")]
    assert check(nodes, fits) == []
    too_much_cpu = [pod("a", "n1", cpu="600m"), pod("b", "n1", cpu="500m")]
    violations = check(nodes, too_much_cpu)
    assert rules(violations) == ["resources"] and "cpu" in violations[0].detail
    too_many = [pod(f"p{i}", "n1", cpu="10m") for i in range(3)]
    assert rules(check(nodes, too_many)) == ["resources"]


def test_effective_requests_with_init_containers() -> None:
    p = pod("p", "n1", cpu="1", memory="1Gi")
    p["spec"]["initContainers"] = [
        {"name": "init", "resources": {"requests": {"cpu": "2"}}},
        {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "250m"}}},
    ]
    p["spec"]["overhead"] = {"cpu": "100m"}
    req = effective_requests(p)
    # max(2 (init, before the sidecar), 1 + 0.25 (app + sidecar)) + 0.1 overhead
    assert req["cpu"] == Fraction(21, 10)
    assert req["memory"] == 2**30


@pytest.mark.parametrize(
    ("text", "value"),
    [("500m", Fraction(1, 2)), ("2", 2), ("1.5Gi", 3 * 2**29), ("1k", 1000), ("1e3", 1000)],
)
def test_parse_quantity(text: str, value: Fraction) -> None:
    assert parse_quantity(text) == value


def test_unplaced_pods_are_ignored() -> None:
    nodes = [node("n1", cpu="1")]
    assert check(nodes, [pod("a", "n1", cpu="1"), pod("b", None, cpu="1")]) == []
    assert rules(check(nodes, [pod("a", "ghost")])) == ["unknownNode"]


# ------------------------------------------------- the generator the checker is used with


def test_generated_copies_differ_only_in_names_and_are_isolated() -> None:
    for seed in range(40):
        kube = generate(seed, 7, "k", "kube")
        ours = generate(seed, 7, "o", "ours", pod_labels={"kai.scheduler/queue": "q"})

        def neutral(copy: Any, side: str) -> str:
            for pod in copy.pods:
                pod["spec"].pop("schedulerName")
                pod["metadata"]["labels"].pop("kai.scheduler/queue", None)
            text = json.dumps([copy.nodes, copy.pods])
            return re.sub(rf"\bd7{side}-|\b7-{side}\b|diff-7-{side}\b", "X", text)

        assert neutral(kube, "k") == neutral(ours, "o"), seed
        copy = generate(seed, 3, "k", "kube")
        names = {n["metadata"]["name"] for n in copy.nodes}
        assert 2 <= len(names) <= 6 and 3 <= len(copy.pods) <= 12
        for n in copy.nodes:
            labels = n["metadata"]["labels"]
            assert labels[HOST] == n["metadata"]["name"] and labels[CASE_LABEL] == "3-k"
            assert {"key": CASE_TAINT, "value": "3-k", "effect": "NoSchedule"} in n["spec"][
                "taints"
            ]
            for key in (ZONE, "diff.kai/rack"):
                assert labels.get(key, "d3k-").startswith("d3k-"), labels
        for p in copy.pods:
            spec = p["spec"]
            assert spec["nodeSelector"][CASE_LABEL] == "3-k"
            assert any(t.get("value") == "3-k" for t in spec["tolerations"])
            text = json.dumps(spec)
            assert "namespaceSelector" not in text and '"namespaces"' not in text
            assert "nodeAffinityPolicy" not in text
            # Every zone a pod names is one of its own copy's.
            assert set(re.findall(r"d\d+[ko]-z\d", text)) <= {
                n["metadata"]["labels"].get(ZONE) for n in copy.nodes
            } | {f"d3k-z{k}" for k in range(3)}
