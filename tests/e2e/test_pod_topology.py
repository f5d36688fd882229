"""Pod affinity, anti-affinity and topology spread against the real control plane.

Workloads are what users write: a StatefulSet whose replicas may not share a host, a
Deployment spread over zones, a pod that wants to run next to a cache pod. Their pods are made
by kube-controller-manager (the session's control plane runs it), scheduled by our scheduler
with the shipped RBAC and run by kwok. Every test uses a fresh namespace and fresh nodes
labelled with a per-test tag that its pods select, and zone names unique to the test.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from tests.e2e.scheduler_process import (
    KaiCluster,
    StartScheduler,
    bound_nodes,
    kai_cluster,
    kubectl_json,
    pod_manifest,
    run_tag,
    start_scheduler,
    wait_for,
)

pytestmark = pytest.mark.e2e
__all__ = ["kai_cluster", "start_scheduler"]  # fixtures used by this module

HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def _anti_affinity(app: str, key: str = HOST) -> dict[str, Any]:
    return {
        "podAntiAffinity": {
            REQUIRED: [{"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}]
        }
    }


def _template(app: str, tag: dict[str, str], **spec: Any) -> dict[str, Any]:
    """A pod template labelled app=``app`` that selects the test's nodes."""
    pod = pod_manifest("x", gpus=1, node_selector=tag, labels={"app": app})
    pod["spec"].update(spec)
    return {"metadata": {"labels": pod["metadata"]["labels"]}, "spec": pod["spec"]}


def _workload(kind: str, name: str, replicas: int, template: dict[str, Any]) -> dict[str, Any]:
    app = template["metadata"]["labels"]["app"]
    spec: dict[str, Any] = {
        "replicas": replicas,
        "selector": {"matchLabels": {"app": app}},
        "template": template,
    }
    if kind == "StatefulSet":
        # Parallel: the replicas are created together and placed in the same cycles, so the
        # scheduler must count the ones it places before the API server shows them bound.
        spec.update(serviceName=name, podManagementPolicy="Parallel")
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name}, "spec": spec}


def _zone_nodes(make_gpu_nodes: Any, tag: dict[str, str], zones: dict[str, int]) -> dict[str, str]:
    """Nodes per zone (``zones``: name -> count), 4 GPUs each; node name -> zone."""
    out: dict[str, str] = {}
    for zone, count in zones.items():
        for name in make_gpu_nodes(count, gpus=4, labels={**tag, ZONE: zone}):
            out[name] = zone
    return out


def _waiting(pods: list[dict[str, Any]]) -> dict[str, str]:
    """Pod name -> message of PodScheduled=False/Unschedulable."""
    out = {}
    for p in pods:
        for c in (p.get("status") or {}).get("conditions") or []:
            kind = (c.get("type"), c.get("status"), c.get("reason"))
            if kind == ("PodScheduled", "False", "Unschedulable"):
                out[p["metadata"]["name"]] = str(c.get("message", ""))
    return out


def _bound(kai_cluster: KaiCluster, namespace: str, count: int) -> Any:
    """A check for :func:`wait_for`: pod -> node once exactly ``count`` pods exist, all bound."""

    def check() -> dict[str, str] | None:
        pods = kai_cluster.pods(namespace)
        nodes = bound_nodes(pods)
        return nodes if len(pods) == count and len(nodes) == count else None

    return check


def test_statefulset_with_hostname_anti_affinity_gets_one_node_per_replica(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    tag = run_tag()
    # 4 GPUs each: binpack alone would put all three 1-GPU replicas on one node.
    nodes = make_gpu_nodes(3, gpus=4, labels=tag)
    sched = start_scheduler()
    template = _template("db", tag, affinity=_anti_affinity("db"))
    kai_cluster.create(_workload("StatefulSet", "db", 3, template), namespace=namespace)

    where = wait_for("3 StatefulSet replicas bound", _bound(kai_cluster, namespace, 3), logs=sched)
    assert set(where) == {"db-0", "db-1", "db-2"}  # made by the StatefulSet controller
    assert sorted(where.values()) == sorted(nodes), where
    sts = kubectl_json(kai_cluster.cp, "get", "statefulset", "db", "-n", namespace)
    assert sts["status"].get("replicas") == 3
    assert sched.running()


def test_deployment_spread_over_two_zones_ends_two_and_two(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    tag = run_tag()
    suffix = tag["kai-e2e"]
    zone_of = _zone_nodes(make_gpu_nodes, tag, {f"a-{suffix}": 2, f"b-{suffix}": 2})
    sched = start_scheduler()
    spread = {
        "maxSkew": 1,
        "topologyKey": ZONE,
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "web"}},
    }
    template = _template("web", tag, topologySpreadConstraints=[spread])
    kai_cluster.create(_workload("Deployment", "web", 4, template), namespace=namespace)

    where = wait_for("4 Deployment replicas bound", _bound(kai_cluster, namespace, 4), logs=sched)
    per_zone = Counter(zone_of[n] for n in where.values())
    assert sorted(per_zone.values()) == [2, 2], where
    assert sched.running()


