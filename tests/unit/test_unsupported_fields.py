"""Placement rules not evaluated yet make a pod wait, named; scheduling gates; pods whose
author set ``spec.nodeName``.

From the API object (parse -> finding) through the cache, fair share and solve (a gang with such
a pod is left out and carries the reason; everything else is placed) to what the status writer
does with it, and the simulator.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from scheduler.cache import Cache
from scheduler.cluster import GPU, Snapshot
from scheduler.cluster.hostports import HOST_PORT_PREFIX
from scheduler.cluster.podspec import PodSpecError, pod_from_k8s
from scheduler.cluster.unsupported import (
    POD_AFFINITY_REQUIRED,
    POD_ANTI_AFFINITY_REQUIRED,
    scheduling_gates,
    unsupported_fields,
    unsupported_message,
)
from scheduler.commit.status import StatusPublisher
from scheduler.cycle import with_findings
from scheduler.fairness import compute_fair_shares
from scheduler.simulate.engine import simulate
from scheduler.simulate.report import gang_summaries
from scheduler.simulate.scenario import ScenarioError, parse_scenario
from scheduler.solver import solve
from scheduler.solver.placement import Placement, PlacementSettings

SCHED = "kai-scheduler"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
TERM = {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}
#: Namespace labels are not watched: a namespaceSelector that selects by them is not read.
NS_TERM = {**TERM, "namespaceSelector": {"matchLabels": {"team": "a"}}}
NS_ANTI = f"{POD_ANTI_AFFINITY_REQUIRED}[0].namespaceSelector"
POD_RULE_FIX = (
    "list the namespaces in `namespaces` (or use namespaceSelector: {} for all), and give "
    "every term a topologyKey and a labelSelector with In/NotIn/Exists/DoesNotExist"
)
SPREAD_FIX = (
    "give the constraint a topologyKey, maxSkew >= 1, minDomains >= 1 and a labelSelector "
    "with In/NotIn/Exists/DoesNotExist"
)
SPREAD = {"maxSkew": 1, "topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "web"}}}
NODE_TERMS = f"spec.affinity.nodeAffinity.{REQUIRED}.nodeSelectorTerms"
SETTINGS = PlacementSettings(time_limit_seconds=0.3, workers=1)


def k8s_pod(
    name: str = "p",
    *,
    gpus: int = 0,
    spec: dict[str, Any] | None = None,
    group: str | None = None,
    node_name: str | None = None,
    scheduler: str = SCHED,
    phase: str = "Pending",
) -> dict[str, Any]:
    requests: dict[str, str] = {"cpu": "1"}
    if gpus:
        requests[GPU] = str(gpus)
    body: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [{"name": "c", "resources": {"requests": requests}}],
        **(spec or {}),
    }
    if node_name:
        body["nodeName"] = node_name
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "annotations": {"pod-group-name": group} if group else {},
            "labels": {"kai.scheduler/queue": "q"},
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": body,
        "status": {"phase": phase},
    }


def k8s_node(name: str, gpus: int = 8) -> dict[str, Any]:
    labels = {"zone": "a", "kubernetes.io/hostname": name}
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": labels},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", GPU: str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def k8s_podgroup(name: str, min_member: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-pg-{name}"},
        "spec": {"minMember": min_member, "queue": "q"},
    }


def fields_of(spec: dict[str, Any], **kw: Any) -> tuple[str, ...]:
    pod = pod_from_k8s(k8s_pod(spec=spec, **kw), scheduler_name=SCHED, default_queue="q")
    return pod.unsupported


# --- parse -> finding -------------------------------------------------------------------


def node_terms(*terms: Any) -> dict[str, Any]:
    """A pod spec fragment with required node affinity of ``terms``."""
    return {"affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": list(terms)}}}}


HOST_PORT = {"name": "c", "ports": [{"containerPort": 80}, {"containerPort": 8080, "hostPort": 80}]}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"affinity": {"podAffinity": {REQUIRED: [NS_TERM]}}},
            f"{POD_AFFINITY_REQUIRED}[0].namespaceSelector",
        ),
        (
            {"affinity": {"podAntiAffinity": {REQUIRED: [TERM, NS_TERM]}}},
            f"{POD_ANTI_AFFINITY_REQUIRED}[1].namespaceSelector",
        ),
        (
            {
                "affinity": {
                    "podAntiAffinity": {
                        REQUIRED: [
                            {
                                **TERM,
                                "namespaceSelector": {
                                    "matchExpressions": [{"key": "team", "operator": "Exists"}]
                                },
                            }
                        ]
                    }
                }
            },
            NS_ANTI,
        ),
        (
            {"affinity": {"podAntiAffinity": {REQUIRED: [{"labelSelector": {}}]}}},
            f"{POD_ANTI_AFFINITY_REQUIRED}[0].topologyKey",
        ),
        (
            {
                "affinity": {
                    "podAffinity": {
                        REQUIRED: [
                            {
                                "topologyKey": "zone",
                                "labelSelector": {
                                    "matchExpressions": [
                                        {"key": "rank", "operator": "Gt", "values": ["2"]}
                                    ]
                                },
                            }
                        ]
                    }
                }
            },
            f"{POD_AFFINITY_REQUIRED}[0].labelSelector",
        ),
        (
            {
                "topologySpreadConstraints": [
                    {"maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {}}
                ]
            },
            "spec.topologySpreadConstraints[0] (maxSkew and topologyKey are required)",
        ),
        # Unset is Kubernetes' default, DoNotSchedule: read, and this one has no maxSkew.
        (
            {"topologySpreadConstraints": [{"topologyKey": "zone"}]},
            "spec.topologySpreadConstraints[0] (maxSkew and topologyKey are required)",
        ),
        (
            {"topologySpreadConstraints": [SPREAD, {**SPREAD, "maxSkew": 0}]},
            "spec.topologySpreadConstraints[1] (maxSkew and topologyKey are required)",
        ),
        (
            {"topologySpreadConstraints": [{**SPREAD, "minDomains": 0}]},
            "spec.topologySpreadConstraints[0].minDomains",
        ),
        (
            node_terms({"matchFields": [{"key": "spec.unschedulable", "values": ["false"]}]}),
            f"{NODE_TERMS}[0].matchFields[0]",
        ),
    ],
    ids=[
        "podAffinity-namespaceSelector-labels",
        "podAntiAffinity-namespaceSelector-labels",
        "podAntiAffinity-namespaceSelector-expressions",
        "podAntiAffinity-no-topologyKey",
        "podAffinity-bad-operator",
        "spread-DoNotSchedule-no-topologyKey",
        "spread-default-no-maxSkew",
        "spread-maxSkew-0",
        "spread-minDomains-0",
        "matchFields-key",
    ],
)
def test_each_unsupported_field_is_found_and_named(spec: dict[str, Any], expected: str) -> None:
    assert fields_of(spec) == (expected,)
    message = unsupported_message("ns/p", (expected,))
    assert message.startswith(f"pod ns/p: {expected}")
    assert "is not supported yet; the pod waits (" in message


#: Read and honoured (scheduler.cluster.podaffinity): never listed as unsupported.
READABLE: dict[str, dict[str, Any]] = {
    "podAffinity": {"affinity": {"podAffinity": {REQUIRED: [TERM]}}},
    "podAntiAffinity": {"affinity": {"podAntiAffinity": {REQUIRED: [TERM]}}},
    "podAntiAffinity-namespaces": {
        "affinity": {"podAntiAffinity": {REQUIRED: [{**TERM, "namespaces": ["a", "b"]}]}}
    },
    "podAntiAffinity-all-namespaces": {
        "affinity": {"podAntiAffinity": {REQUIRED: [{**TERM, "namespaceSelector": {}}]}}
    },
    "podAffinity-matchLabelKeys": {
        "affinity": {
            "podAffinity": {
                REQUIRED: [{**TERM, "matchLabelKeys": ["app"], "mismatchLabelKeys": ["tier"]}]
            }
        }
    },
    "podAffinity-expressions": {
        "affinity": {
            "podAffinity": {
                REQUIRED: [
                    {
                        "topologyKey": "zone",
                        "labelSelector": {
                            "matchExpressions": [
                                {"key": "app", "operator": "In", "values": ["web"]},
                                {"key": "tier", "operator": "NotIn", "values": ["db"]},
                                {"key": "gpu", "operator": "Exists"},
                                {"key": "cpu", "operator": "DoesNotExist"},
                            ]
                        },
                    }
                ]
            }
        }
    },
    "podAffinity-no-labelSelector": {
        "affinity": {"podAffinity": {REQUIRED: [{"topologyKey": "z"}]}}
    },
    "spread-DoNotSchedule": {
        "topologySpreadConstraints": [{**SPREAD, "whenUnsatisfiable": "DoNotSchedule"}]
    },
    "spread-default": {"topologySpreadConstraints": [SPREAD]},
    "spread-all-fields": {
        "topologySpreadConstraints": [
            {
                **SPREAD,
                "maxSkew": 2,
                "minDomains": 3,
                "nodeAffinityPolicy": "Ignore",
                "nodeTaintsPolicy": "Honor",
                "matchLabelKeys": ["pod-template-hash"],
            }
        ]
    },
}


@pytest.mark.parametrize(
    "spec",
    [
        {"affinity": {"podAffinity": {PREFERRED: [{"weight": 1, "podAffinityTerm": TERM}]}}},
        {"affinity": {"podAntiAffinity": {PREFERRED: [{"weight": 1, "podAffinityTerm": TERM}]}}},
        {"affinity": {"podAntiAffinity": {REQUIRED: []}}},  # empty: no rule
        {"affinity": {"nodeAffinity": {PREFERRED: [{"weight": 1, "preference": {}}]}}},
        {"topologySpreadConstraints": [{"maxSkew": 1, "whenUnsatisfiable": "ScheduleAnyway"}]},
        {"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 0}]}]},
        {"containers": [HOST_PORT]},  # honoured (scheduler.cluster.hostports)
        node_terms(
            {
                "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}],
                "matchExpressions": [{"key": "rank", "operator": "Gt", "values": ["2"]}],
            }
        ),
        {"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]},
        *READABLE.values(),
    ],
    ids=[
        "preferred-podAffinity",
        "preferred-podAntiAffinity",
        "empty-required",
        "preferred-nodeAffinity",
        "spread-ScheduleAnyway",
        "hostPort-0",
        "hostPort",
        "matchFields-name-and-Gt",
        "pvc",
        *READABLE,
    ],
)
def test_preferences_and_supported_forms_do_not_make_a_pod_wait(spec: dict[str, Any]) -> None:
    assert fields_of(spec) == ()
    assert unsupported_fields(spec, "ns", {"app": "web"}) == ()


@pytest.mark.parametrize("name", list(READABLE))
def test_readable_pod_rules_are_carried_by_the_pod(name: str) -> None:
    """Not listed, and not dropped either: the pod carries the rule for the solver."""
    spec = READABLE[name]
    pod = pod_from_k8s(k8s_pod(spec=spec), scheduler_name=SCHED, default_queue="q")
    assert pod.unsupported == ()
    assert pod.topology_rules
    kinds = {
        "podAffinity": len(pod.pod_affinity),
        "podAntiAffinity": len(pod.pod_anti_affinity),
        "spread": len(pod.spread),
    }
    expected = {k: int(name.startswith(k)) for k in kinds}
    assert kinds == expected


def test_match_fields_on_another_key_is_not_read_as_the_node_name() -> None:
    other = {"key": "spec.unschedulable", "operator": "In", "values": ["n1"]}
    name = {"key": "metadata.name", "operator": "In", "values": ["n1"]}
    obj = k8s_pod(spec=node_terms({"matchFields": [other, name]}))
    pod = pod_from_k8s(obj, scheduler_name=SCHED, default_queue="q")
    (term,) = pod.affinity
    assert [(r.key, r.values) for r in term.requirements] == [("metadata.name", ("n1",))]
    bad = k8s_pod(spec=node_terms({"matchFields": [{**name, "operator": "Near"}]}))
    with pytest.raises(PodSpecError) as err:
        pod_from_k8s(bad, scheduler_name=SCHED, default_queue="q")
    assert err.value.field.endswith("nodeSelectorTerms[0].matchFields[0].operator")


def test_bound_and_foreign_pods_carry_no_findings() -> None:
    spec = {
        "affinity": {"podAntiAffinity": {REQUIRED: [NS_TERM]}},
        "schedulingGates": [{"name": "g"}],
    }
    assert fields_of(spec, node_name="n1") == ()
    assert fields_of(spec, scheduler="default-scheduler") == ()
    assert fields_of(spec) == (NS_ANTI,)


def test_bound_pods_keep_their_anti_affinity_only() -> None:
    """A running pod's anti-affinity keeps matching pods out of its domain (the rule is
    symmetric), so it is read for bound and foreign pods too; its affinity and spread only
    mattered when it was placed."""
    spec = {**READABLE["podAffinity"], **READABLE["spread-default"]}
    spec["affinity"] = {**spec["affinity"], **READABLE["podAntiAffinity"]["affinity"]}
    others: list[dict[str, Any]] = [
        {"node_name": "n1", "phase": "Running"},
        {"scheduler": "default-scheduler"},
    ]
    for kw in others:
        obj = k8s_pod(spec=spec, **kw)
        pod = pod_from_k8s(obj, scheduler_name=SCHED, default_queue="q")
        assert (len(pod.pod_anti_affinity), pod.pod_affinity, pod.spread) == (1, (), ()), kw
    pending = pod_from_k8s(k8s_pod(spec=spec), scheduler_name=SCHED, default_queue="q")
    assert (len(pending.pod_anti_affinity), len(pending.pod_affinity), len(pending.spread)) == (
        1,
        1,
        1,
    )


def test_several_fields_are_listed_with_each_fix_once() -> None:
    no_key = {"labelSelector": {"matchLabels": {"app": "web"}}}
    spec = {
        "affinity": {
            "podAntiAffinity": {REQUIRED: [TERM, NS_TERM], "x": 1},
            "podAffinity": {REQUIRED: [no_key, TERM]},
        },
        "containers": [HOST_PORT],
        "topologySpreadConstraints": [{"maxSkew": 1}, SPREAD, {"maxSkew": 2}],
        # Honoured (dynamic resource allocation), so not listed.
        "resourceClaims": [{"name": "gpu"}],
    }
    fields = fields_of(spec)
    assert fields == (
        f"{POD_AFFINITY_REQUIRED}[0].topologyKey",
        f"{POD_ANTI_AFFINITY_REQUIRED}[1].namespaceSelector",
        "spec.topologySpreadConstraints[0] (maxSkew and topologyKey are required)",
        "spec.topologySpreadConstraints[2] (maxSkew and topologyKey are required)",
    )
    message = unsupported_message("ns/p", fields)
    # The same fix for affinity and anti-affinity is said once.
    assert message == (
        f"pod ns/p: {POD_AFFINITY_REQUIRED}[0].topologyKey, {POD_ANTI_AFFINITY_REQUIRED}[1]"
        ".namespaceSelector, spec.topologySpreadConstraints[0] (maxSkew and topologyKey are "
        f"required) and 1 more are not supported yet; the pod waits ({POD_RULE_FIX}; "
        f"{SPREAD_FIX})"
    )


@pytest.mark.parametrize(
    "spec",
    [
        None,
        [],
        "x",
        {"affinity": "x"},
        {"affinity": {"podAntiAffinity": ["x"]}},
        node_terms("x", {"matchFields": 3}),
        {"containers": [None, "c", {"ports": "80"}, {"ports": [None, 5]}]},
        {"topologySpreadConstraints": "x", "schedulingGates": [None, "g"]},
        {"affinity": {"podAntiAffinity": {REQUIRED: ["x", None, 3, {"topologyKey": 3}]}}},
        {"affinity": {"podAffinity": {REQUIRED: [{"topologyKey": "z", "labelSelector": "x"}]}}},
        {"affinity": {"podAffinity": {REQUIRED: [{**TERM, "namespaceSelector": "x"}]}}},
        {"affinity": {"podAffinity": {REQUIRED: [{**TERM, "matchLabelKeys": "app"}]}}},
        {"topologySpreadConstraints": [None, "x", {"maxSkew": True, "topologyKey": "z"}]},
        {"topologySpreadConstraints": [{**SPREAD, "minDomains": "3", "labelSelector": []}]},
    ],
)
def test_bad_input_never_raises(spec: Any) -> None:
    assert isinstance(unsupported_fields(spec), tuple)
    assert isinstance(unsupported_fields(spec, "ns", {"app": "web"}), tuple)
    assert isinstance(scheduling_gates(spec), tuple)


def test_scheduling_gates_are_read() -> None:
    spec = {"schedulingGates": [{"name": "example.com/a"}, {"name": "example.com/b"}]}
    pod = pod_from_k8s(k8s_pod(spec=spec), scheduler_name=SCHED, default_queue="q")
    assert pod.scheduling_gates == ("example.com/a", "example.com/b")
    assert pod.gated and not pod.pending
    assert pod_from_k8s(k8s_pod(), scheduler_name=SCHED, default_queue="q").scheduling_gates == ()


def test_snapshot_round_trips_the_new_fields() -> None:
    spec = {
        "affinity": {"podAntiAffinity": {REQUIRED: [NS_TERM]}},
        "schedulingGates": [{"name": "g"}],
    }
    pod = pod_from_k8s(k8s_pod(spec=spec), scheduler_name=SCHED, default_queue="q")
    snap = Snapshot(pods=(pod,))
    assert Snapshot.from_json(snap.to_json()).pods == (pod,)
    assert pod.unsupported == (NS_ANTI,) and pod.scheduling_gates == ("g",)


def test_snapshot_round_trips_pod_rules() -> None:
    """Every kind of rule survives a snapshot file: an absent selector (matches nothing) stays
    apart from an empty one (matches every pod), every namespace from the pod's own."""
    spec: dict[str, Any] = {
        "affinity": {
            "podAffinity": {REQUIRED: [{"topologyKey": "zone"}, {**TERM, "namespaces": ["x"]}]},
            "podAntiAffinity": {
                REQUIRED: [{"topologyKey": "h", "labelSelector": {}, "namespaceSelector": {}}]
            },
        },
        "topologySpreadConstraints": [
            {**READABLE["spread-all-fields"]["topologySpreadConstraints"][0]}
        ],
    }
    pod = pod_from_k8s(k8s_pod(spec=spec), scheduler_name=SCHED, default_queue="q")
    got = Snapshot.from_json(Snapshot(pods=(pod,)).to_json()).pods[0]
    assert got == pod
    assert got.pod_affinity[0].selector is None
    assert got.pod_anti_affinity[0].selector is not None
    assert got.pod_anti_affinity[0].namespaces is None
    assert got.pod_affinity[1].namespaces == ("x",)
    assert (got.spread[0].min_domains, got.spread[0].honor_affinity) == (3, False)


