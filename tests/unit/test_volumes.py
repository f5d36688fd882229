"""PersistentVolumeClaims of pending pods: a bound volume's node affinity restricts nodes, an
unusable claim makes the pod (and its gang) wait with a reason naming it.

Through the cache (PersistentVolumeClaim, PersistentVolume, StorageClass and Pod objects in
their API form), fair share and solve, as in a cluster.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from collections.abc import Iterator
from typing import Any, cast

import pytest
import structlog

from scheduler.cache import Cache
from scheduler.cluster import Snapshot
from scheduler.cluster.affinityterms import MAX_TERMS, and_terms, or_terms
from scheduler.cluster.pod import Pod
from scheduler.cluster.selectors import NodeSelectorRequirement, NodeSelectorTerm
from scheduler.cluster.volumeobjects import PodClaim, VolumeBinding, claim_binding, pod_claims
from scheduler.cluster.volumes import NO_PROVISIONER
from scheduler.commit import volumebind
from scheduler.commit.transaction import GangCommit, commit_gang
from scheduler.commit.volumebind import FORBIDDEN
from scheduler.fairness import compute_fair_shares
from scheduler.k8s.errors import Conflict, Forbidden, TemporaryError
from scheduler.k8s.resources import ResourceKind
from scheduler.k8s.writer import BindOutcome, Writer
from scheduler.simulate.scenario import ScenarioError, parse_scenario
from scheduler.solver import solve
from scheduler.solver.placement import GangOutcome, PodAssignment
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


@pytest.fixture(autouse=True)
def default_logging() -> Iterator[None]:
    """structlog's defaults here: some earlier tests leave a half-replaced configuration
    (stdlib processors with a print logger) that breaks any warning logged after them."""
    saved = structlog.get_config()
    structlog.reset_defaults()
    yield
    structlog.configure(**saved)


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
    request: str = "1Gi",
    modes: tuple[str, ...] = ("ReadWriteOnce",),
    volume_mode: str | None = None,
    selector: dict[str, Any] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "uid": f"uid-pvc-{name}",
        "resourceVersion": "7",
    }
    spec: dict[str, Any] = {
        "accessModes": list(modes),
        "resources": {"requests": {"storage": request}},
    }
    if volume:
        spec["volumeName"] = volume
        if complete:
            meta["annotations"] = dict(BIND_COMPLETED)
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    if volume_mode is not None:
        spec["volumeMode"] = volume_mode
    if selector is not None:
        spec["selector"] = selector
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
    storage_class: str | None = None,
    capacity: str = "1Gi",
    modes: tuple[str, ...] = ("ReadWriteOnce",),
    volume_mode: str | None = None,
    claim: str | None = None,
    phase: str = "Available",
    deleting: bool = False,
    rv: str = "1",
) -> dict[str, Any]:
    spec: dict[str, Any] = {"capacity": {"storage": capacity}, "accessModes": list(modes)}
    if hosts:
        terms = [{"matchExpressions": [{"key": HOST, "operator": "In", "values": list(hosts)}]}]
    if terms is not None:
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": terms}}
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    if volume_mode is not None:
        spec["volumeMode"] = volume_mode
    if claim is not None:
        spec["claimRef"] = {"namespace": "ns", "name": claim}
    meta: dict[str, Any] = {
        "name": name,
        "uid": f"uid-pv-{name}",
        "labels": labels or {},
        "resourceVersion": rv,
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def storage_class(name: str, mode: str, provisioner: str = "x") -> dict[str, Any]:
    return {"metadata": {"name": name}, "provisioner": provisioner, "volumeBindingMode": mode}


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


def test_an_immediate_class_follows_the_class_and_binding() -> None:
    """An Immediate claim waits for the PV controller; when the class is WaitForFirstConsumer
    the scheduler binds it; once bound the pod follows its volume."""
    cache = cluster(
        ("StorageClass", storage_class("local", "Immediate")),
        ("PersistentVolumeClaim", pvc("data", storage_class="local")),
        ("PersistentVolume", pv("pv-1", "n1", storage_class="local")),
        ("Pod", pvc_pod("p", "data")),
    )
    assert waits(cache) == (
        "VolumeNotBound",
        "pod ns/p: waiting for persistentvolumeclaim ns/data to be bound",
    )
    # The class changes to WaitForFirstConsumer (recreated): the scheduler binds it.
    cache.pending_changed.clear()
    cache.apply("StorageClass", "MODIFIED", storage_class("local", "WaitForFirstConsumer"))
    assert cache.pending_changed.is_set()
    assert placement_of(cache) == {"ns/p": "n1"}
    # Bound by the PV controller: placed on the volume's node.
    cache.apply("PersistentVolumeClaim", "MODIFIED", pvc("data", "pv-1", storage_class="local"))
    assert placement_of(cache) == {"ns/p": "n1"}


# --- WaitForFirstConsumer: candidates ---------------------------------------------------

LOCAL = ("StorageClass", storage_class("local", "WaitForFirstConsumer", NO_PROVISIONER))


def local_pv(name: str, *hosts: str, **kw: Any) -> tuple[str, dict[str, Any]]:
    kw.setdefault("storage_class", "local")
    return ("PersistentVolume", pv(name, *hosts, **kw))


def local_volume(name: str, *hosts: str, **kw: Any) -> dict[str, Any]:
    return local_pv(name, *hosts, **kw)[1]


def local_claim(name: str, **kw: Any) -> tuple[str, dict[str, Any]]:
    return ("PersistentVolumeClaim", pvc(name, storage_class="local", **kw))


def pod_of(cache: Cache, name: str = "p") -> Pod:
    return next(p for p in cache.snapshot().pods if p.name == name)


def test_an_unbound_claim_goes_where_a_candidate_volume_is() -> None:
    cache = cluster(
        LOCAL,
        local_pv("pv-2", "n2"),
        local_claim("data"),
        ("Pod", pvc_pod("p", "data")),
        ("Pod", k8s_pod("plain", gpus=1)),
    )
    p = pod_of(cache)
    assert p.blocked is None
    assert p.affinity == (term(req(HOST, "n2")),)
    assert p.volume_affinity
    placed = placement_of(cache)
    assert placed["ns/p"] == "n2"
    assert "ns/plain" in placed


def test_candidates_on_many_nodes_make_one_term() -> None:
    """Local volumes on n1 and n3 (and one taken on n2): hostname In n1, n3 - one term, however
    many volumes; ANDed with the pod's own affinity."""
    volumes = [local_pv(f"pv-{i}", f"n{i}") for i in (3, 1)]
    cache = cluster(
        LOCAL,
        *volumes,
        local_pv("pv-2", "n2", claim="other"),
        local_claim("data"),
        ("Pod", pvc_pod("p", "data", spec=node_terms({"matchExpressions": [
            {"key": HOST, "operator": "NotIn", "values": ["n9"]}]}))),
    )  # fmt: skip
    not_n9 = NodeSelectorRequirement(HOST, "NotIn", ("n9",))
    assert pod_of(cache).affinity == (term(not_n9, req(HOST, "n1", "n3")),)
    assert placement_of(cache)["ns/p"] in ("n1", "n3")
    # A volume that may be used anywhere makes the claim restrict nothing.
    cache.apply("PersistentVolume", "ADDED", pv("pv-any", storage_class="local"))
    assert pod_of(cache).affinity == (term(not_n9),)