def test_pod_with_affinity_to_a_cache_pod_lands_in_its_zone(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    tag = run_tag()
    suffix = tag["kai-e2e"]
    zone_a, zone_b = f"a-{suffix}", f"b-{suffix}"
    zone_of = _zone_nodes(make_gpu_nodes, tag, {zone_a: 2, zone_b: 2})
    a_nodes = sorted(n for n, z in zone_of.items() if z == zone_a)
    b_nodes = sorted(n for n, z in zone_of.items() if z == zone_b)
    sched = start_scheduler()
    # The cache on a zone-b node; a filler makes a zone-a node the fullest, so binpack alone
    # would send the app pods to zone a.
    cache = pod_manifest("cache", gpus=1, node_selector={**tag, HOST: b_nodes[1]})
    cache["metadata"]["labels"] = {"app": "cache"}
    filler = pod_manifest("filler", gpus=2, node_selector={**tag, HOST: a_nodes[0]})
    kai_cluster.create(cache, filler, namespace=namespace)
    wait_for("cache and filler bound", _bound(kai_cluster, namespace, 2), logs=sched)

    def near(name: str, key: str) -> dict[str, Any]:
        pod = pod_manifest(name, gpus=1, node_selector=tag, labels={"app": name})
        term = {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": key}
        pod["spec"]["affinity"] = {"podAffinity": {REQUIRED: [term]}}
        return pod

    kai_cluster.create(near("same-zone", ZONE), near("same-host", HOST), namespace=namespace)
    where = wait_for("app pods bound", _bound(kai_cluster, namespace, 4), logs=sched)
    assert zone_of[where["same-zone"]] == zone_b, where
    assert where["same-host"] == where["cache"] == b_nodes[1], where
    assert sched.running()


def test_a_fourth_anti_affine_replica_on_three_nodes_waits_saying_why(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    tag = run_tag()
    nodes = make_gpu_nodes(3, gpus=4, labels=tag)
    sched = start_scheduler()
    template = _template("api", tag, affinity=_anti_affinity("api"))
    kai_cluster.create(_workload("Deployment", "api", 4, template), namespace=namespace)

    def three_bound_one_waiting() -> tuple[dict[str, str], dict[str, str]] | None:
        pods = kai_cluster.pods(namespace)
        where, waiting = bound_nodes(pods), _waiting(pods)
        if len(pods) == 4 and len(where) == 3 and len(waiting) == 1:
            return where, waiting
        return None

    where, waiting = wait_for(
        "3 replicas bound and the 4th Unschedulable", three_bound_one_waiting, logs=sched
    )
    assert sorted(where.values()) == sorted(nodes), where
    ((name, message),) = waiting.items()
    assert message.startswith(f"pod {namespace}/{name}: "), message
    assert "3 node(s) didn't match pod anti-affinity rules" in message, message

    def failed_scheduling() -> list[str]:
        return [
            str(e.get("message", ""))
            for e in kai_cluster.events(namespace)
            if e["involvedObject"].get("name") == name and e.get("reason") == "FailedScheduling"
        ]

    events = wait_for(f"FailedScheduling on {name}", failed_scheduling, logs=sched)
    assert all("didn't match pod anti-affinity rules" in e for e in events), events
    # It stays waiting: the rule holds cycle after cycle.
    assert len(bound_nodes(kai_cluster.pods(namespace))) == 3
    assert sched.running()