# --- through the cache, fair share and solve ---------------------------------------------


def cluster(*objs: tuple[str, dict[str, Any]], gpus: int = 8) -> Cache:
    cache = Cache(SCHED, "q", lambda: 1000.0)
    cache.apply("Node", "ADDED", k8s_node("n1", gpus))
    cache.apply("Queue", "ADDED", {"metadata": {"name": "q", "uid": "uid-q"}, "spec": {}})
    for kind, obj in objs:
        cache.apply(kind, "ADDED", obj)
    return cache


def decide(cache: Cache) -> tuple[Snapshot, Placement, dict[str, Any]]:
    snap = cache.snapshot()
    report = compute_fair_shares(snap)
    placement = with_findings(snap, report, solve(snap, SETTINGS, report))
    return snap, placement, report.queues["q"].requested


def placed_pods(placement: Placement) -> set[str]:
    return {a.pod_key for a in placement.assignments}


ANTI = {"affinity": {"podAntiAffinity": {REQUIRED: [NS_TERM]}}}


def test_a_pod_with_an_unsupported_field_waits_named_and_others_run() -> None:
    cache = cluster(
        ("Pod", k8s_pod("anti", gpus=1, spec=ANTI)),
        ("Pod", k8s_pod("plain", gpus=1)),
    )
    snap, placement, requested = decide(cache)
    assert placed_pods(placement) == {"ns/plain"}
    outcome = placement.outcomes["ns/anti"]
    assert not outcome.placed and outcome.reason_code == "UnsupportedField"
    assert outcome.reason == (
        f"pod ns/anti: {NS_ANTI} is not supported yet; the pod waits ({POD_RULE_FIX})"
    )
    # It still waits (PodScheduled=False with that message), but asks its queue for nothing.
    assert snap.pod_by_uid["uid-anti"].pending
    assert requested["gpu"] == 1000  # only "plain"
    assert cache.problems() == []


