"""Seeded random cases for the differential test: a small cluster and a small workload.

:func:`generate` turns a seed into plain manifests (Nodes and Pods). The same seed always
gives the same case; what differs between the two copies of a case (one for kube-scheduler,
one for ours) is only naming and the scheduler-specific fields:

- nodes are ``d<i><side>-n<j>``; topology values (zones, racks) are ``d<i><side>-z<k>`` /
  ``-r<k>``, so no domain is shared between cases or copies;
- every node carries label ``diff.kai/case: "<i>-<side>"`` and taint
  ``diff.kai/case=<i>-<side>:NoSchedule``; every pod gets that label as a nodeSelector entry
  and a toleration for that taint, so no other pod lands on a case's nodes and a case's pods
  land on no other nodes;
- pods get the namespace ``diff-<i>-<side>``, the scheduler's name and its extra labels.

The random choices never depend on the copy, so both copies are the same case. The draws:
2-6 nodes (zone, rack and disk-type labels, some missing; cpu/memory sized so some cases are
tight; a few nodes with a low pod limit; some with a ``dedicated`` NoSchedule taint), 3-12 pods
in 1-4 workloads (replicas sharing a spec, like a Deployment's) plus a few single pods, with:
requests, tolerations, nodeSelector, required node affinity (In/NotIn/Exists), required pod
affinity (to another app, or a whole workload to itself) and anti-affinity (one per node or per
zone, or away from another app), topology spread (DoNotSchedule or ScheduleAnyway, maxSkew 1-2,
sometimes minDomains, matchLabelKeys or nodeTaintsPolicy Honor), host ports and preferred
(anti-)affinities. No gangs, GPUs, namespaceSelectors, namespace lists or
``nodeAffinityPolicy: Ignore`` (they would reach across cases). The pods are created in a
shuffled order, so a pod may come before the pods it needs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CASE_LABEL",
    "CASE_TAINT",
    "DISK",
    "RACK",
    "ZONE",
    "CaseCopy",
    "case_seeds",
    "generate",
]

CASE_LABEL = "diff.kai/case"
CASE_TAINT = "diff.kai/case"
DEDICATED = "diff.kai/dedicated"
ZONE = "topology.kubernetes.io/zone"
RACK = "diff.kai/rack"
DISK = "diff.kai/disk"
HOSTNAME = "kubernetes.io/hostname"
#: kwok manages (marks Ready, keeps alive) nodes with this annotation.
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
APPS = ("web", "db", "cache", "api")

Manifest = dict[str, Any]


@dataclass
class CaseCopy:
    """One copy of one case: its manifests for one scheduler."""

    seed: int
    index: int
    #: ``k`` (kube-scheduler) or ``o`` (ours).
    side: str
    namespace: str
    nodes: list[Manifest]
    #: In creation order.
    pods: list[Manifest]
    #: The features drawn (for coverage statistics), e.g. ``podAffinity``.
    features: set[str] = field(default_factory=set)

    @property
    def copy_id(self) -> str:
        """``<i>-<side>``: the value of the case label and taint."""
        return f"{self.index}-{self.side}"


def case_seeds(seed: int, count: int) -> list[int]:
    """The seeds of ``count`` cases of a run started with ``seed``: ``seed, seed+1, ...``, so
    the failing case with seed S is replayed alone by a run with ``--seed S --cases 1``."""
    return [seed + i for i in range(count)]


def namespace_of(index: int, side: str) -> str:
    """The namespace of one copy."""
    return f"diff-{index}-{side}"


@dataclass
class _Draw:
    """The copy-independent part of a case, with names still to be prefixed."""

    rng: random.Random
    features: set[str] = field(default_factory=set)


def _selector(rng: random.Random, app: str, others: list[str]) -> dict[str, Any]:
    """A label selector for pods of ``app``: matchLabels, or an In expression (sometimes
    with another app in it)."""
    if rng.random() < 0.6:
        return {"matchLabels": {"app": app}}
    values = sorted({app, *rng.sample(others, min(len(others), rng.randint(0, 1)))})
    return {"matchExpressions": [{"key": "app", "operator": "In", "values": values}]}


def generate(
    seed: int,
    index: int,
    side: str,
    scheduler_name: str,
    pod_labels: dict[str, str] | None = None,
) -> CaseCopy:
    """Case ``seed`` as copy ``<index>-<side>`` for the scheduler named ``scheduler_name``."""
    rng = random.Random(seed)
    prefix = f"d{index}{side}"
    copy_id = f"{index}-{side}"
    features: set[str] = set()

    # ----------------------------------------------------------------------------- nodes
    n_nodes = rng.randint(2, 6)
    n_zones = rng.randint(1, 3)
    tight = rng.random() < 0.4
    zones = [f"{prefix}-z{k}" for k in range(n_zones)]
    nodes: list[Manifest] = []
    for j in range(n_nodes):
        name = f"{prefix}-n{j}"
        labels = {HOSTNAME: name, CASE_LABEL: copy_id, "kubernetes.io/os": "linux"}
        if rng.random() < 0.9:
            labels[ZONE] = rng.choice(zones)
        else:
            features.add("nodeWithoutZone")
        if rng.random() < 0.6:
            labels[RACK] = f"{prefix}-r{rng.randrange(2 * n_zones)}"
        if rng.random() < 0.6:
            labels[DISK] = rng.choice(["ssd", "hdd"])
        cpu = rng.choice([1, 2, 2, 4]) if tight else rng.choice([4, 8])
        memory = rng.choice([2, 4]) if tight else rng.choice([8, 16])
        pods_limit = 110
        if rng.random() < 0.1:
            pods_limit = rng.randint(2, 4)
            features.add("podsLimit")
        taints = [{"key": CASE_TAINT, "value": copy_id, "effect": "NoSchedule"}]
        if rng.random() < 0.25:
            taints.append(
                {"key": DEDICATED, "value": rng.choice(["batch", "infra"]), "effect": "NoSchedule"}
            )
            features.add("taint")
        resources = {"cpu": str(cpu), "memory": f"{memory}Gi", "pods": str(pods_limit)}
        nodes.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": labels,
                    "annotations": {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1]},
                },
                "spec": {"taints": taints},
                "status": {"capacity": resources, "allocatable": dict(resources)},
            }
        )
    if tight:
        features.add("tight")

    # ------------------------------------------------------------------------------ pods
    n_pods = rng.randint(3, 12)
    apps = list(APPS[: rng.randint(1, len(APPS))])
    # Workloads: (app, replicas); the rest of the pods are singles of a random app.
    workloads: list[tuple[str, int]] = []
    left = n_pods
    for app in apps:
        if left <= 0:
            break
        replicas = rng.randint(1, min(left, 5))
        workloads.append((app, replicas))
        left -= replicas
    pod_specs: list[tuple[str, dict[str, Any], dict[str, str]]] = []
    for app, replicas in workloads:
        spec = _pod_spec(rng, app, apps, zones, features, tight)
        for _ in range(replicas):
            pod_specs.append((app, spec, {"version": rng.choice(["v1", "v2"])}))
    for _ in range(left):
        app = rng.choice(apps)
        spec = _pod_spec(rng, app, apps, zones, features, tight)
        pod_specs.append((app, spec, {"version": rng.choice(["v1", "v2"])}))
    order = list(range(len(pod_specs)))
    rng.shuffle(order)

    namespace = namespace_of(index, side)
    pods: list[Manifest] = []
    for k, i in enumerate(order):
        app, spec, extra = pod_specs[i]
        pod_spec = _copy(spec)
        pod_spec["schedulerName"] = scheduler_name
        pod_spec["terminationGracePeriodSeconds"] = 0
        pod_spec["nodeSelector"] = {**pod_spec.get("nodeSelector", {}), CASE_LABEL: copy_id}
        pod_spec["tolerations"] = [
            *pod_spec.get("tolerations", []),
            {"key": CASE_TAINT, "operator": "Equal", "value": copy_id, "effect": "NoSchedule"},
        ]
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"p{k:02d}-{app}",
                    "namespace": namespace,
                    "labels": {
                        "app": app,
                        **extra,
                        CASE_LABEL: copy_id,
                        **(pod_labels or {}),
                    },
                },
                "spec": pod_spec,
            }
        )
    return CaseCopy(seed, index, side, namespace, nodes, pods, features)


def _copy(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _copy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_copy(v) for v in obj]
    return obj


def _pod_spec(
    rng: random.Random,
    app: str,
    apps: list[str],
    zones: list[str],
    features: set[str],
    tight: bool,
) -> dict[str, Any]:
    """One pod template: resources and the placement rules drawn for it."""
    others = [a for a in apps if a != app] or [a for a in APPS if a != app]
    if tight:
        cpu = rng.choice(["250m", "500m", "1", "1500m"])
        memory = rng.choice(["256Mi", "512Mi", "1Gi", "2Gi"])
    else:
        cpu = rng.choice(["100m", "250m", "500m", "1"])
        memory = rng.choice(["128Mi", "256Mi", "512Mi", "1Gi"])
    container: dict[str, Any] = {
        "name": "main",
        "image": "registry.invalid/fake:1",
        "resources": {"requests": {"cpu": cpu, "memory": memory}},
    }
    spec: dict[str, Any] = {"containers": [container]}
    affinity: dict[str, Any] = {}

    if rng.random() < 0.15:
        features.add("hostPort")
        port = rng.choice([8080, 9090])
        container["ports"] = [
            {
                "containerPort": port,
                "hostPort": port,
                "protocol": rng.choice(["TCP", "TCP", "UDP"]),
            }
        ]
    if rng.random() < 0.3:
        features.add("toleration")
        if rng.random() < 0.5:
            spec["tolerations"] = [{"key": DEDICATED, "operator": "Exists", "effect": "NoSchedule"}]
        else:
            value = rng.choice(["batch", "infra"])
            spec["tolerations"] = [
                {"key": DEDICATED, "operator": "Equal", "value": value, "effect": "NoSchedule"}
            ]
    if rng.random() < 0.15:
        features.add("nodeSelector")
        spec["nodeSelector"] = (
            {DISK: rng.choice(["ssd", "hdd"])} if rng.random() < 0.5 else {ZONE: rng.choice(zones)}
        )
    if rng.random() < 0.2:
        features.add("nodeAffinity")
        terms = [_node_term(rng, zones) for _ in range(1 if rng.random() < 0.75 else 2)]
        affinity["nodeAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }
    roll = rng.random()
    if roll < 0.12:
        # Affinity to another app's pods ("next to a cache pod").
        features.add("podAffinity")
        target = rng.choice(others)
        affinity["podAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"app": target}},
                    "topologyKey": rng.choice([HOSTNAME, ZONE, ZONE]),
                }
            ]
        }
    elif roll < 0.17:
        # The whole app in one zone (affinity to itself: the first pod may go anywhere).
        features.add("podAffinitySelf")
        affinity["podAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": ZONE}
            ]
        }
    roll = rng.random()
    if roll < 0.2:
        features.add("podAntiAffinitySelf")
        affinity["podAntiAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": _selector(rng, app, []),
                    "topologyKey": HOSTNAME if rng.random() < 0.75 else ZONE,
                }
            ]
        }
    elif roll < 0.28:
        features.add("podAntiAffinity")
        affinity["podAntiAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": _selector(rng, rng.choice(others), others),
                    "topologyKey": rng.choice([HOSTNAME, ZONE]),
                }
            ]
        }
    if rng.random() < 0.3:
        constraints = [_spread(rng, app, features) for _ in range(1 if rng.random() < 0.75 else 2)]
        # Validation refuses two constraints with the same topologyKey and whenUnsatisfiable.
        seen: set[tuple[str, str]] = set()
        spec["topologySpreadConstraints"] = []
        for c in constraints:
            if (c["topologyKey"], c["whenUnsatisfiable"]) not in seen:
                seen.add((c["topologyKey"], c["whenUnsatisfiable"]))
                spec["topologySpreadConstraints"].append(c)
    if rng.random() < 0.25:
        features.add("preferred")
        if rng.random() < 0.5:
            affinity.setdefault("nodeAffinity", {})[
                "preferredDuringSchedulingIgnoredDuringExecution"
            ] = [
                {
                    "weight": rng.randint(1, 100),
                    "preference": {
                        "matchExpressions": [
                            {"key": ZONE, "operator": "In", "values": [rng.choice(zones)]}
                        ]
                    },
                }
            ]
        else:
            kind = rng.choice(["podAffinity", "podAntiAffinity"])
            affinity.setdefault(kind, {})["preferredDuringSchedulingIgnoredDuringExecution"] = [
                {
                    "weight": rng.randint(1, 100),
                    "podAffinityTerm": {
                        "labelSelector": {"matchLabels": {"app": rng.choice(apps)}},
                        "topologyKey": rng.choice([HOSTNAME, ZONE]),
                    },
                }
            ]
    if affinity:
        spec["affinity"] = affinity
    return spec


def _node_term(rng: random.Random, zones: list[str]) -> dict[str, Any]:
    kind = rng.randrange(5)
    if kind == 0:
        expr = {"key": ZONE, "operator": "In", "values": sorted(rng.sample(zones, 1))}
    elif kind == 1:
        expr = {"key": ZONE, "operator": "NotIn", "values": [rng.choice(zones)]}
    elif kind == 2:
        expr = {"key": DISK, "operator": "Exists"}
    elif kind == 3:
        expr = {"key": DISK, "operator": "In", "values": ["ssd"]}
    else:
        expr = {"key": RACK, "operator": "Exists"}
    return {"matchExpressions": [expr]}


def _spread(rng: random.Random, app: str, features: set[str]) -> dict[str, Any]:
    hard = rng.random() < 0.7
    features.add("spreadDoNotSchedule" if hard else "spreadScheduleAnyway")
    constraint: dict[str, Any] = {
        "maxSkew": rng.randint(1, 2),
        "topologyKey": rng.choice([ZONE, ZONE, HOSTNAME, RACK]),
        "whenUnsatisfiable": "DoNotSchedule" if hard else "ScheduleAnyway",
        "labelSelector": _selector(rng, app, []),
    }
    if hard and rng.random() < 0.25:
        features.add("minDomains")
        constraint["minDomains"] = rng.randint(2, 4)
    if rng.random() < 0.2:
        features.add("matchLabelKeys")
        constraint["matchLabelKeys"] = ["version"]
    if rng.random() < 0.1:
        features.add("nodeTaintsPolicy")
        constraint["nodeTaintsPolicy"] = "Honor"
    return constraint