def test_or_terms_merges_terms_differing_in_one_in_requirement() -> None:
    a, b = req(HOST, "n1"), req(HOST, "n2")
    zone = NodeSelectorRequirement("zone", "NotIn", ("x",))
    assert or_terms([(term(a),), (term(b),)]) == (term(req(HOST, "n1", "n2")),)
    assert or_terms([(term(a, zone),), (term(b, zone),), (term(zone),)]) == (
        term(req(HOST, "n1", "n2"), zone),
        term(zone),
    )
    assert or_terms([(term(a),), ()]) == ()  # one of them may be used anywhere
    assert or_terms([(term(),)]) == (term(),)  # matches no node


@pytest.mark.parametrize(
    ("volume", "claim", "fits"),
    [
        ({}, {}, True),
        ({"storage_class": "other"}, {}, False),
        ({"claim": "someone-else"}, {}, False),
        ({"phase": "Released"}, {}, False),
        ({"phase": "Pending"}, {}, False),
        ({"deleting": True}, {}, False),
        ({"capacity": "500Mi"}, {}, False),
        ({"capacity": "10Gi"}, {}, True),
        ({"modes": ("ReadWriteOnce", "ReadOnlyMany")}, {"modes": ("ReadOnlyMany",)}, True),
        ({"modes": ("ReadWriteOnce",)}, {"modes": ("ReadWriteMany",)}, False),
        ({}, {"modes": ("ReadWriteOnce", "ReadOnlyMany")}, False),
        ({"volume_mode": "Block"}, {}, False),
        ({"volume_mode": "Block"}, {"volume_mode": "Block"}, True),
        ({"volume_mode": "Filesystem"}, {}, True),
        ({"labels": {"tier": "fast"}}, {"selector": {"matchLabels": {"tier": "fast"}}}, True),
        ({"labels": {"tier": "slow"}}, {"selector": {"matchLabels": {"tier": "fast"}}}, False),
        (
            {"labels": {"tier": "slow"}},
            {"selector": {"matchExpressions": [
                {"key": "tier", "operator": "NotIn", "values": ["fast"]}]}},
            True,
        ),
        ({}, {"selector": {"matchExpressions": [{"key": "tier", "operator": "Exists"}]}}, False),
        ({}, {"selector": {"matchExpressions": [{"key": "tier", "operator": "Bad"}]}}, False),
        ({}, {"selector": {}}, True),
    ],
    ids=[
        "fits", "other-class", "claimed-by-another", "released", "not-available-yet",
        "deleting", "too-small", "bigger", "modes-superset", "mode-missing", "modes-subset",
        "block-vs-filesystem", "block", "filesystem-default", "selector", "selector-mismatch",
        "selector-notin", "selector-exists", "selector-bad-operator", "empty-selector",
    ],
)  # fmt: skip
def test_which_volumes_can_bind_a_claim(
    volume: dict[str, Any], claim: dict[str, Any], fits: bool
) -> None:
    cache = cluster(LOCAL, local_pv("pv-1", "n2", **volume), local_claim("data", **claim))
    cache.apply("Pod", "ADDED", pvc_pod("p", "data"))
    p = pod_of(cache)
    if fits:
        assert p.blocked is None
        assert placement_of(cache) == {"ns/p": "n2"}
    else:
        assert p.blocked == (
            "VolumeNotBound",
            "0 persistentvolumes available for persistentvolumeclaim ns/data (StorageClass "
            "local); no provisioning is done here",
        )