def test_one_such_pod_keeps_its_whole_gang_out() -> None:
    cache = cluster(
        ("PodGroup", k8s_podgroup("train", 2)),
        ("Pod", k8s_pod("train-0", gpus=1, group="train")),
        ("Pod", k8s_pod("train-1", gpus=1, group="train", spec=ANTI)),
    )
    _, placement, _ = decide(cache)
    assert placement.assignments == ()
    outcome = placement.outcomes["ns/train"]
    assert outcome.reason_code == "UnsupportedField"
    assert outcome.reason.startswith(f"pod ns/train-1: {NS_ANTI} is")


def test_readable_anti_affinity_is_honoured_not_refused() -> None:
    """Two pods that may not share a host, one node: one runs, the other waits for the rule
    (not for an unsupported field); on two nodes both run, apart."""
    readable = {"affinity": {"podAntiAffinity": {REQUIRED: [TERM]}}}

    def web(name: str) -> tuple[str, dict[str, Any]]:
        obj = k8s_pod(name, gpus=1, spec=readable)
        obj["metadata"]["labels"]["app"] = "web"
        return ("Pod", obj)

    snap, placement, _ = decide(cluster(web("web-0"), web("web-1")))
    assert all(p.unsupported == () and p.pod_anti_affinity for p in snap.pods)
    assert len(placed_pods(placement)) == 1
    (waiting,) = [o for o in placement.outcomes.values() if not o.placed]
    assert waiting.reason_code == "PodAntiAffinity", waiting
    assert "didn't match pod anti-affinity rules" in waiting.reason

    cache = cluster(web("web-0"), web("web-1"))
    cache.apply("Node", "ADDED", k8s_node("n2"))
    _, placement, _ = decide(cache)
    assert placed_pods(placement) == {"ns/web-0", "ns/web-1"}
    assert len({a.node for a in placement.assignments}) == 2


