"""PersistentVolumeClaims of pending pods: a bound volume's node affinity restricts nodes, an
unusable claim makes the pod (and its gang) wait with a reason naming it.

Through the cache (PersistentVolumeClaim, PersistentVolume, StorageClass and Pod objects in
their API form), fair share and solve, as in a cluster.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from scheduler.cache import Cache
from scheduler.cluster import Snapshot
from scheduler.cluster.selectors import NodeSelectorRequirement, NodeSelectorTerm
from scheduler.cluster.volumes import (
    MAX_TERMS,
    PodClaim,
    and_terms,
    pod_claims,
)
from scheduler.fairness import compute_fair_shares
from scheduler.simulate.scenario import ScenarioError, parse_scenario
from scheduler.solver import solve
from tests.unit.test_unsupported_fields import (
    SCENARIO,
    SCHED,
    SETTINGS,
    decide,
    k8s_node,
    k8s_pod,
    k8s_podgroup,
    node_terms,
    placed_pods,
)

HOST = "kubernetes.io/hostname"
BIND_COMPLETED = {"pv.kubernetes.io/bind-completed": "yes"}


def claim_volume(claim: str, name: str = "data") -> dict[str, Any]:
    return {"name": name, "persistentVolumeClaim": {"claimName": claim}}


def pvc_pod(name: str, *claims: str, gpus: int = 1, **kw: Any) -> dict[str, Any]:
    spec = {
        "volumes": [claim_volume(c, f"v{i}") for i, c in enumerate(claims)],
        **kw.pop("spec", {}),
    }
    return k8s_pod(name, gpus=gpus, spec=spec, **kw)


def pvc(
    name: str,
    volume: str | None = None,
    *,
    complete: bool = True,
    storage_class: str | None = None,
    owner: str | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-pvc-{name}"}
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"]}
    if volume:
        spec["volumeName"] = volume
        if complete:
            meta["annotations"] = dict(BIND_COMPLETED)
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    if owner:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": owner, "controller": True}
        ]
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": spec, "status": {"phase": "Bound" if volume else "Pending"}}


def pv(
    name: str,
    *hosts: str,
    terms: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]}
    if hosts:
        terms = [{"matchExpressions": [{"key": HOST, "operator": "In", "values": list(hosts)}]}]
    if terms is not None:
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": terms}}
    return {
        "metadata": {"name": name, "uid": f"uid-pv-{name}", "labels": labels or {}},
        "spec": spec,
    }


def storage_class(name: str, mode: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "provisioner": "x", "volumeBindingMode": mode}


def node(name: str, **labels: str) -> dict[str, Any]:
    obj = k8s_node(name)
    obj["metadata"]["labels"] = {HOST: name, **labels}
    return obj


def cluster(*objs: tuple[str, dict[str, Any]], nodes: int = 3) -> Cache:
    cache = Cache(SCHED, "q", lambda: 1000.0)
    for i in range(1, nodes + 1):
        cache.apply("Node", "ADDED", node(f"n{i}"))
    cache.apply("Queue", "ADDED", {"metadata": {"name": "q", "uid": "uid-q"}, "spec": {}})
    for kind, obj in objs:
        cache.apply(kind, "ADDED", obj)
    return cache


def placement_of(cache: Cache) -> dict[str, str]:
    _, placement, _ = decide(cache)
    return {a.pod_key: a.node for a in placement.assignments}


def waits(cache: Cache, gang: str = "ns/p") -> tuple[str, str]:
    _, placement, _ = decide(cache)
    outcome = placement.outcomes[gang]
    assert not outcome.placed
    return outcome.reason_code, outcome.reason


# --- reading the pod --------------------------------------------------------------------


def test_claims_of_a_pod_spec() -> None:
    spec = {
        "volumes": [
            claim_volume("data", "a"),
            {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
            claim_volume("data", "again"),  # the same claim once
            {"name": "cfg", "configMap": {"name": "c"}},
            {"name": "bad", "persistentVolumeClaim": {"claimName": ""}},
            None,
            "x",
        ]
    }
    assert pod_claims(spec, "p") == (
        PodClaim("data", "a"),
        PodClaim("p-scratch", "scratch", ephemeral=True),
    )
    assert pod_claims(None, "p") == pod_claims({"volumes": "x"}, "p") == ()


def req(key: str, *values: str) -> NodeSelectorRequirement:
    return NodeSelectorRequirement(key, "In", values)


def term(*reqs: NodeSelectorRequirement) -> NodeSelectorTerm:
    return NodeSelectorTerm(reqs)


def test_and_of_two_ors_is_their_cross_product() -> None:
    a, b, x, y = req("zone", "a"), req("zone", "b"), req(HOST, "n1"), req(HOST, "n3")
    assert and_terms((term(a), term(b)), (term(x), term(y))) == (
        term(a, x),
        term(a, y),
        term(b, x),
        term(b, y),
    )
    # No affinity is no restriction; the same requirement is not repeated.
    assert and_terms((), (term(x),)) == (term(x),)
    assert and_terms((term(x),), (term(x),)) == (term(x),)
    assert and_terms() == and_terms((), ()) == ()
    # A term without requirements matches nothing: dropped, and "no node" when none is left.
    assert and_terms((term(a), term()), (term(x),)) == (term(a, x),)
    assert and_terms((term(a),), (term(),)) == (term(),)
    many = tuple(term(req("k", str(i))) for i in range(9))
    assert len(and_terms(many, many, limit=100) or ()) == 81 > MAX_TERMS
    assert and_terms(many, many) is None


# --- bound claims: the volume's node affinity -------------------------------------------


def test_a_bound_volume_with_node_affinity_puts_the_pod_on_its_node() -> None:
    cache = cluster(
        ("PersistentVolume", pv("pv-1", "n2")),
        ("PersistentVolumeClaim", pvc("data", "pv-1")),
        ("Pod", pvc_pod("p", "data")),
        ("Pod", k8s_pod("plain", gpus=1)),
    )
    snap = cache.snapshot()
    (p,) = [x for x in snap.pods if x.name == "p"]
    assert p.affinity == (term(req(HOST, "n2")),)
    assert p.blocked is None
    placed = placement_of(cache)
    assert placed["ns/p"] == "n2"
    assert "ns/plain" in placed


def test_the_greedy_pass_alone_honours_it_too() -> None:
    cache = cluster(
        ("PersistentVolume", pv("pv-1", "n3")),
        ("PersistentVolumeClaim", pvc("data", "pv-1")),
        ("Pod", pvc_pod("p", "data")),
    )
    snap = cache.snapshot()
    report = compute_fair_shares(snap)
    placement = solve(snap, dataclasses.replace(SETTINGS, greedy_only=True), report)
    assert {a.pod_key: a.node for a in placement.assignments} == {"ns/p": "n3"}


def test_pod_and_volume_affinities_are_anded_term_by_term() -> None:
    """Pod: zone a OR zone b. Volume: n1 OR n3. Only n1 is in both (n3 is zone c)."""
    cache = Cache(SCHED, "q", lambda: 1000.0)
    cache.apply("Queue", "ADDED", {"metadata": {"name": "q", "uid": "uid-q"}, "spec": {}})
    for name, zone in (("n1", "a"), ("n2", "b"), ("n3", "c")):
        cache.apply("Node", "ADDED", node(name, zone=zone))
    zones = node_terms(
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
    )
    cache.apply("PersistentVolume", "ADDED", pv("pv-1", "n1", "n3"))
    cache.apply("PersistentVolumeClaim", "ADDED", pvc("data", "pv-1"))
    cache.apply("Pod", "ADDED", pvc_pod("p", "data", spec=zones))
    (p,) = cache.snapshot().pods
    assert p.affinity == (
        term(req("zone", "a"), req(HOST, "n1", "n3")),
        term(req("zone", "b"), req(HOST, "n1", "n3")),
    )
    assert placement_of(cache) == {"ns/p": "n1"}


def test_two_volumes_on_different_nodes_leave_no_node() -> None:
    cache = cluster(
        ("PersistentVolume", pv("pv-1", "n1")),
        ("PersistentVolume", pv("pv-2", "n2")),
        ("PersistentVolumeClaim", pvc("a", "pv-1")),
        ("PersistentVolumeClaim", pvc("b", "pv-2")),
        ("Pod", pvc_pod("p", "a", "b")),
    )
    assert waits(cache) == (
        "NoMatchingNode",
        "no node matches the required node affinity of the pod and its persistentvolumes "
        f"({HOST} In n1 and {HOST} In n2)",
    )


def test_match_fields_on_the_node_name_and_no_affinity() -> None:
    by_name = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n3"]}]}]
    cache = cluster(
        ("PersistentVolume", pv("pv-1", terms=by_name)),
        ("PersistentVolume", pv("pv-any")),  # no node affinity: anywhere
        ("PersistentVolumeClaim", pvc("data", "pv-1")),
        ("PersistentVolumeClaim", pvc("any", "pv-any")),
        ("Pod", pvc_pod("p", "data", "any")),
    )
    assert placement_of(cache) == {"ns/p": "n3"}


def test_too_many_alternatives_wait_named() -> None:
    terms = [
        {"matchExpressions": [{"key": "k", "operator": "In", "values": [str(i)]}]} for i in range(9)
    ]
    cache = cluster(
        ("PersistentVolume", pv("pv-1", terms=terms)),
        ("PersistentVolumeClaim", pvc("data", "pv-1")),
        ("Pod", pvc_pod("p", "data", spec=node_terms(*terms))),
    )
    code, reason = waits(cache)
    assert code == "UnsupportedField"
    assert f"more than {MAX_TERMS} node selector terms" in reason


def test_a_volume_selecting_by_another_field_waits_named() -> None:
    terms = [{"matchFields": [{"key": "spec.unschedulable", "operator": "In", "values": ["x"]}]}]
    cache = cluster(
        ("PersistentVolume", pv("pv-1", terms=terms)),
        ("PersistentVolumeClaim", pvc("data", "pv-1")),
        ("Pod", pvc_pod("p", "data")),
    )
    assert waits(cache) == (
        "UnsupportedField",
        "pod ns/p: persistentvolume pv-1: spec.nodeAffinity.required.nodeSelectorTerms[0]"
        ".matchFields[0] is not supported yet (only metadata.name is); the pod waits",
    )


def test_zone_labels_of_a_volume_restrict_labelled_nodes() -> None:
    """VolumeZone: the PV's zone label must match; the deprecated label may match the node's
    GA label; a node with no zone or region label at all is accepted."""
    cache = Cache(SCHED, "q", lambda: 1000.0)
    cache.apply("Queue", "ADDED", {"metadata": {"name": "q", "uid": "uid-q"}, "spec": {}})
    cache.apply("Node", "ADDED", node("n1", **{"topology.kubernetes.io/zone": "a"}))
    cache.apply("Node", "ADDED", node("n2", **{"topology.kubernetes.io/zone": "b"}))
    cache.apply(
        "PersistentVolume", "ADDED", pv("pv-b", labels={"topology.kubernetes.io/zone": "b"})
    )
    beta = {"failure-domain.beta.kubernetes.io/zone": "a__c"}
    cache.apply("PersistentVolume", "ADDED", pv("pv-a", labels=beta))
    cache.apply("PersistentVolumeClaim", "ADDED", pvc("zb", "pv-b"))
    cache.apply("PersistentVolumeClaim", "ADDED", pvc("za", "pv-a"))
    cache.apply("Pod", "ADDED", pvc_pod("pb", "zb"))
    cache.apply("Pod", "ADDED", pvc_pod("pa", "za"))
    assert placement_of(cache) == {"ns/pb": "n2", "ns/pa": "n1"}
    cache.apply("Node", "ADDED", node("bare"))  # no topology label: any PV's zone is fine
    cache.apply("Node", "DELETED", node("n1"))
    cache.apply("Node", "DELETED", node("n2"))
    assert placement_of(cache) == {"ns/pb": "bare", "ns/pa": "bare"}


# --- claims that keep the pod waiting ---------------------------------------------------


def test_a_missing_claim_waits_named_and_the_claim_wakes_the_loop() -> None:
    cache = cluster(("Pod", pvc_pod("p", "data")), ("Pod", k8s_pod("plain", gpus=1)))
    snap, placement, requested = decide(cache)
    assert placed_pods(placement) == {"ns/plain"}
    outcome = placement.outcomes["ns/p"]
    assert (outcome.reason_code, outcome.reason) == (
        "VolumeNotFound",
        "pod ns/p: persistentvolumeclaim ns/data not found",
    )
    assert snap.pod_by_uid["uid-p"].pending  # PodScheduled=False with that message
    assert requested["gpu"] == 1000  # the waiting pod asks its queue for nothing
    assert cache.problems() == []
    # A claim nobody uses changes nothing a cycle could act on.
    cache.pending_changed.clear()
    cache.apply("PersistentVolumeClaim", "ADDED", pvc("other", "pv-x"))
    assert not cache.pending_changed.is_set()
    cache.apply("PersistentVolume", "ADDED", pv("pv-x", "n1"))
    assert not cache.pending_changed.is_set()
    # The claim and its volume arrive: each wakes the loop, and the pod goes where the volume is.
    cache.apply("PersistentVolumeClaim", "ADDED", pvc("data", "pv-1"))
    assert cache.pending_changed.is_set()
    code, reason = waits(cache)
    assert (code, reason) == (
        "VolumeNotFound",
        "pod ns/p: persistentvolumeclaim ns/data is bound to persistentvolume pv-1, which does "
        "not exist",
    )
    cache.pending_changed.clear()
    cache.apply("PersistentVolume", "ADDED", pv("pv-1", "n2"))
    assert cache.pending_changed.is_set()
    assert placement_of(cache)["ns/p"] == "n2"
    # The claim goes away again: the pod waits again.
    cache.apply("PersistentVolumeClaim", "DELETED", pvc("data", "pv-1"))
    assert waits(cache)[0] == "VolumeNotFound"


def test_one_waiting_pod_keeps_its_whole_gang_out() -> None:
    cache = cluster(
        ("PodGroup", k8s_podgroup("train", 3)),
        ("Pod", pvc_pod("train-0", "a", group="train")),
        ("Pod", pvc_pod("train-1", "b", group="train")),
        ("Pod", k8s_pod("train-2", gpus=1, group="train")),
        ("Pod", k8s_pod("plain", gpus=1)),
    )
    _, placement, _ = decide(cache)
    assert placed_pods(placement) == {"ns/plain"}
    outcome = placement.outcomes["ns/train"]
    assert (outcome.reason_code, outcome.reason) == (
        "VolumeNotFound",
        "pod ns/train-0: persistentvolumeclaim ns/a not found; 1 more pod of gang ns/train too",
    )


@pytest.mark.parametrize(
    ("objs", "reason"),
    [
        ([pvc("data")], "waiting for persistentvolumeclaim ns/data to be bound"),
        (
            [pvc("data", storage_class="fast"), storage_class("fast", "Immediate")],
            "waiting for persistentvolumeclaim ns/data to be bound",
        ),
        (
            [pvc("data", storage_class="gone")],
            "waiting for persistentvolumeclaim ns/data to be bound (StorageClass gone not found)",
        ),
        (
            [pvc("data", "pv-1", complete=False), pv("pv-1", "n1")],
            "waiting for persistentvolumeclaim ns/data to be bound (to persistentvolume pv-1)",
        ),
    ],
    ids=["no-class", "immediate", "unknown-class", "prebound-not-complete"],
)
def test_an_unbound_claim_waits_for_its_binding(objs: list[dict[str, Any]], reason: str) -> None:
    kinds = {"spec": "PersistentVolumeClaim", "provisioner": "StorageClass"}
    cache = cluster(
        *((next((k for f, k in kinds.items() if f in o), "PersistentVolume"), o) for o in objs),
        ("Pod", pvc_pod("p", "data")),
    )
    assert waits(cache) == ("VolumeNotBound", f"pod ns/p: {reason}")


def test_wait_for_first_consumer_is_not_bound_yet_and_says_so() -> None:
    cache = cluster(
        ("StorageClass", storage_class("local", "WaitForFirstConsumer")),
        ("PersistentVolumeClaim", pvc("data", storage_class="local")),
        ("PersistentVolume", pv("pv-1", "n1")),  # Available, but binding it is not done here
        ("Pod", pvc_pod("p", "data")),
    )
    code, reason = waits(cache)
    assert code == "UnsupportedField"
    assert "binding WaitForFirstConsumer volumes is not supported yet" in reason
    assert reason.startswith("pod ns/p: persistentvolumeclaim ns/data (StorageClass local)")
    # The class changes to Immediate (recreated): the message follows the class.
    cache.pending_changed.clear()
    cache.apply("StorageClass", "MODIFIED", storage_class("local", "Immediate"))
    assert cache.pending_changed.is_set()
    assert waits(cache)[0] == "VolumeNotBound"
    # Bound by the PV controller: placed on the volume's node.
    cache.apply("PersistentVolumeClaim", "MODIFIED", pvc("data", "pv-1", storage_class="local"))
    assert placement_of(cache) == {"ns/p": "n1"}


def test_a_claim_being_deleted_waits() -> None:
    cache = cluster(
        ("PersistentVolume", pv("pv-1")),
        ("PersistentVolumeClaim", pvc("data", "pv-1", deleting=True)),
        ("Pod", pvc_pod("p", "data")),
    )
    assert waits(cache) == (
        "VolumeNotFound",
        "pod ns/p: persistentvolumeclaim ns/data is being deleted",
    )


def test_ephemeral_volumes_need_the_pods_own_claim() -> None:
    eph = {"volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]}
    cache = cluster(("PersistentVolume", pv("pv-1", "n3")), ("Pod", k8s_pod("p", spec=eph)))
    assert waits(cache) == (
        "VolumeNotFound",
        "pod ns/p: persistentvolumeclaim ns/p-scratch of ephemeral volume scratch not found "
        "(the ephemeral volume controller creates it)",
    )
    cache.apply("PersistentVolumeClaim", "ADDED", pvc("p-scratch", "pv-1", owner="someone-else"))
    assert waits(cache) == (
        "VolumeNotFound",
        "pod ns/p: persistentvolumeclaim ns/p-scratch was not created for pod ns/p (ephemeral "
        "volume scratch; the pod does not own the claim)",
    )
    cache.apply("PersistentVolumeClaim", "MODIFIED", pvc("p-scratch", "pv-1", owner="uid-p"))
    assert placement_of(cache) == {"ns/p": "n3"}


def test_without_permission_to_read_claims_such_pods_wait_and_others_run() -> None:
    cache = cluster(
        ("PersistentVolume", pv("pv-1", "n2")),
        ("PersistentVolumeClaim", pvc("data", "pv-1")),
        ("Pod", pvc_pod("p", "data")),
        ("Pod", k8s_pod("plain", gpus=1)),
    )
    cache.set_absent("PersistentVolume", True)
    _, placement, _ = decide(cache)
    assert placed_pods(placement) == {"ns/plain"}
    outcome = placement.outcomes["ns/p"]
    assert outcome.reason_code == "VolumeNotFound"
    assert "the scheduler may not read persistentvolumes" in outcome.reason
    cache.set_absent("PersistentVolume", False)
    cache.set_absent("PersistentVolumeClaim", True)
    assert "may not read persistentvolumeclaims" in waits(cache)[1]
    cache.set_absent("PersistentVolumeClaim", False)
    assert placement_of(cache)["ns/p"] == "n2"


def test_bound_and_foreign_pods_are_not_judged() -> None:
    """A pod already on a node stays there; another scheduler's pod is its business."""
    cache = cluster(
        ("Pod", pvc_pod("bound", "missing", node_name="n1", phase="Running")),
        ("Pod", pvc_pod("theirs", "missing", scheduler="default-scheduler")),
    )
    snap = cache.snapshot()
    assert all(p.blocked is None for p in snap.pods)
    _, placement, _ = decide(cache)
    assert placement.outcomes == {}