def test_a_volume_pre_bound_to_the_claim_is_its_only_candidate() -> None:
    """A volume whose claimRef names the claim wins over every other (as in kube-scheduler),
    whatever its class or phase."""
    cache = cluster(
        LOCAL,
        local_pv("pv-1", "n1"),
        ("PersistentVolume", pv("pv-mine", "n3", claim="data", phase="Pending")),
        local_claim("data"),
        ("Pod", pvc_pod("p", "data")),
    )
    assert pod_of(cache).affinity == (term(req(HOST, "n3")),)
    assert placement_of(cache) == {"ns/p": "n3"}
    (binding,) = reserve(cache, "p", "n3")
    assert (binding.volume, binding.prebound) == ("pv-mine", True)


def test_without_candidates_the_pod_waits_naming_claim_and_class() -> None:
    cache = cluster(LOCAL, local_claim("data"), ("Pod", pvc_pod("p", "data")))
    cache.apply("Pod", "ADDED", k8s_pod("plain", gpus=1))
    _, placement, requested = decide(cache)
    assert placed_pods(placement) == {"ns/plain"}
    outcome = placement.outcomes["ns/p"]
    assert (outcome.reason_code, outcome.reason) == (
        "VolumeNotBound",
        "pod ns/p: 0 persistentvolumes available for persistentvolumeclaim ns/data "
        "(StorageClass local); no provisioning is done here",
    )
    assert requested["gpu"] == 1000  # the waiting pod asks its queue for nothing
    # A volume appears: the loop wakes and the pod is placed there.
    cache.pending_changed.clear()
    cache.apply("PersistentVolume", "ADDED", local_volume("pv-1", "n3"))
    assert cache.pending_changed.is_set()
    assert placement_of(cache)["ns/p"] == "n3"
    # A volume of another class wakes nothing.
    cache.pending_changed.clear()
    cache.apply("PersistentVolume", "ADDED", pv("pv-x", "n1", storage_class="other"))
    assert not cache.pending_changed.is_set()


def test_a_dynamic_provisioner_is_named_as_not_supported_yet() -> None:
    cache = cluster(
        ("StorageClass", storage_class("fast", "WaitForFirstConsumer", "ebs.csi.aws.com")),
        ("PersistentVolumeClaim", pvc("data", storage_class="fast")),
        ("Pod", pvc_pod("p", "data")),
    )
    assert waits(cache) == (
        "VolumeNotBound",
        "pod ns/p: 0 persistentvolumes available for persistentvolumeclaim ns/data "
        "(StorageClass fast); dynamic provisioning (provisioner ebs.csi.aws.com) is not "
        "supported yet: create a matching persistentvolume, or use a StorageClass with "
        "volumeBindingMode: Immediate",
    )
    # A matching pre-created volume of that class is used.
    cache.apply("PersistentVolume", "ADDED", pv("pv-1", "n2", storage_class="fast"))
    assert placement_of(cache) == {"ns/p": "n2"}