def test_preferred_forms_are_placed() -> None:
    spec = {
        "affinity": {
            "podAntiAffinity": {PREFERRED: [{"weight": 1, "podAffinityTerm": TERM}]},
            "nodeAffinity": {PREFERRED: [{"weight": 1, "preference": {}}]},
        },
        "topologySpreadConstraints": [{"maxSkew": 1, "whenUnsatisfiable": "ScheduleAnyway"}],
    }
    _, placement, _ = decide(cluster(("Pod", k8s_pod("pref", gpus=1, spec=spec))))
    assert placed_pods(placement) == {"ns/pref"}


GATE = {"schedulingGates": [{"name": "example.com/gate"}]}


def test_a_gated_pod_is_not_pending_work_until_its_gates_go() -> None:
    cache = cluster(("Pod", k8s_pod("gated", gpus=2, spec=GATE)))
    snap, placement, requested = decide(cache)
    pod = snap.pod_by_uid["uid-gated"]
    assert pod.gated and not pod.pending
    assert placement.assignments == ()
    assert requested["gpu"] == 0
    outcome = placement.outcomes["ns/gated"]
    assert (outcome.placed, outcome.reason_code) == (False, "SchedulingGated")
    assert outcome.reason == (
        "pod ns/gated has scheduling gates [example.com/gate]; it is scheduled once they are "
        "removed"
    )
    # The gates are removed (a pod UPDATE): it wakes the loop and is placed.
    cache.pending_changed.clear()
    cache.apply("Pod", "MODIFIED", k8s_pod("gated", gpus=2))
    assert cache.pending_changed.is_set()
    _, placement, requested = decide(cache)
    assert placed_pods(placement) == {"ns/gated"} and placement.outcomes["ns/gated"].placed
    assert requested["gpu"] == 2000


