"""``python -m scheduler.bench podgrouper-diff``: our pod grouper versus KAI-Scheduler's own.

Each :class:`Case` is data: a workload kind (a bare Pod, a batch Job, a CronJob's Job, a
Deployment, a bare ReplicaSet, a StatefulSet, a LeaderWorkerSet, a Volcano Job) and what it
says about grouping (the queue label ``kai.scheduler/queue``, the ``priorityClassName`` label,
the ``kai.scheduler/preemptibility`` label, on the top owner or the pod template; the pod
spec's ``priorityClassName``; the min-member annotations). The same cases run under one
grouper at a time on one control plane - ours (``python -m scheduler podgrouper`` with the
shipped ServiceAccount and ClusterRole, our CRDs), then KAI-Scheduler v0.12.0's
``cmd/podgrouper`` built from its Go module (with KAI's CRDs and its ClusterRole, see
:mod:`scheduler.bench.e2e_peers`) - each run with its own namespaces (one per case) and its own
``schedulerName`` on the pods, so neither grouper sees the other run's pods. kube-controller-
manager, the LeaderWorkerSet controller (no gang provider) and Volcano's job controller make
the pods; no node exists, so every pod stays pending, which is all a grouper needs. (Volcano's
controller creates a Job's pods only once its Volcano PodGroup is ``Inqueue``, which a
scheduler would decide: the bench sets that phase itself.)

A run ends once every case has all its pods and nothing (pods' ``pod-group-name``, PodGroups)
changed for ``settle`` seconds. Per case it records the PodGroups the pods name and sums them
up in :data:`FIELDS`: how many pods were grouped, how many PodGroups, their names as a
pattern (``pg-<job>-<job uid>``), owner kinds, and the distinct ``minMember``, queue,
priority class and preemptibility values. The comparison (:func:`compare`) says per case:

- ``same``: ours and KAI agree on every field;
- ``deliberate``: they differ in exactly the fields the case's :class:`Difference` declares,
  with exactly the declared values (the reason is in the case and in docs/podgrouper.md,
  "Differences from KAI's pod grouper");
- ``UNDECLARED``: they differ and the case declares nothing;
- ``NOT-AS-DECLARED``: the case declares a difference that did not happen as declared;
- ``incomplete``: a run failed, or a pod named a PodGroup that does not exist.

Prints one JSON document on stdout and a table on stderr. KAI is built on demand by
``testenv/build_peers.sh kai`` (cached). The e2e test is tests/e2e/test_podgrouper_vs_kai.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from scheduler.bench import e2e_peers as peers
from scheduler.bench.takeback_diff import _apply_kai_crds, _apply_our_crds, kai_dir
from testenv import ControlPlane, process
from testenv.controllers import http_ok

__all__ = [
    "CASES",
    "FIELDS",
    "GROUPERS",
    "KINDS",
    "Case",
    "Difference",
    "add_parser",
    "case_named",
    "compare",
    "document",
    "name_pattern",
    "prepare_plane",
    "run",
    "run_diff",
    "summarize",
    "table",
]

REPO = peers.REPO
GROUPERS = ("ours", "kai")
KINDS = (
    "pod",
    "job",
    "cronjob",
    "deployment",
    "replicaset",
    "statefulset",
    "leaderworkerset",
    "volcano",
)
#: What a case's result is compared on (see :func:`summarize`).
FIELDS = (
    "grouped",
    "podgroups",
    "name",
    "owner",
    "min_member",
    "queue",
    "priority_class",
    "preemptibility",
)

QUEUE_LABEL = "kai.scheduler/queue"
PRIORITY_LABEL = "priorityClassName"
PREEMPTIBILITY_LABEL = "kai.scheduler/preemptibility"
BATCH_MIN_MEMBER = "kai.scheduler/batch-min-member"
STS_MIN_MEMBER = "kai.scheduler/min-member"
POD_GROUP_ANNOTATION = "pod-group-name"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
LABEL_RUN = "pgdiff/run"
LABEL_CASE = "pgdiff/case"
NAMESPACE_PREFIX = "pgd-"
#: A queue the cases name by label (created by :func:`prepare_plane`; KAI does not check).
TEAM_QUEUE = "pgdiff-team"
#: ``spec.schedulerName`` of each run's pods (KAI's grouper only groups one name).
OURS_SCHEDULER = "kai-scheduler"
PODGROUPS = "podgroups.scheduling.run.ai"
VOLCANO_PODGROUPS = "podgroups.scheduling.volcano.sh"
#: The top owner's resource (for kubectl) per case kind.
_RESOURCE = {
    "job": "jobs.batch",
    "cronjob": "cronjobs.batch",
    "deployment": "deployments.apps",
    "replicaset": "replicasets.apps",
    "statefulset": "statefulsets.apps",
    "leaderworkerset": "leaderworkersets.leaderworkerset.x-k8s.io",
    "volcano": "jobs.batch.volcano.sh",
}
#: The Job ``kubectl create job --from=cronjob/...`` makes for a CronJob case.
CRONJOB_JOB = "cronjob-run"
#: Pods per workload (a bare pod is one; a LeaderWorkerSet is one group of this size).
REPLICAS = 2


# ------------------------------------------------------------------------------ cases


@dataclass(frozen=True)
class Difference:
    """A deliberate, documented difference: the fields (of :data:`FIELDS`) in which the two
    groupers differ for a case, with each one's value, and why (docs/podgrouper.md,
    "Differences from KAI's pod grouper"). Every differing field must be declared, with the
    same value on both sides; a declared field that agrees, or another value, is a failure."""

    ours: Mapping[str, Any]
    kai: Mapping[str, Any]
    reason: str

    def __post_init__(self) -> None:
        if set(self.ours) != set(self.kai) or not self.ours:
            raise ValueError("a Difference declares the same fields for ours and kai")
        unknown = set(self.ours) - set(FIELDS)
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)}; use {FIELDS}")


@dataclass(frozen=True)
class Case:
    """One workload and what it says about grouping. ``owner_labels`` and
    ``owner_annotations`` go on the top owner (for a CronJob: the CronJob; for a bare pod: the
    pod); ``job_labels``/``job_annotations`` on a CronJob's ``jobTemplate`` (so on its Job);
    ``pod_labels`` and ``pod_priority_class`` on the pod template."""

    name: str
    kind: str
    summary: str
    owner_labels: Mapping[str, str] = field(default_factory=dict)
    owner_annotations: Mapping[str, str] = field(default_factory=dict)
    job_labels: Mapping[str, str] = field(default_factory=dict)
    job_annotations: Mapping[str, str] = field(default_factory=dict)
    pod_labels: Mapping[str, str] = field(default_factory=dict)
    pod_priority_class: str | None = None
    difference: Difference | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"case {self.name}: unknown kind {self.kind!r}; use {KINDS}")

    @property
    def pods(self) -> int:
        """How many pods the workload makes."""
        return 1 if self.kind == "pod" else REPLICAS

    @property
    def workload(self) -> str:
        """The top owner's name (the same in every namespace, so PodGroup names compare)."""
        return {"pod": "solo", "volcano": "vcjob", "leaderworkerset": "lws"}.get(
            self.kind, self.kind
        )