def test_candidates_beyond_max_terms_wait_named() -> None:
    """Terms that cannot be merged (each volume on its own zone and rack) beyond MAX_TERMS."""
    volumes = [
        local_pv(f"pv-{i}", terms=[{"matchExpressions": [
            {"key": "zone", "operator": "In", "values": [f"z{i}"]},
            {"key": "rack", "operator": "In", "values": [f"r{i}"]}]}])
        for i in range(MAX_TERMS + 1)
    ]  # fmt: skip
    cache = cluster(LOCAL, *volumes, local_claim("data"), ("Pod", pvc_pod("p", "data")))
    code, reason = waits(cache)
    assert code == "UnsupportedField"
    assert reason == (
        f"pod ns/p: the {MAX_TERMS + 1} persistentvolumes available for persistentvolumeclaim "
        f"ns/data (StorageClass local) have together more than {MAX_TERMS} node selector "
        "terms, which is not supported yet; the pod waits"
    )
    # Fewer volumes: the pod is placed on a node of one of them.
    for i in range(2, MAX_TERMS + 1):
        cache.apply("PersistentVolume", "DELETED", volumes[i][1])
    assert pod_of(cache).blocked is None


def test_candidates_anded_with_the_pods_affinity_beyond_max_terms_wait_named() -> None:
    terms = [
        {"matchExpressions": [{"key": "k", "operator": "In", "values": [str(i)]}]} for i in range(9)
    ]
    rack = [{"matchExpressions": [{"key": "rack", "operator": "Exists"}]}]
    volumes = [
        local_pv(f"pv-{i}", terms=[{"matchExpressions": [
            {"key": "zone", "operator": "NotIn", "values": [f"z{i}"]}]}])
        for i in range(8)
    ]  # fmt: skip
    cache = cluster(
        LOCAL,
        *volumes,
        local_pv("pv-rack", terms=rack),
        local_claim("data"),
        ("Pod", pvc_pod("p", "data", spec=node_terms(*terms))),
    )
    code, reason = waits(cache)
    assert code == "UnsupportedField"
    assert f"more than {MAX_TERMS} node selector terms" in reason


def test_two_claims_need_two_distinct_volumes() -> None:
    cache = cluster(
        LOCAL,
        local_pv("pv-1", "n1"),
        local_claim("a"),
        local_claim("b"),
        ("Pod", pvc_pod("p", "a", "b")),
    )
    assert waits(cache) == (
        "VolumeNotBound",
        "pod ns/p: persistentvolumeclaims ns/a, ns/b need 2 distinct persistentvolumes, only 1 "
        "of them can be bound at once; no provisioning is done here",
    )
    cache.apply("PersistentVolume", "ADDED", local_volume("pv-2", "n1"))
    assert placement_of(cache) == {"ns/p": "n1"}
    assert {b.volume for b in reserve(cache, "p", "n1")} == {"pv-1", "pv-2"}


def test_a_volume_with_unreadable_affinity_is_named_when_nothing_else_fits() -> None:
    bad = [{"matchFields": [{"key": "spec.x", "operator": "In", "values": ["x"]}]}]
    cache = cluster(LOCAL, local_pv("pv-bad", terms=bad), local_claim("data"))
    cache.apply("Pod", "ADDED", pvc_pod("p", "data"))
    assert waits(cache) == (
        "UnsupportedField",
        "pod ns/p: persistentvolume pv-bad: spec.nodeAffinity.required.nodeSelectorTerms[0]"
        ".matchFields[0] is not supported yet (only metadata.name is); the pod waits",
    )
    cache.apply("PersistentVolume", "ADDED", local_volume("pv-good", "n2"))
    assert placement_of(cache) == {"ns/p": "n2"}


def test_without_permission_to_read_volumes_unbound_claims_wait_named() -> None:
    cache = cluster(LOCAL, local_pv("pv-1", "n2"), local_claim("data"))
    cache.apply("Pod", "ADDED", pvc_pod("p", "data"))
    cache.set_absent("PersistentVolume", True)
    code, reason = waits(cache)
    assert code == "VolumeNotBound"
    assert "(StorageClass local) cannot be bound: the scheduler may not read persistentvolumes" in (
        reason
    )


# --- WaitForFirstConsumer: choosing and reserving volumes at commit ----------------------


def reserve(cache: Cache, pod: str, node: str) -> tuple[VolumeBinding, ...]:
    chosen = cache.volumes.reserve(f"uid-{pod}", node)
    assert not isinstance(chosen, str), chosen
    return chosen