def test_a_gang_with_too_few_ungated_pods_waits_with_the_gates_named() -> None:
    objs = [
        ("PodGroup", k8s_podgroup("train", 2)),
        ("Pod", k8s_pod("train-0", gpus=1, group="train")),
        ("Pod", k8s_pod("train-1", gpus=1, group="train", spec=GATE)),
    ]
    cache = cluster(*objs)
    _, placement, requested = decide(cache)
    assert placement.assignments == ()
    outcome = placement.outcomes["ns/train"]
    assert outcome.reason_code == "SchedulingGated"
    assert outcome.reason == (
        "pod ns/train-1 has scheduling gates [example.com/gate]; it is scheduled once they are "
        "removed (gang ns/train needs 2 pods placed together; 1 can be scheduled now)"
    )
    assert requested["gpu"] == 1000  # the gated member asks for nothing yet
    cache.apply("Pod", "MODIFIED", k8s_pod("train-1", gpus=1, group="train"))
    _, placement, _ = decide(cache)
    assert placed_pods(placement) == {"ns/train-0", "ns/train-1"}


def test_gated_extras_do_not_hold_back_a_gang_that_has_enough() -> None:
    cache = cluster(
        ("PodGroup", k8s_podgroup("elastic", 1)),
        ("Pod", k8s_pod("elastic-0", gpus=1, group="elastic")),
        ("Pod", k8s_pod("elastic-1", gpus=1, group="elastic", spec=GATE)),
    )
    _, placement, _ = decide(cache)
    assert placed_pods(placement) == {"ns/elastic-0"}
    assert placement.outcomes["ns/elastic"].placed