#: The label sets the cases combine.
_QUEUE_AND_CLASS = {QUEUE_LABEL: TEAM_QUEUE, PRIORITY_LABEL: "inference"}
_NON_PREEMPTIBLE = {PREEMPTIBILITY_LABEL: "non-preemptible"}
_PREEMPTIBLE = {PREEMPTIBILITY_LABEL: "preemptible"}

_JOB_REASON = (
    "KAI v0.12.0's batch Job grouper makes one PodGroup per pod (pg-<pod>-<job uid>, minMember "
    "1, each pod its own gang) and reads no min-member annotation; ours makes one PodGroup per "
    "Job (pg-<job>-<job uid>) so that kai.scheduler/batch-min-member can make the Job one gang; "
    "minMember 1 keeps it elastic, each pod still starts on its own"
)


def _job_difference(min_member: int = 1, reason: str = _JOB_REASON) -> Difference:
    ours: dict[str, Any] = {"podgroups": 1, "name": ["pg-<job>-<job uid>"]}
    kai: dict[str, Any] = {"podgroups": REPLICAS, "name": ["pg-<pod>-<job uid>"]}
    if min_member != 1:
        ours["min_member"] = [min_member]
        kai["min_member"] = [1]
    return Difference(ours=ours, kai=kai, reason=reason)


def _volcano_difference(reason: str) -> Difference:
    return Difference(
        ours={
            "grouped": f"0/{REPLICAS}",
            "podgroups": 0,
            "name": [],
            "owner": [],
            "min_member": [],
            "queue": [],
            "priority_class": [],
            "preemptibility": [],
        },
        kai={
            "grouped": f"{REPLICAS}/{REPLICAS}",
            "podgroups": REPLICAS,
            "name": ["pg-<pod>-<pod uid>"],
            "owner": ["Pod"],
            "min_member": [1],
            "queue": ["default-queue"],
            "priority_class": ["train"],
            "preemptibility": [""],
        },
        reason=reason,
    )


_VOLCANO_REASON = (
    "a Volcano Job's pods name their Volcano PodGroup (scheduling.k8s.io/group-name, minMember "
    "= the Job's minAvailable), which our scheduler reads, so ours leaves them alone; KAI "
    "v0.12.0 has no Volcano plugin and may not read batch.volcano.sh Jobs (its ClusterRole), so "
    "it stops at the pod: one PodGroup per pod, minMember 1, the default queue and class "
    "whatever the Volcano Job's labels say, which would break the Volcano gang"
)