def test_the_smallest_fitting_volume_on_the_node_is_chosen_and_reserved() -> None:
    cache = cluster(
        LOCAL,
        local_pv("pv-big", "n1", capacity="10Gi", rv="11"),
        local_pv("pv-small", "n1", capacity="2Gi", rv="12"),
        local_pv("pv-tiny", "n1", capacity="100Mi"),  # too small for 1Gi
        local_pv("pv-n2", "n2", capacity="1Gi"),
        local_claim("a"),
        local_claim("b"),
        local_claim("c"),
        ("Pod", pvc_pod("pa", "a")),
        ("Pod", pvc_pod("pb", "b")),
        ("Pod", pvc_pod("pc", "c")),
    )
    (first,) = reserve(cache, "pa", "n1")
    assert first == VolumeBinding("ns", "a", "uid-pvc-a", "pv-small", "12", "7")
    assert first.patch() == {
        "metadata": {
            "resourceVersion": "12",
            "annotations": {"pv.kubernetes.io/bound-by-controller": "yes"},
        },
        "spec": {
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": "ns",
                "name": "a",
                "uid": "uid-pvc-a",
                "resourceVersion": "7",
            }
        },
    }
    assert cache.volumes.reservations() == {"pv-small": "ns/a"}
    # Another pod's claim does not get it, in this cycle or the next.
    (second,) = reserve(cache, "pb", "n1")
    assert second.volume == "pv-big"
    assert pod_of(cache, "pc").affinity == (term(req(HOST, "n2")),)
    # None left on n1: the pod fails there and avoids n1 until the volumes change.
    cache.pending_changed.clear()
    assert cache.volumes.reserve("uid-pc", "n1") == (
        "no persistentvolume is left for persistentvolumeclaim ns/c (StorageClass local) on node n1"
    )
    assert cache.pending_changed.is_set()
    assert pod_of(cache, "pc").affinity == (
        term(req(HOST, "n2"), NodeSelectorRequirement("metadata.name", "NotIn", ("n1",))),
    )
    # pa's commit fails: pv-small is free again, and pc may try n1 again.
    cache.volumes.release("uid-pa")
    assert cache.volumes.reservations() == {"pv-big": "ns/b"}
    assert pod_of(cache, "pc").affinity == (term(req(HOST, "n1", "n2")),)
    (third,) = reserve(cache, "pc", "n1")
    assert third.volume == "pv-small"


def test_a_reservation_ends_when_the_watch_shows_the_volume_bound() -> None:
    cache = cluster(
        LOCAL,
        local_pv("pv-1", "n1"),
        local_pv("pv-2", "n2"),
        local_claim("a"),
        local_claim("b"),
        ("Pod", pvc_pod("pa", "a")),
        ("Pod", pvc_pod("pb", "b")),
    )
    reserve(cache, "pa", "n1")
    assert pod_of(cache, "pb").affinity == (term(req(HOST, "n2")),)
    cache.volumes.done("uid-pa")  # bound: stays reserved until the watch shows it
    assert cache.volumes.reservations() == {"pv-1": "ns/a"}
    cache.apply("PersistentVolume", "ADDED", local_volume("pv-1", "n1", claim="a", rv="20"))
    assert cache.volumes.reservations() == {}
    assert pod_of(cache, "pb").affinity == (term(req(HOST, "n2")),)
    # A released pod's volume stays with the claim the watch shows it bound to.
    cache.volumes.release("uid-pa")
    assert pod_of(cache, "pb").affinity == (term(req(HOST, "n2")),)


def test_pods_sharing_a_claim_share_its_volume() -> None:
    cache = cluster(
        LOCAL,
        local_pv("pv-1", "n1", modes=("ReadWriteMany",)),
        local_pv("pv-2", "n2", modes=("ReadWriteMany",)),
        local_claim("shared", modes=("ReadWriteMany",)),
        ("Pod", pvc_pod("pa", "shared")),
        ("Pod", pvc_pod("pb", "shared")),
    )
    (a,) = reserve(cache, "pa", "n2")
    assert pod_of(cache, "pb").affinity == (term(req(HOST, "n2")),)
    (b,) = reserve(cache, "pb", "n2")
    assert a == b
    assert cache.volumes.reserve("uid-pb", "n1") == (
        "no persistentvolume is left for persistentvolumeclaim ns/shared (StorageClass local) "
        "on node n1"
    )
    # Released by one pod, still reserved for the other.
    cache.volumes.release("uid-pb")
    assert cache.volumes.reservations() == {"pv-2": "ns/shared"}
    cache.volumes.release("uid-pa")
    assert cache.volumes.reservations() == {}