def test_a_fully_gated_podgroup_says_so_and_its_pods_are_left_alone() -> None:
    """The status writer: the PodGroup gets the reason (Pending, not Unschedulable); no pod
    gets Unschedulable (the API server's PodScheduled=False/SchedulingGated stays on gated
    pods; the ungated member of a waiting gang gets the Event only)."""

    class Writer:
        def __init__(self) -> None:
            self.unschedulable: dict[str, str] = {}
            self.podgroups: dict[str, dict[str, Any]] = {}
            self.events: dict[str, str] = {}

        async def set_unschedulable(self, namespace: str, name: str, message: str) -> None:
            self.unschedulable[f"{namespace}/{name}"] = message

        async def patch_podgroup_status(
            self, namespace: str, name: str, status: dict[str, Any]
        ) -> None:
            self.podgroups[f"{namespace}/{name}"] = status

        async def patch_queue_status(self, name: str, status: dict[str, Any]) -> None:
            pass

        async def event(self, ref: Any, reason: str, message: str, **kwargs: Any) -> bool:
            if reason == "FailedScheduling":
                self.events[f"{ref.namespace}/{ref.name}"] = message
            return True

    cache = cluster(
        ("PodGroup", k8s_podgroup("all", 2)),
        *(("Pod", k8s_pod(f"all-{i}", gpus=1, group="all", spec=GATE)) for i in range(2)),
        ("PodGroup", k8s_podgroup("half", 2)),
        ("Pod", k8s_pod("half-0", gpus=1, group="half")),
        ("Pod", k8s_pod("half-1", gpus=1, group="half", spec=GATE)),
    )
    snap = cache.snapshot()
    report = compute_fair_shares(snap)
    placement = with_findings(snap, report, solve(snap, SETTINGS, report))
    writer = Writer()
    publisher = StatusPublisher(writer)  # type: ignore[arg-type]
    asyncio.run(publisher.publish(snap, placement.outcomes, {}, report, []))
    # Not even the ungated member: a new node would not help it (autoscalers read that
    # condition); its FailedScheduling Event says why.
    assert writer.unschedulable == {}
    assert "half-1 has scheduling gates" in writer.events["ns/half-0"]
    assert writer.podgroups["ns/all"]["phase"] == "Pending"  # waiting, not failing
    assert writer.podgroups["ns/all"]["pending"] == 2
    condition = writer.podgroups["ns/all"]["conditions"][0]
    assert (condition["status"], condition["reason"]) == ("False", "SchedulingGated")
    assert condition["message"] == (
        "pods ns/all-0 and ns/all-1 have scheduling gates [example.com/gate]; they are "
        "scheduled once the gates are removed (gang ns/all needs 2 pods placed together; 0 can "
        "be scheduled now)"
    )