def _kinds_cases(kind: str, *, default_class: str) -> list[Case]:
    """The three label cases of one kind: none; queue + class labels on the owner (over a
    pod spec class); preemptibility label on the owner and a pod spec class."""
    spec_class = "build" if default_class == "train" else "train"
    label_class = "inference" if default_class == "train" else "build"
    preempt = _NON_PREEMPTIBLE if default_class == "train" else _PREEMPTIBLE
    job = kind == "job"
    return [
        Case(
            f"{kind}",
            kind,
            f"a {kind} with no labels: the default queue and class ({default_class})",
            difference=_job_difference() if job else None,
        ),
        Case(
            f"{kind}-queue-class",
            kind,
            f"queue and priorityClassName ({label_class}) labels on the {kind}; the pod spec "
            f"names {spec_class}: the label wins",
            owner_labels={QUEUE_LABEL: TEAM_QUEUE, PRIORITY_LABEL: label_class},
            pod_priority_class=spec_class,
            difference=_job_difference() if job else None,
        ),
        Case(
            f"{kind}-preempt-podclass",
            kind,
            f"{preempt[PREEMPTIBILITY_LABEL]} label on the {kind}; the pod spec names {spec_class}",
            owner_labels=dict(preempt),
            pod_priority_class=spec_class,
            difference=_job_difference() if job else None,
        ),
    ]


CASES: tuple[Case, ...] = (
    *_kinds_cases("pod", default_class="train"),
    *_kinds_cases("job", default_class="train"),
    Case(
        "job-pod-labels",
        "job",
        "queue, priorityClassName and preemptibility labels on the pod template only",
        pod_labels={QUEUE_LABEL: TEAM_QUEUE, PRIORITY_LABEL: "build", **_PREEMPTIBLE},
        difference=_job_difference(),
    ),
    Case(
        "job-min-member",
        "job",
        f"annotation {BATCH_MIN_MEMBER}: {REPLICAS} on the Job",
        owner_annotations={BATCH_MIN_MEMBER: str(REPLICAS)},
        difference=_job_difference(REPLICAS),
    ),
    Case("cronjob", "cronjob", "a CronJob's Job (kubectl create job --from), no labels"),
    Case(
        "cronjob-labels",
        "cronjob",
        "queue, priorityClassName and preemptibility labels on the CronJob itself",
        owner_labels={**_QUEUE_AND_CLASS, **_NON_PREEMPTIBLE},
        difference=Difference(
            ours={
                "queue": [TEAM_QUEUE],
                "priority_class": ["inference"],
                "preemptibility": ["non-preemptible"],
            },
            kai={"queue": ["default-queue"], "priority_class": ["train"], "preemptibility": [""]},
            reason="KAI v0.12.0's CronJob grouper reads only the Job the CronJob made (whose "
            "labels come from jobTemplate), not the CronJob; ours reads the CronJob's "
            "kai.scheduler/queue, priorityClassName and preemptibility labels after the Job's, "
            "as for any other workload",
        ),
    ),
    Case(
        "cronjob-template",
        "cronjob",
        f"labels and {BATCH_MIN_MEMBER}: {REPLICAS} on the jobTemplate; the pod spec names build",
        job_labels={**_QUEUE_AND_CLASS, **_NON_PREEMPTIBLE},
        job_annotations={BATCH_MIN_MEMBER: str(REPLICAS)},
        pod_priority_class="build",
        difference=Difference(
            ours={"min_member": [REPLICAS]},
            kai={"min_member": [1]},
            reason=f"ours reads {BATCH_MIN_MEMBER} on a CronJob's Job as on any Job; KAI v0.12.0 "
            "reads no min-member annotation (minMember 1)",
        ),
    ),
    *_kinds_cases("deployment", default_class="inference"),
    *_kinds_cases("replicaset", default_class="train"),
    *_kinds_cases("statefulset", default_class="train"),
    Case(
        "statefulset-min-member",
        "statefulset",
        f"annotation {STS_MIN_MEMBER}: {REPLICAS} on a StatefulSet with podManagementPolicy "
        "Parallel",
        owner_annotations={STS_MIN_MEMBER: str(REPLICAS)},
        difference=Difference(
            ours={"min_member": [REPLICAS]},
            kai={"min_member": [1]},
            reason=f"ours reads {STS_MIN_MEMBER} on a StatefulSet with podManagementPolicy "
            "Parallel (its pods then start together); KAI v0.12.0 groups a StatefulSet with "
            "its default rule (minMember 1) and reads no min-member annotation",
        ),
    ),
    *_kinds_cases("leaderworkerset", default_class="train"),
    Case(
        "volcano",
        "volcano",
        "a Volcano Job (minAvailable 2): its pods carry scheduling.k8s.io/group-name",
        difference=_volcano_difference(_VOLCANO_REASON),
    ),
    Case(
        "volcano-labels",
        "volcano",
        "a Volcano Job with queue, priorityClassName and preemptibility labels",
        owner_labels={**_QUEUE_AND_CLASS, **_NON_PREEMPTIBLE},
        difference=_volcano_difference(_VOLCANO_REASON),
    ),
)


def case_named(name: str) -> Case:
    """The case called ``name``."""
    for c in CASES:
        if c.name == name:
            return c
    raise KeyError(f"no case {name!r}; known: {', '.join(c.name for c in CASES)}")


# ------------------------------------------------------------------------------ manifests


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


# ------------------------------------------------------------------------------ results


