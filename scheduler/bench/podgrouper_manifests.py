"""The objects of one ``podgrouper-diff`` run (:mod:`scheduler.bench.podgrouper_diff`): the
names of a run (:class:`RunNames`) and each case's top owner (:func:`workload_manifest`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scheduler.bench.podgrouper_cases import REPLICAS, Case

__all__ = ["LABEL_CASE", "LABEL_RUN", "NAMESPACE_PREFIX", "RunNames", "workload_manifest"]

LABEL_RUN = "pgdiff/run"
LABEL_CASE = "pgdiff/case"
NAMESPACE_PREFIX = "pgd-"


@dataclass(frozen=True)
class RunNames:
    """One run's names: ``rid`` is unique per run, ``scheduler`` the pods' schedulerName."""

    rid: str
    scheduler: str

    def namespace(self, case: Case) -> str:
        """The case's namespace in this run."""
        return f"{NAMESPACE_PREFIX}{self.rid}-{case.name}"[:63].rstrip("-")

    def labels(self, case: Case) -> dict[str, str]:
        """The labels every object of the case carries (they select the run's pods)."""
        return {LABEL_RUN: self.rid, LABEL_CASE: case.name}


def _pod_template(case: Case, names: RunNames, restart: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": names.scheduler,
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": False,
        "containers": [
            {
                "name": "main",
                "image": "registry.invalid/pgdiff:1",
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
            }
        ],
    }
    if restart:
        spec["restartPolicy"] = restart
    if case.pod_priority_class:
        spec["priorityClassName"] = case.pod_priority_class
    return {"metadata": {"labels": {**names.labels(case), **case.pod_labels}}, "spec": spec}


def _meta(case: Case, names: RunNames) -> dict[str, Any]:
    return {
        "name": case.workload,
        "namespace": names.namespace(case),
        "labels": {**names.labels(case), **case.owner_labels},
        "annotations": dict(case.owner_annotations),
    }


def workload_manifest(case: Case, names: RunNames) -> dict[str, Any]:
    """The case's top owner (for a CronJob: the CronJob; its Job is made with kubectl)."""
    meta = _meta(case, names)
    selector = {"matchLabels": names.labels(case)}
    if case.kind == "pod":
        template = _pod_template(case, names)
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {**meta, "labels": {**template["metadata"]["labels"], **meta["labels"]}},
            "spec": template["spec"],
        }
    if case.kind == "job":
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": meta,
            "spec": {
                "parallelism": REPLICAS,
                "completions": REPLICAS,
                "backoffLimit": 0,
                "template": _pod_template(case, names, "Never"),
            },
        }
    if case.kind == "cronjob":
        return {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": meta,
            "spec": {
                "schedule": "0 0 1 1 *",
                "suspend": True,  # its Job is made by hand: nothing waits for the schedule
                "jobTemplate": {
                    "metadata": {
                        "labels": {**names.labels(case), **case.job_labels},
                        "annotations": dict(case.job_annotations),
                    },
                    "spec": {
                        "parallelism": REPLICAS,
                        "completions": REPLICAS,
                        "backoffLimit": 0,
                        "template": _pod_template(case, names, "Never"),
                    },
                },
            },
        }
    if case.kind in ("deployment", "replicaset"):
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment" if case.kind == "deployment" else "ReplicaSet",
            "metadata": meta,
            "spec": {
                "replicas": REPLICAS,
                "selector": selector,
                "template": _pod_template(case, names),
            },
        }
    if case.kind == "statefulset":
        return {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": meta,
            "spec": {
                "replicas": REPLICAS,
                "serviceName": case.workload,
                # Parallel: OrderedReady would create the second pod only once the first runs.
                "podManagementPolicy": "Parallel",
                "selector": selector,
                "template": _pod_template(case, names),
            },
        }
    if case.kind == "leaderworkerset":
        return {
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            "metadata": meta,
            "spec": {
                "replicas": 1,
                "leaderWorkerTemplate": {
                    "size": REPLICAS,
                    "workerTemplate": _pod_template(case, names),
                },
            },
        }
    if case.kind == "volcano":
        return {
            "apiVersion": "batch.volcano.sh/v1alpha1",
            "kind": "Job",
            "metadata": meta,
            "spec": {
                "schedulerName": names.scheduler,
                "queue": "default",
                "minAvailable": REPLICAS,
                "tasks": [
                    {
                        "name": "worker",
                        "replicas": REPLICAS,
                        "template": _pod_template(case, names, "Never"),
                    }
                ],
            },
        }
    raise ValueError(f"unknown kind {case.kind!r}")