def test_incremental_view_equals_a_fresh_cache() -> None:
    """After claims, volumes and classes come and go, the snapshot is what a cache fed the
    final objects at once makes."""
    events: list[tuple[str, str, dict[str, Any]]] = [
        ("Pod", "ADDED", pvc_pod("p", "a", "b")),
        ("Pod", "ADDED", pvc_pod("q", "b")),
        ("PersistentVolumeClaim", "ADDED", pvc("a", "pv-1")),
        ("PersistentVolume", "ADDED", pv("pv-1", "n1", "n2")),
        ("PersistentVolumeClaim", "ADDED", pvc("b", storage_class="wffc")),
        ("StorageClass", "ADDED", storage_class("wffc", "WaitForFirstConsumer")),
        ("PersistentVolume", "ADDED", pv("pv-2", "n2")),
        ("PersistentVolumeClaim", "MODIFIED", pvc("b", "pv-2", storage_class="wffc")),
        ("Pod", "DELETED", pvc_pod("q", "b")),
        ("PersistentVolume", "MODIFIED", pv("pv-1", "n1", "n2", "n3")),
    ]
    cache = cluster()
    final: dict[tuple[str, str], dict[str, Any]] = {}
    for kind, event, obj in events:
        cache.apply(kind, event, obj)
        cache.snapshot()
        key = (kind, obj["metadata"]["name"])
        if event == "DELETED":
            final.pop(key, None)
        else:
            final[key] = obj
    fresh = cluster(*((kind, obj) for (kind, _), obj in final.items()))
    assert cache.snapshot().pods == fresh.snapshot().pods
    (p,) = cache.snapshot().pods
    assert p.affinity == (term(req(HOST, "n1", "n2", "n3"), req(HOST, "n2")),)
    assert placement_of(cache) == {"ns/p": "n2"}


def test_snapshot_round_trips_a_blocked_pod() -> None:
    cache = cluster(("Pod", pvc_pod("p", "data")))
    snap = cache.snapshot()
    (p,) = snap.pods
    assert p.blocked == ("VolumeNotFound", "persistentvolumeclaim ns/data not found")
    assert Snapshot.from_json(snap.to_json()).pods == (p,)


def test_the_simulator_refuses_claims() -> None:
    data = copy.deepcopy(SCENARIO)
    data["jobs"][1]["pods"] = {
        "template": {
            "spec": {
                "volumes": [claim_volume("data")],
                "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
            }
        }
    }
    with pytest.raises(ScenarioError) as err:
        parse_scenario(data)
    assert err.value.field == "jobs[1].pods.template.spec.volumes"