def name_pattern(name: str, substitutions: Mapping[str, str]) -> str:
    """``name`` with every known object name and uid (``substitutions`` keys, whole words
    only, longest first) replaced by its placeholder: ``pg-job-7d9-<uid>`` ->
    ``pg-<pod>-<job uid>``."""
    if not substitutions:
        return name
    keys = sorted(substitutions, key=len, reverse=True)
    rx = re.compile(r"(?<![a-z0-9])(?:" + "|".join(re.escape(k) for k in keys) + r")(?![a-z0-9])")
    return rx.sub(lambda m: substitutions[m.group(0)], name)


#: Placeholders as docs/podgrouper.md writes them (``pg-<sts>-<sts uid>``).
_SHORT_KIND = {"replicaset": "rs", "statefulset": "sts", "leaderworkerset": "lws"}


def _substitutions(
    case: Case, pods: Sequence[Mapping[str, Any]], workloads: Sequence[Mapping[str, Any]]
) -> dict[str, str]:
    """Placeholders for the names and uids of the case's pods, their owners and its
    workloads; the case's top owner wins a name clash (a LeaderWorkerSet's leader
    StatefulSet has its name)."""
    subs: dict[str, str] = {}

    def add(kind: str, name: str | None, uid: str | None) -> None:
        label = _SHORT_KIND.get(kind.lower(), kind.lower())
        if name:
            subs[name] = f"<{label}>"
        if uid:
            subs[uid] = f"<{label} uid>"

    for pod in pods:
        for ref in pod["metadata"].get("ownerReferences") or []:
            add(ref.get("kind", "owner"), ref.get("name"), ref.get("uid"))
    for obj in workloads:
        add(obj.get("kind", "owner"), obj["metadata"].get("name"), obj["metadata"].get("uid"))
    for pod in pods:
        add("pod", pod["metadata"].get("name"), pod["metadata"].get("uid"))
    top_kind = {"volcano": "job", "pod": "pod"}.get(case.kind, case.kind)
    for obj in workloads:
        if obj["metadata"].get("name") == case.workload and (
            obj.get("kind", "").lower() == top_kind
        ):
            add(top_kind, case.workload, obj["metadata"].get("uid"))
    return subs


def summarize(
    pods: Mapping[str, str | None],
    podgroups: Mapping[str, Mapping[str, Any]],
    substitutions: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The compared summary of one case in one run.

    ``pods``: pod name -> the PodGroup it names (None: not grouped); ``podgroups``: name ->
    ``{"minMember", "queue", "priorityClassName", "preemptibility", "owner"}`` (owner: kind).
    Returns :data:`FIELDS`: ``grouped`` "annotated/pods", ``podgroups`` the count of distinct
    PodGroups the pods name, then the sorted distinct values over those PodGroups."""
    named = sorted({pg for pg in pods.values() if pg})
    found = [podgroups[n] for n in named if n in podgroups]

    def distinct(key: str) -> list[Any]:
        values = {pg.get(key) if pg.get(key) is not None else "" for pg in found}
        return sorted(values, key=lambda v: (isinstance(v, str), v))

    return {
        "grouped": f"{sum(1 for pg in pods.values() if pg)}/{len(pods)}",
        "podgroups": len(named),
        "name": sorted({name_pattern(n, substitutions or {}) for n in named}),
        "owner": distinct("owner"),
        "min_member": distinct("minMember"),
        "queue": distinct("queue"),
        "priority_class": distinct("priorityClassName"),
        "preemptibility": distinct("preemptibility"),
    }


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value))


def compare(case: Case, runs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The comparison of one case's runs (``runs[grouper]`` has ``summary`` and optionally
    ``error``/``missing``): the differing fields and a verdict (see the module docstring)."""
    ours, kai = runs.get("ours") or {}, runs.get("kai") or {}
    incomplete = [
        name
        for name, r in runs.items()
        if r.get("error") or r.get("missing") or r.get("summary") is None
    ] + [g for g in GROUPERS if g not in runs]
    differences: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    if incomplete:
        verdict = "incomplete"
        problems.append(f"incomplete runs: {', '.join(incomplete)}")
    else:
        o, k = ours["summary"], kai["summary"]
        differences = {f: {"ours": o[f], "kai": k[f]} for f in FIELDS if o[f] != k[f]}
        declared = case.difference
        if declared is None:
            verdict = "same" if not differences else "UNDECLARED"
            if differences:
                problems.append(f"undeclared difference in {', '.join(differences)}")
        else:
            want_ours, want_kai = _jsonable(dict(declared.ours)), _jsonable(dict(declared.kai))
            for f in sorted(set(differences) - set(want_ours)):
                problems.append(f"{f} differs but is not declared")
            for f in sorted(want_ours):
                if o[f] != want_ours[f] or k[f] != want_kai[f]:
                    problems.append(
                        f"{f}: declared ours={want_ours[f]!r} kai={want_kai[f]!r}, "
                        f"measured ours={o[f]!r} kai={k[f]!r}"
                    )
            verdict = "deliberate" if not problems else "NOT-AS-DECLARED"
    return {
        "case": case.name,
        "kind": case.kind,
        "summary": case.summary,
        "verdict": verdict,
        "differences": differences,
        "problems": problems,
        "declared_difference": (
            None
            if case.difference is None
            else {
                "ours": dict(case.difference.ours),
                "kai": dict(case.difference.kai),
                "reason": case.difference.reason,
            }
        ),
        "runs": {name: dict(r) for name, r in runs.items()},
    }


def consistent(comparisons: Iterable[Mapping[str, Any]]) -> bool:
    """True when every case agrees or differs exactly as declared."""
    return all(c["verdict"] in ("same", "deliberate") for c in comparisons)


def _cell(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) if v != "" else "-" for v in value) or "-"
    return str(value)