def test_choice_is_deterministic_and_claims_are_taken_smallest_first() -> None:
    objs = [
        LOCAL,
        local_pv("pv-5", "n1", capacity="5Gi"),
        local_pv("pv-2a", "n1", capacity="2Gi"),
        local_pv("pv-2b", "n1", capacity="2Gi"),
        local_claim("big", request="4Gi"),
        local_claim("small", request="2Gi"),
        ("Pod", pvc_pod("p", "big", "small")),
    ]
    for order in (objs, list(reversed(objs))):
        cache = cluster(*order)
        chosen = reserve(cache, "p", "n1")
        assert [(b.claim, b.volume) for b in chosen] == [("big", "pv-5"), ("small", "pv-2a")]


def test_a_pod_without_such_claims_reserves_nothing() -> None:
    cache = cluster(
        ("PersistentVolume", pv("pv-1", "n2")),
        ("PersistentVolumeClaim", pvc("data", "pv-1")),
        ("Pod", pvc_pod("p", "data")),
        ("Pod", k8s_pod("plain")),
    )
    assert cache.volumes.reserve("uid-p", "n2") == ()
    assert cache.volumes.reserve("uid-plain", "n2") == ()
    assert cache.volumes.reserve("uid-unknown", "n2") == ()


def test_without_permission_to_write_volumes_such_pods_wait_named_and_others_run() -> None:
    cache = cluster(
        LOCAL,
        local_pv("pv-1", "n2"),
        local_claim("data"),
        ("Pod", pvc_pod("p", "data")),
        ("Pod", pvc_pod("bound", "done")),
        ("PersistentVolumeClaim", pvc("done", "pv-9")),
        ("PersistentVolume", pv("pv-9", "n3", claim="done")),
        ("Pod", k8s_pod("plain", gpus=1)),
    )
    token = cache.volumes.forbid_writes(FORBIDDEN)
    _, placement, _ = decide(cache)
    assert placed_pods(placement) == {"ns/plain", "ns/bound"}
    outcome = placement.outcomes["ns/p"]
    assert (outcome.reason_code, outcome.reason) == (
        "VolumeNotBound",
        "pod ns/p: persistentvolumeclaim ns/data (StorageClass local) cannot be bound: the "
        "scheduler may not patch persistentvolumes (grant patch on persistentvolumes to the "
        "scheduler; see manifests/20-rbac.yaml)",
    )
    cache.volumes.allow_writes(token - 1)  # forbidden again since: stays
    assert waits(cache)[0] == "VolumeNotBound"
    cache.pending_changed.clear()
    cache.volumes.allow_writes(token)
    assert cache.pending_changed.is_set()
    assert placement_of(cache)["ns/p"] == "n2"


def test_a_relist_of_many_volumes_judges_each_pod_once_per_snapshot() -> None:
    cache = cluster(LOCAL, local_claim("data"), ("Pod", pvc_pod("p", "data")))
    cache.relisted(
        "PersistentVolume",
        [pv(f"pv-{i}", f"n{i % 3 + 1}", storage_class="local") for i in range(300)],
    )
    assert pod_of(cache).affinity == (term(req(HOST, "n1", "n2", "n3")),)
    cache.relisted("PersistentVolume", [])
    assert pod_of(cache).blocked is not None


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


# --- WaitForFirstConsumer: binding at commit (the writer stubbed; the real API server is
# in tests/integration/test_volume_binding.py and tests/e2e/test_volumes.py) ------------