def test_unsupported_field_wins_over_gates_and_is_told_early() -> None:
    spec = {**GATE, **ANTI}
    cache = cluster(("Pod", k8s_pod("both", gpus=1, spec=spec)))
    _, placement, _ = decide(cache)
    assert placement.outcomes["ns/both"].reason_code == "UnsupportedField"


def test_a_pod_whose_author_set_node_name_is_counted_there_and_never_bound() -> None:
    cache = cluster(
        ("Pod", k8s_pod("pinned", gpus=6, node_name="n1")),  # kubelet has not started it yet
        ("Pod", k8s_pod("big", gpus=4)),
        ("Pod", k8s_pod("small", gpus=2)),
    )
    snap, placement, _ = decide(cache)
    pinned = snap.pod_by_uid["uid-pinned"]
    assert pinned.managed and pinned.bound and not pinned.pending
    assert snap.node_states()["n1"].used[GPU] == 6
    assert "ns/pinned" not in placement.outcomes
    assert placed_pods(placement) == {"ns/small"}  # 6 of 8 GPUs are held by "pinned"
    assert placement.outcomes["ns/big"].reason_code == "InsufficientOnOneNode"
    report = compute_fair_shares(snap)
    assert report.queues["q"].allocated["gpu"] == 6000  # charged to its queue as running work


# --- the simulator ---------------------------------------------------------------------


@pytest.fixture
def _restore_logging() -> Iterator[None]:
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


SCENARIO: dict[str, Any] = {
    "name": "t",
    "settings": {"cyclePeriod": "5s", "end": "1m", "solver": "greedy"},
    "nodes": [{"name": "gpu", "count": 1, "gpus": 4}],
    "queues": [{"metadata": {"name": "team"}, "spec": {}}],
    "jobs": [
        {
            "name": "anti",
            "queue": "team",
            "pods": {
                "template": {
                    "spec": {
                        **ANTI,
                        "containers": [{"name": "c", "resources": {"limits": {GPU: 1}}}],
                    }
                }
            },
        },
        {"name": "plain", "queue": "team", "pods": {"resources": {GPU: 1}}},
    ],
}


@pytest.mark.usefixtures("_restore_logging")
def test_the_simulator_reports_unsupported_fields() -> None:
    result = simulate(parse_scenario(copy.deepcopy(SCENARIO)))
    gangs = {g.gang: g for g in gang_summaries(result)}
    assert gangs["default/plain"].status == "running"
    anti = gangs["default/anti"]
    assert (anti.status, anti.reason_code) == ("waiting", "UnsupportedField")
    assert NS_ANTI in anti.reason


@pytest.mark.usefixtures("_restore_logging")
def test_the_simulator_honours_readable_anti_affinity() -> None:
    """Two jobs that may not share a host, one node: one runs, the other waits for the rule."""
    data = copy.deepcopy(SCENARIO)
    template = {
        "metadata": {"labels": {"app": "web"}},
        "spec": {
            "affinity": {"podAntiAffinity": {REQUIRED: [TERM]}},
            "containers": [{"name": "c", "resources": {"limits": {GPU: 1}}}],
        },
    }
    data["jobs"] = [
        {"name": f"web-{i}", "queue": "team", "pods": {"template": copy.deepcopy(template)}}
        for i in range(2)
    ]
    result = simulate(parse_scenario(data))
    gangs = {g.gang: g for g in gang_summaries(result)}
    statuses = sorted(g.status for g in gangs.values())
    assert statuses == ["running", "waiting"], gangs
    (waiting,) = [g for g in gangs.values() if g.status == "waiting"]
    assert waiting.reason_code == "PodAntiAffinity", waiting