_HEADINGS = {"podgroups": "pgs", "min_member": "min", "priority_class": "class"}


def table(comparisons: Sequence[Mapping[str, Any]]) -> str:
    """A human table: per case and grouper, the summary (:data:`FIELDS`); then the verdict
    and, for a failure, what is wrong."""
    rows: list[tuple[str, str, list[str]]] = []
    for c in comparisons:
        for g in GROUPERS:
            s = (c["runs"].get(g) or {}).get("summary")
            cells = [_cell(s[f]) for f in FIELDS] if s else ["(no result)"] + [""] * 7
            rows.append((c["case"] if g == GROUPERS[0] else "", g, cells))
    widths = [
        max([len(_HEADINGS.get(f, f))] + [len(r[2][i]) for r in rows]) for i, f in enumerate(FIELDS)
    ]
    case_w = max([4] + [len(c["case"]) for c in comparisons])

    def line(case: str, grouper: str, cells: Sequence[str]) -> str:
        body = "  ".join(f"{v:<{w}}" for v, w in zip(cells, widths, strict=True))
        return f"{case:<{case_w}}  {grouper:<7}  {body}".rstrip()

    lines = [line("case", "grouper", [_HEADINGS.get(f, f) for f in FIELDS])]
    for i, c in enumerate(comparisons):
        for case, grouper, cells in rows[i * len(GROUPERS) : (i + 1) * len(GROUPERS)]:
            lines.append(line(case, grouper, cells))
        diff = ", ".join(c["differences"]) or "-"
        lines.append(f"{'':<{case_w}}  -> {c['verdict']} (differs in: {diff})")
        lines.extend(f"{'':<{case_w}}     ! {p}" for p in c["problems"])
    return "\n".join(lines)


# ------------------------------------------------------------------------------ running


def _log(message: str) -> None:
    print(f"[podgrouper-diff {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _kubectl_json(cp: ControlPlane, *args: str) -> dict[str, Any]:
    out = cp.kubectl(*args, "-o", "json", timeout=60).stdout
    return dict(json.loads(out)) if out.strip() else {}


class GrouperDied(RuntimeError):
    """The grouper under test exited during a run."""


@dataclass
class Grouper:
    """One grouper process ready to start: its command, the pods' schedulerName and the URL
    that answers 200 once it is up."""

    name: str
    scheduler: str
    command: peers.Command
    ready_url: str
    component: process.Component | None = None

    def start(self, log_dir: Path) -> None:
        """Start it (own process group, log in ``log_dir``)."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.command.env}
        if "KUBECONFIG" not in self.command.env:
            env.pop("KUBECONFIG", None)
        self.component = process.Component(
            self.command.name, self.command.argv, log_dir / f"{self.command.name}.log", env
        )
        self.component.start()

    @property
    def log_path(self) -> Path | None:
        """Its log file once started."""
        return self.component.log_path if self.component else None

    def check_alive(self) -> None:
        """Raise :class:`GrouperDied` when the process has exited."""
        if self.component is None or not self.component.running():
            code = self.component.exit_code() if self.component else None
            raise GrouperDied(f"{self.name} grouper exited ({code}); log {self.log_path}")

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until its probe answers 200."""
        deadline = time.monotonic() + timeout
        while not http_ok(self.ready_url):
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} grouper not ready after {timeout}s")
            time.sleep(0.3)

    def stop(self) -> None:
        """Stop it (idempotent)."""
        if self.component is not None:
            self.component.stop()


def _ours_grouper(cp: ControlPlane, log_level: str) -> Grouper:
    """Ours with our CRDs and the shipped ServiceAccount + ClusterRole (manifests/70)."""
    _apply_our_crds(cp)
    cp.kubectl("apply", "-f", str(REPO / "manifests" / "00-namespace.yaml"))
    docs = [
        d
        for d in yaml.safe_load_all((REPO / "manifests" / "70-podgrouper.yaml").read_text())
        if d and d["kind"] != "Deployment"
    ]
    peers.apply_objects(cp, docs)
    token = cp.service_account_token("kai-scheduler", "kai-podgrouper")
    kubeconfig = cp.kubeconfig_for_token(token, f"pgdiff-ours-{uuid.uuid4().hex[:6]}")
    port = peers.free_port()
    argv = [
        sys.executable, "-m", "scheduler", "podgrouper",
        f"--kube-config={kubeconfig}",
        f"--scheduler-name={OURS_SCHEDULER}",
        f"--metrics-address=127.0.0.1:{port}",
        "--log-format=json",
        f"--log-level={log_level}",
    ]  # fmt: skip
    # The grouper under test is this tree's, whatever the caller's working directory.
    command = peers.Command("ours-podgrouper", argv, {"PYTHONPATH": str(REPO)})
    return Grouper("ours", OURS_SCHEDULER, command, f"http://127.0.0.1:{port}/readyz")