class StubWriter:
    """The writes of a gang's commit, recorded; answers scripted. With ``controller`` a
    successful volume write is followed by what the PV controller does (claim bound)."""

    def __init__(self, cache: Cache, *, controller: bool = True) -> None:
        self.cache = cache
        self.controller = controller
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.binds: list[tuple[str, str]] = []
        #: Volume -> errors its next writes raise.
        self.errors: dict[str, list[Exception]] = {}
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}

    async def patch_persistent_volume(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.patches.append((name, patch))
        error = self.errors[name].pop(0) if self.errors.get(name) else None
        if error is not None and not isinstance(error, TemporaryError):
            raise error  # a timeout stands for an answer lost: the write happened
        if self.controller:
            ref = patch["spec"]["claimRef"]
            pvc_obj = self.cache.raw("PersistentVolumeClaim", ref["namespace"], ref["name"])
            assert pvc_obj is not None
            bound = copy.deepcopy(pvc_obj)
            bound["spec"]["volumeName"] = name
            bound["metadata"]["annotations"] = dict(BIND_COMPLETED)
            asyncio.get_running_loop().call_later(
                0.05, self.cache.apply, "PersistentVolumeClaim", "MODIFIED", bound
            )
        if error is not None:
            raise error
        return {}

    def may_write(self) -> bool:
        return True

    async def get_object(
        self, kind: ResourceKind, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        if kind.kind == "PersistentVolumeClaim":
            return self.cache.raw(kind.kind, namespace or "", name)
        return self.objects.get((kind.kind, name))

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, grant: Any = None
    ) -> BindOutcome:
        self.binds.append((f"{namespace}/{name}", node))
        return BindOutcome(True)


def gang_of(*pods: tuple[str, str]) -> GangOutcome:
    assignments = tuple(PodAssignment(f"uid-{p}", f"ns/{p}", "ns/g", node) for p, node in pods)
    return GangOutcome("ns/g", "q", True, assignments)


async def commit(
    cache: Cache, writer: StubWriter, outcome: GangOutcome, **kw: Any
) -> tuple[GangCommit, dict[str, str]]:
    pods = {p.key: p for p in cache.snapshot().pods}
    result = await commit_gang(outcome, pods, cast(Writer, writer), cache, lambda: True, **kw)
    return result, cache.assumed()


def wffc_cluster(*extra: tuple[str, dict[str, Any]]) -> Cache:
    return cluster(
        LOCAL,
        local_pv("pv-1", "n1", rv="31"),
        local_pv("pv-2", "n2", rv="32"),
        local_claim("a"),
        local_claim("b"),
        ("Pod", pvc_pod("pa", "a", group="g")),
        ("Pod", pvc_pod("pb", "b", group="g")),
        ("PodGroup", k8s_podgroup("g", 2)),
        *extra,
    )


async def test_a_gangs_volumes_are_bound_before_its_pods() -> None:
    cache = wffc_cluster()
    writer = StubWriter(cache)
    result, assumed = await commit(cache, writer, gang_of(("pa", "n1"), ("pb", "n2")))
    assert result.complete
    assert [(name, patch["metadata"]["resourceVersion"]) for name, patch in writer.patches] == [
        ("pv-1", "31"),
        ("pv-2", "32"),
    ]
    assert writer.patches[0][1]["spec"]["claimRef"]["name"] == "a"
    assert writer.binds == [("ns/pa", "n1"), ("ns/pb", "n2")]
    assert assumed == {"uid-pa": "n1", "uid-pb": "n2"}
    # Reserved until the watch shows the volumes' claimRefs.
    assert cache.volumes.reservations() == {"pv-1": "ns/a", "pv-2": "ns/b"}
    assert cache.volumes.reserved("uid-pa") == ()


async def test_a_volume_taken_meanwhile_leaves_the_whole_gang_unbound() -> None:
    cache = wffc_cluster()
    writer = StubWriter(cache)
    conflict = Conflict("HTTP 409 Conflict: the object has been modified", status=409)
    writer.errors["pv-1"] = [conflict]
    taken = pv("pv-1", "n1", storage_class="local", claim="someone-else", rv="40")
    writer.objects[("PersistentVolume", "pv-1")] = taken
    cache.pending_changed.clear()
    result, assumed = await commit(cache, writer, gang_of(("pa", "n1"), ("pb", "n2")))
    assert not result.bound and result.skipped
    problem = (
        "persistentvolume pv-1 was taken by persistentvolumeclaim ns/someone-else before "
        "persistentvolumeclaim ns/a could get it (HTTP 409 Conflict: the object has been "
        "modified)"
    )
    assert result.failed == [(a, problem) for a in gang_of(("pa", "n1"), ("pb", "n2")).pods]
    assert writer.binds == []  # all or nothing: pb's volume was bound, pb is not
    assert assumed == {}
    assert cache.volumes.reservations() == {}
    assert cache.pending_changed.is_set()  # placed again by the next cycle
    # The watch shows pv-1 taken: only pv-2 is left for pa's claim.
    cache.apply("PersistentVolume", "MODIFIED", taken)
    assert pod_of(cache, "pa").affinity == (term(req(HOST, "n2")),)


async def test_a_conflict_with_our_own_earlier_write_is_a_success() -> None:
    cache = wffc_cluster()
    writer = StubWriter(cache)
    writer.errors["pv-1"] = [TemporaryError("timed out"), Conflict("HTTP 409 Conflict", status=409)]
    mine = pv("pv-1", "n1", storage_class="local", rv="41")
    mine["spec"]["claimRef"] = {"namespace": "ns", "name": "a", "uid": "uid-pvc-a"}
    writer.objects[("PersistentVolume", "pv-1")] = mine
    result, _ = await commit(cache, writer, gang_of(("pa", "n1"), ("pb", "n2")))
    assert result.complete
    assert [name for name, _ in writer.patches] == ["pv-1", "pv-2", "pv-1"]


async def test_forbidden_volume_writes_make_such_pods_wait_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(volumebind, "FORBIDDEN_RETRY", 0.05)
    cache = wffc_cluster(("Pod", k8s_pod("plain", gpus=1)))
    writer = StubWriter(cache)
    writer.errors["pv-1"] = [Forbidden("HTTP 403 Forbidden", status=403)]
    result, assumed = await commit(cache, writer, gang_of(("pa", "n1"), ("pb", "n2")))
    assert result.failed and not result.bound and assumed == {}
    assert result.failed[0][1] == (
        f"persistentvolume pv-1 could not be bound to persistentvolumeclaim ns/a: {FORBIDDEN}"
    )
    _, placement, _ = decide(cache)
    assert placed_pods(placement) == {"ns/plain"}
    assert placement.outcomes["ns/g"].reason_code == "VolumeNotBound"
    assert "may not patch persistentvolumes" in placement.outcomes["ns/g"].reason
    await asyncio.sleep(0.1)  # tried again after FORBIDDEN_RETRY
    assert placement_of(cache)["ns/pa"] == "n1"


async def test_a_binding_the_pv_controller_does_not_complete_times_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(volumebind, "DEFAULT_BIND_TIMEOUT", 0.3)
    monkeypatch.setattr(volumebind, "READ_BACK", 0.1)  # read back from the API too
    cache = wffc_cluster()
    writer = StubWriter(cache, controller=False)
    result, assumed = await commit(cache, writer, gang_of(("pa", "n1"), ("pb", "n2")))
    assert result.skipped and not result.bound and writer.binds == [] and assumed == {}
    assert result.failed[0][1] == (
        "the PV controller did not complete binding persistentvolumeclaim ns/a to "
        "persistentvolume pv-1, persistentvolumeclaim ns/b to persistentvolume pv-2 within 0.3s"
    )
    # Placed again, with the PV controller working: bound.
    writer.controller = True
    result, _ = await commit(cache, writer, gang_of(("pa", "n1"), ("pb", "n2")))
    assert result.complete


def test_when_a_claims_binding_is_complete() -> None:
    key = "ns/a"
    assert claim_binding(None, key, "pv-1") == (False, "persistentvolumeclaim ns/a was deleted")
    assert claim_binding(pvc("a", storage_class="local"), key, "pv-1") == (False, "")
    assert claim_binding(pvc("a", "pv-1", complete=False), key, "pv-1") == (False, "")
    assert claim_binding(pvc("a", "pv-1"), key, "pv-1") == (True, "")
    assert claim_binding(pvc("a", "pv-9"), key, "pv-1") == (
        False,
        "persistentvolumeclaim ns/a was bound to persistentvolume pv-9 instead",
    )
    assert claim_binding(pvc("a", deleting=True), key, "pv-1") == (
        False,
        "persistentvolumeclaim ns/a is being deleted",
    )


async def test_no_volume_left_on_a_node_assumes_nothing_of_the_gang() -> None:
    cache = wffc_cluster()
    writer = StubWriter(cache)
    outcome = gang_of(("pa", "n1"), ("pb", "n1"))
    result, assumed = await commit(cache, writer, outcome)
    why = (
        "no persistentvolume is left for persistentvolumeclaim ns/b (StorageClass local) on node n1"
    )
    assert result.skipped and result.failed == [
        (outcome.pods[0], f"pod ns/pb: {why}"),
        (outcome.pods[1], why),
    ]
    assert writer.patches == [] and writer.binds == [] and assumed == {}
    assert cache.volumes.reservations() == {}
    # pb avoids n1 now, and chooses first next time: the gang ends on n1 and n2 whatever the
    # solver's order.
    assert placement_of(cache)["ns/pb"] == "n2"
    for nodes in (("n2", "n2"), ("n1", "n2")):
        outcome = gang_of(("pa", nodes[0]), ("pb", nodes[1]))
        result, assumed = await commit(cache, writer, outcome)
        if result.complete:
            break
        assert result.failed[0][1] == (
            "no persistentvolume is left for persistentvolumeclaim ns/a (StorageClass local) "
            "on node n2"
        )
    assert result.complete and assumed == {"uid-pa": "n1", "uid-pb": "n2"}
    assert writer.binds == [("ns/pa", "n1"), ("ns/pb", "n2")]


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