def test_the_simulator_refuses_scheduling_gates() -> None:
    data = copy.deepcopy(SCENARIO)
    data["jobs"][0]["pods"]["template"]["spec"] = {
        **GATE,
        "containers": [{"name": "c", "resources": {"limits": {GPU: 1}}}],
    }
    with pytest.raises(ScenarioError) as err:
        parse_scenario(data)
    assert err.value.field == "jobs[0].pods.template.spec.schedulingGates"


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"topologyConstraint": {"requiredTopologyLevel": "rack"}}, "requiredTopologyLevel"),
        ({"subGroups": [{"name": "a", "minMember": 1}]}, "spec.subGroups"),
    ],
)
def test_podgroup_fields_not_implemented_make_the_gang_wait(
    extra: dict[str, Any], field: str
) -> None:
    group = k8s_podgroup("topo", 2)
    group["spec"].update(extra)
    cache = cluster(
        ("PodGroup", group),
        *(("Pod", k8s_pod(f"topo-{i}", gpus=1, group="topo")) for i in range(2)),
        ("Pod", k8s_pod("plain", gpus=1)),
    )
    _, placement, _ = decide(cache)
    outcome = placement.outcomes["ns/topo"]
    assert (outcome.placed, outcome.reason_code) == (False, "UnsupportedField")
    assert field in outcome.reason and "PodGroup ns/topo" in outcome.reason
    assert placed_pods(placement) == {"ns/plain"}  # everything else is scheduled


def test_a_preferred_topology_level_is_a_preference() -> None:
    group = k8s_podgroup("soft", 2)
    group["spec"]["topologyConstraint"] = {"preferredTopologyLevel": "rack"}
    cache = cluster(
        ("PodGroup", group),
        *(("Pod", k8s_pod(f"soft-{i}", gpus=1, group="soft")) for i in range(2)),
    )
    _, placement, _ = decide(cache)
    assert placement.outcomes["ns/soft"].placed


def test_a_node_another_scheduler_nominated_a_pod_to_is_held_for_it() -> None:
    """kube-scheduler preempted on n1 for its pod and shows it in nominatedNodeName: that
    room is not ours to take (as kube-scheduler itself counts nominated pods)."""
    theirs = k8s_pod("theirs", gpus=8, scheduler="default-scheduler")
    theirs["status"]["nominatedNodeName"] = "n1"
    cache = cluster(("Pod", theirs), ("Pod", k8s_pod("ours", gpus=1)))
    snap, placement, _ = decide(cache)
    held = {p.name: p for p in snap.pods}["theirs"]
    assert (held.node_name, held.nominated, held.managed) == ("n1", True, False)
    assert placed_pods(placement) == set()
    assert placement.outcomes["ns/ours"].reason_code != "UnsupportedField"
    # Without the nomination the node is free.
    del theirs["status"]["nominatedNodeName"]
    cache = cluster(("Pod", theirs), ("Pod", k8s_pod("ours", gpus=1)))
    _, placement, _ = decide(cache)
    assert placed_pods(placement) == {"ns/ours"}


def _port_pod(name: str, port: int, protocol: str = "TCP", **kw: Any) -> dict[str, Any]:
    container = {
        "name": "c",
        "resources": {"requests": {"cpu": "1"}},
        "ports": [{"containerPort": port, "hostPort": port, "protocol": protocol}],
    }
    return k8s_pod(name, spec={"containers": [container]}, **kw)


def test_host_ports_one_pod_per_node_per_port_and_protocol() -> None:
    """kube-scheduler's NodePorts rule: one node cannot give the same host port twice."""
    cache = cluster(
        ("Pod", _port_pod("a", 8080)),
        ("Pod", _port_pod("b", 8080)),
        ("Pod", _port_pod("udp", 8080, "UDP")),  # another protocol: no conflict
        ("Pod", _port_pod("other", 9090)),
    )
    snap, placement, _ = decide(cache)
    assert placed_pods(placement) == {"ns/a", "ns/udp", "ns/other"} or placed_pods(placement) == {
        "ns/b",
        "ns/udp",
        "ns/other",
    }
    waiting = placement.outcomes["ns/b" if "ns/a" in placed_pods(placement) else "ns/a"]
    assert not waiting.placed and "TCP/8080" in waiting.reason, waiting.reason
    node = snap.node_by_name["n1"]
    assert node.allocatable[f"{HOST_PORT_PREFIX}tcp-8080"] == 1


def test_a_host_port_held_by_a_running_pod_of_another_scheduler_is_taken() -> None:
    cache = cluster(
        ("Pod", _port_pod("web", 443, scheduler="default-scheduler", node_name="n1")),
        ("Pod", _port_pod("ours", 443)),
        ("Pod", _port_pod("free", 80)),
    )
    _, placement, _ = decide(cache)
    assert placed_pods(placement) == {"ns/free"}
    assert "TCP/443" in placement.outcomes["ns/ours"].reason