def _kai_grouper(cp: ControlPlane, path: Path) -> Grouper:
    """KAI's podgrouper with KAI's CRDs and its ClusterRole (scheduler and binder not run)."""
    _apply_kai_crds(cp, path)
    kubeconfigs = peers.prepare_kai(cp, path)
    contender = peers.kai(path, kubeconfigs, unthrottled=False)
    (command,) = [c for c in contender.commands if c.name.endswith("-podgrouper")]
    probe = next(a for a in command.argv if a.startswith("--health-probe-bind-address="))
    address = probe.split("=", 1)[1]
    return Grouper("kai", contender.scheduler_name, command, f"http://{address}/readyz")


def prepare_plane(cp: ControlPlane) -> list[Any]:
    """Our CRDs, the default queues, the PriorityClasses, the cases' queue; the Volcano and
    LeaderWorkerSet CRDs, Volcano's ``default`` queue; then Volcano's job controller and the
    LWS controller (no gang provider) started. Returns the controllers (stop them after)."""
    from testenv.controllers import LwsController, VolcanoControllerManager, ensure_volcano_queue

    _apply_our_crds(cp)
    cp.kubectl("apply", "-f", str(REPO / "manifests" / "defaults"))
    cp.kubectl("apply", "-f", str(REPO / "manifests" / "60-priorityclasses.yaml"))
    queue = {
        "apiVersion": "scheduling.run.ai/v2",
        "kind": "Queue",
        "metadata": {"name": TEAM_QUEUE},
        "spec": {
            "parentQueue": "default-parent-queue",
            "resources": {
                r: {"quota": 0, "limit": -1, "overQuotaWeight": 1} for r in ("gpu", "cpu", "memory")
            },
        },
    }
    peers.apply_objects(cp, [queue])
    started: list[Any] = []
    try:
        volcano = VolcanoControllerManager(
            cp,
            scheduler_names=(OURS_SCHEDULER, "kai-reference"),
            name="pgdiff-vc-controller-manager",
        )
        volcano.start()
        started.append(volcano)
        ensure_volcano_queue(cp, "default")
        lws = LwsController(cp, gang_scheduler_provider=None, name="pgdiff-lws-manager")
        lws.start()
        started.append(lws)
    except BaseException:
        for c in reversed(started):
            c.stop()
        raise
    return started


def _wait_default_service_accounts(
    cp: ControlPlane, namespaces: Iterable[str], timeout: float = 60.0
) -> None:
    """Pods are refused until the service-account controller has made ``default``."""
    wanted = set(namespaces)
    deadline = time.monotonic() + timeout
    while True:
        out = cp.kubectl(
            "get", "serviceaccounts", "-A", "--field-selector=metadata.name=default",
            "-o", "jsonpath={range .items[*]}{.metadata.namespace}{\"\\n\"}{end}",
        ).stdout  # fmt: skip
        missing = wanted - set(out.split())
        if not missing:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"no default ServiceAccount after {timeout}s in {sorted(missing)}")
        time.sleep(0.3)


def _create(cp: ControlPlane, cases: Sequence[Case], names: RunNames) -> None:
    namespaces = [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": names.namespace(c), "labels": {LABEL_RUN: names.rid}},
        }
        for c in cases
    ]
    peers.apply_objects(cp, namespaces)
    _wait_default_service_accounts(cp, [names.namespace(c) for c in cases])
    peers.apply_objects(cp, [workload_manifest(c, names) for c in cases])
    for c in cases:
        if c.kind == "cronjob":
            cp.kubectl(
                "create", "job", CRONJOB_JOB, f"--from=cronjob/{c.workload}",
                "-n", names.namespace(c),
            )  # fmt: skip


def _enqueue_volcano(cp: ControlPlane, namespaces: set[str]) -> None:
    """Set the run's Volcano PodGroups ``Inqueue`` (what a scheduler would decide), so that
    Volcano's job controller creates the pods."""
    items = _kubectl_json(cp, "get", VOLCANO_PODGROUPS, "-A").get("items") or []
    for pg in items:
        meta = pg["metadata"]
        phase = (pg.get("status") or {}).get("phase") or ""
        if meta["namespace"] in namespaces and phase in ("", "Pending"):
            cp.kubectl(
                "patch", VOLCANO_PODGROUPS, meta["name"], "-n", meta["namespace"],
                "--type=merge", "-p", json.dumps({"status": {"phase": "Inqueue"}}),
                check=False,
            )  # fmt: skip


