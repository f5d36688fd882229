"""The objects of one ``takeback-diff`` run (:mod:`scheduler.bench.takeback_diff`): their
real names (:class:`RunNames`) and manifests - Queues, PodGroups, PodDisruptionBudgets and the
ReplicaSets that run each gang's pods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scheduler.bench.takeback_scenarios import PODGROUPER, QueueSpec, Workload

__all__ = [
    "GPU",
    "LABEL_GANG",
    "LABEL_GROUPER",
    "LABEL_RUN",
    "NAMESPACE_PREFIX",
    "QUEUE_LABEL",
    "RunNames",
    "budget_manifest",
    "podgroup_manifest",
    "queue_manifest",
    "replicaset_manifest",
]

GPU = "nvidia.com/gpu"
QUEUE_LABEL = "kai.scheduler/queue"
LABEL_RUN = "kai-diff/run"
LABEL_GANG = "kai-diff/gang"
LABEL_GROUPER = "kai-diff/grouper"
NAMESPACE_PREFIX = "tdiff-"


@dataclass(frozen=True)
class RunNames:
    """The real names of one run's objects."""

    rid: str
    namespace: str
    nodes: tuple[str, ...]

    def queue(self, logical: str) -> str:
        """The real name of a scenario queue."""
        return f"td-{self.rid}-{logical}"

    def logical_node(self, node: str | None) -> str | None:
        """``n0``, ``n1``, ... for this run's nodes."""
        if node in self.nodes:
            return f"n{self.nodes.index(node)}"
        return node


def queue_manifest(q: QueueSpec, names: RunNames) -> dict[str, Any]:
    """A ``scheduling.run.ai/v2`` Queue."""

    def res(quota: float, limit: float, weight: float) -> dict[str, float]:
        return {"quota": quota, "limit": limit, "overQuotaWeight": weight}

    spec: dict[str, Any] = {
        "resources": {
            "gpu": res(q.gpu_quota, q.gpu_limit, q.over_quota_weight),
            "cpu": res(-1, -1, 1),
            "memory": res(-1, -1, 1),
        }
    }
    if q.parent:
        spec["parentQueue"] = names.queue(q.parent)
    return {
        "apiVersion": "scheduling.run.ai/v2",
        "kind": "Queue",
        "metadata": {"name": names.queue(q.name), "labels": {LABEL_RUN: names.rid}},
        "spec": spec,
    }


def podgroup_manifest(w: Workload, names: RunNames) -> dict[str, Any]:
    """The PodGroup of a ``podgroup``-grouped workload."""
    spec: dict[str, Any] = {
        "minMember": w.minimum,
        "queue": names.queue(w.queue),
        "priorityClassName": w.priority_class,
    }
    if w.preemptibility:
        spec["preemptibility"] = w.preemptibility
    return {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {
            "name": w.name,
            "labels": {LABEL_RUN: names.rid, QUEUE_LABEL: names.queue(w.queue)},
        },
        "spec": spec,
    }


def budget_manifest(w: Workload, names: RunNames) -> dict[str, Any]:
    """The PodDisruptionBudget of a workload with ``budget_min_available``."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": w.name, "labels": {LABEL_RUN: names.rid}},
        "spec": {
            "minAvailable": w.budget_min_available,
            "selector": {"matchLabels": {LABEL_RUN: names.rid, LABEL_GANG: w.name}},
        },
    }


def replicaset_manifest(w: Workload, names: RunNames, scheduler_name: str) -> dict[str, Any]:
    """The ReplicaSet running the workload's pods (it recreates evicted ones, pending)."""
    selector = {LABEL_RUN: names.rid, LABEL_GANG: w.name}
    labels = {**selector, QUEUE_LABEL: names.queue(w.queue)}
    annotations: dict[str, str] = {}
    if w.grouping == PODGROUPER:
        if w.replicas != 1 or w.min_member not in (None, 1) or w.preemptibility:
            raise ValueError(f"{w.name}: a {PODGROUPER} workload is a plain gang of one")
        labels[LABEL_GROUPER] = PODGROUPER
    else:
        annotations["pod-group-name"] = w.name
    node_selector = {LABEL_RUN: names.rid}
    if w.node is not None:
        node_selector["kubernetes.io/hostname"] = names.nodes[w.node]
    resources = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {GPU: str(w.gpus)}}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": w.name, "labels": dict(selector)},
        "spec": {
            "replicas": w.replicas,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": {
                    "schedulerName": scheduler_name,
                    "priorityClassName": w.priority_class,
                    "terminationGracePeriodSeconds": 0,
                    "nodeSelector": node_selector,
                    "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
                    "containers": [
                        {"name": "main", "image": "registry.invalid/fake:1", "resources": resources}
                    ],
                },
            },
        },
    }