def _snapshot(
    cp: ControlPlane, cases: Sequence[Case], names: RunNames
) -> dict[str, dict[str, Any]]:
    """Per case: its pods (name -> PodGroup named, or None), the PodGroups in its namespace,
    and the raw pods and workloads (for the name patterns)."""
    by_ns = {names.namespace(c): c for c in cases}
    pods = _kubectl_json(cp, "get", "pods", "-A", "-l", f"{LABEL_RUN}={names.rid}")
    groups = _kubectl_json(cp, "get", PODGROUPS, "-A")
    kinds = sorted({_RESOURCE[c.kind] for c in cases if c.kind in _RESOURCE})
    workloads = (
        _kubectl_json(cp, "get", ",".join(kinds), "-A", "-l", f"{LABEL_RUN}={names.rid}")
        if kinds
        else {}
    )
    out: dict[str, dict[str, Any]] = {
        c.name: {"pods": {}, "podgroups": {}, "raw_pods": [], "workloads": []} for c in cases
    }
    for pod in pods.get("items") or []:
        meta = pod["metadata"]
        case = by_ns.get(meta["namespace"])
        if case is None or meta.get("deletionTimestamp"):
            continue
        annotations = meta.get("annotations") or {}
        out[case.name]["pods"][meta["name"]] = annotations.get(POD_GROUP_ANNOTATION)
        out[case.name]["raw_pods"].append(pod)
        if annotations.get(VOLCANO_GROUP_ANNOTATION):
            out[case.name].setdefault("volcano_group", annotations[VOLCANO_GROUP_ANNOTATION])
    for pg in groups.get("items") or []:
        meta = pg["metadata"]
        case = by_ns.get(meta["namespace"])
        if case is None:
            continue
        spec = pg.get("spec") or {}
        owners = meta.get("ownerReferences") or [{}]
        out[case.name]["podgroups"][meta["name"]] = {
            "minMember": spec.get("minMember"),
            "queue": spec.get("queue") or "",
            "priorityClassName": spec.get("priorityClassName") or "",
            "preemptibility": spec.get("preemptibility") or "",
            "owner": owners[0].get("kind", ""),
        }
    for obj in workloads.get("items") or []:
        case = by_ns.get(obj["metadata"].get("namespace", ""))
        if case is not None:
            out[case.name]["workloads"].append(obj)
    return out


def _signature(snap: Mapping[str, Mapping[str, Any]]) -> str:
    return json.dumps(
        {c: {"pods": s["pods"], "podgroups": s["podgroups"]} for c, s in snap.items()},
        sort_keys=True,
    )


def _probe(cp: ControlPlane, grouper: Grouper, names: RunNames, timeout: float = 60.0) -> float:
    """A bare pod in a namespace of its own, until the grouper has annotated it: proof that
    the grouper is up and watching. Returns the seconds it took."""
    began = time.monotonic()
    case = Case("probe", "pod", "readiness probe")
    ns = names.namespace(case)
    peers.apply_objects(
        cp,
        [
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": ns, "labels": {LABEL_RUN: names.rid}},
            }
        ],
    )
    _wait_default_service_accounts(cp, [ns])
    peers.apply_objects(cp, [workload_manifest(case, names)])
    deadline = began + timeout
    while True:
        grouper.check_alive()
        pod = _kubectl_json(cp, "get", "pod", case.workload, "-n", ns)
        if (pod.get("metadata", {}).get("annotations") or {}).get(POD_GROUP_ANNOTATION):
            return round(time.monotonic() - began, 2)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{grouper.name} grouper did not group a bare pod in {timeout}s")
        time.sleep(0.3)


def run_cases(
    cp: ControlPlane,
    grouper: Grouper,
    cases: Sequence[Case],
    log_dir: Path,
    *,
    settle: float = 3.0,
    timeout: float = 90.0,
) -> dict[str, dict[str, Any]]:
    """Start ``grouper``, create every case's workload, wait until every case has all its pods
    and nothing changed for ``settle`` seconds, stop the grouper. Per case: ``pods``,
    ``podgroups``, ``summary`` (:func:`summarize`), ``missing`` (PodGroups named but absent),
    ``unclaimed`` (PodGroups no pod names) and ``error`` (when the run did not settle)."""
    names = RunNames(f"{grouper.name[0]}{uuid.uuid4().hex[:4]}", grouper.scheduler)
    volcano_ns = {names.namespace(c) for c in cases if c.kind == "volcano"}
    began = time.monotonic()
    grouper.start(log_dir)
    error: str | None = None
    snap: dict[str, dict[str, Any]] = {}
    try:
        grouper.wait_ready()
        probe_seconds = _probe(cp, grouper, names)
        _log(f"{grouper.name}: grouper up, a bare pod grouped in {probe_seconds}s")
        _create(cp, cases, names)
        created = time.monotonic()
        last_sig, last_change = "", time.monotonic()
        while True:
            grouper.check_alive()
            if volcano_ns:
                _enqueue_volcano(cp, volcano_ns)
            snap = _snapshot(cp, cases, names)
            sig = _signature(snap)
            now = time.monotonic()
            if sig != last_sig:
                last_sig, last_change = sig, now
            short = [c.name for c in cases if len(snap[c.name]["pods"]) < c.pods]
            if not short and now - last_change >= settle:
                break
            if now - created > timeout:
                error = f"not settled after {timeout}s; cases short of pods: {short}"
                break
            time.sleep(0.5)
    except (GrouperDied, TimeoutError) as e:
        error = str(e)
    finally:
        grouper.stop()
    _log(f"{grouper.name}: {len(cases)} cases in {time.monotonic() - began:.1f}s")
    results: dict[str, dict[str, Any]] = {}
    for c in cases:
        s = snap.get(c.name) or {"pods": {}, "podgroups": {}, "raw_pods": [], "workloads": []}
        named = {pg for pg in s["pods"].values() if pg}
        subs = _substitutions(c, s["raw_pods"], s["workloads"])
        results[c.name] = {
            "namespace": names.namespace(c),
            "scheduler_name": names.scheduler,
            "pods": s["pods"],
            "podgroups": s["podgroups"],
            "volcano_group": s.get("volcano_group"),
            "summary": summarize(s["pods"], s["podgroups"], subs) if s["pods"] else None,
            "missing": sorted(named - set(s["podgroups"])),
            "unclaimed": sorted(set(s["podgroups"]) - named),
            "error": error,
            "log": str(grouper.log_path),
        }
    return results


def _delete_namespaces(cp: ControlPlane, rid_label: str | None = None) -> None:
    selector = f"{LABEL_RUN}={rid_label}" if rid_label else LABEL_RUN
    cp.kubectl("delete", "namespaces", "-l", selector, "--wait=false", check=False)


def run_diff(
    cp: ControlPlane,
    cases: Sequence[Case],
    log_dir: Path,
    *,
    groupers: Sequence[str] = GROUPERS,
    settle: float = 3.0,
    timeout: float = 90.0,
    kai_path: Path | None = None,
    ours_log_level: str = "info",
) -> list[dict[str, Any]]:
    """Every case under each grouper in turn (ours with our CRDs, then KAI with KAI's), on a
    plane :func:`prepare_plane` has prepared; the comparison per case."""
    log_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, Any]] = {c.name: {} for c in cases}
    for name in groupers:
        if name == "ours":
            grouper = _ours_grouper(cp, ours_log_level)
        elif name == "kai":
            grouper = _kai_grouper(cp, kai_path or kai_dir())
        else:
            raise ValueError(f"unknown grouper {name!r}; use {', '.join(GROUPERS)}")
        for case_name, result in run_cases(
            cp, grouper, cases, log_dir, settle=settle, timeout=timeout
        ).items():
            runs[case_name][name] = result
        # The next run has its own namespaces and schedulerName; these go meanwhile.
        _delete_namespaces(cp)
    return [compare(c, runs[c.name]) for c in cases]


def document(comparisons: Sequence[Mapping[str, Any]], **params: Any) -> dict[str, Any]:
    """The command's JSON output."""
    versions = dict(
        line.split("=", 1)
        for line in (REPO / "testenv" / "versions.env").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    return {
        "bench": "podgrouper-diff",
        "versions": versions,
        "scheduler_revision": peers.scheduler_revision(),
        **params,
        "fields": list(FIELDS),
        "cases": list(comparisons),
        "verdicts": {c["case"]: c["verdict"] for c in comparisons},
        "consistent": consistent(comparisons),
    }


# ------------------------------------------------------------------------------ CLI


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``podgrouper-diff`` subcommand."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "podgrouper-diff",
        help="the PodGroups our pod grouper and KAI-Scheduler v0.12.0's make, per workload kind",
    )
    p.add_argument(
        "--case",
        action="append",
        choices=[c.name for c in CASES],
        help="run only this case (repeatable); default: all",
    )
    p.add_argument(
        "--settle", type=float, default=3.0, help="seconds without change that end a run"
    )
    p.add_argument("--timeout", type=float, default=90.0, help="seconds for a run to settle")
    p.add_argument("--ours-log-level", default="info", choices=("debug", "info", "warning"))
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    return p


def run(args: argparse.Namespace) -> int:
    """Run the comparison, print the JSON and the table; 0 when every case is consistent."""
    cases = [case_named(n) for n in args.case] if args.case else list(CASES)
    path = kai_dir()  # build before any clock matters
    began = time.monotonic()
    with ControlPlane() as cp:
        _log(f"control plane up in {cp.startup_seconds:.1f}s; logs in {cp.log_dir}")
        controllers = prepare_plane(cp)
        try:
            comparisons = run_diff(
                cp,
                cases,
                cp.log_dir / "podgrouper-diff",
                settle=args.settle,
                timeout=args.timeout,
                kai_path=path,
                ours_log_level=args.ours_log_level,
            )
        finally:
            for c in reversed(controllers):
                with contextlib.suppress(Exception):
                    c.stop()
    doc = document(
        comparisons,
        settle_seconds=args.settle,
        seconds=round(time.monotonic() - began, 1),
        log_dir=str(cp.log_dir),
    )
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    print(table(comparisons), file=sys.stderr)
    return 0 if doc["consistent"] else 1
