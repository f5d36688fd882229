"""The pod grouper's rules per workload kind: pure functions of (pod, owner chain).

Names and minMember follow KAI-Scheduler's pod grouper (pg-<name>-<uid>; a Deployment gets
one PodGroup per pod, a batch Job one per Job with kai.scheduler/batch-min-member, a
LeaderWorkerSet one per group)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from scheduler.podgrouper.groupers import GroupingContext, group_pod, podgroup_name
from scheduler.podgrouper.keys import (
    MIN_MEMBER_ANNOTATION,
    POD_GROUP_ANNOTATION,
    SKIP_KEY,
    TOP_OWNER_ANNOTATION,
)
from scheduler.podgrouper.owners import ObjectInfo, OwnerRef, controller_ref, skip_requested
from tests.unit.podgrouper_objects import job, obj, pod

# ---------------------------------------------------------------- kinds


def test_bare_pod_is_its_own_workload() -> None:
    p = pod("solo", labels={"kai.scheduler/queue": "team-a"})
    g = group_pod(p, [])
    assert g.name == "pg-solo-uid-solo"
    assert g.owner == OwnerRef("v1", "Pod", "solo", "uid-solo")
    assert (g.min_member, g.queue, g.default_priority_class) == (1, "team-a", "train")
    assert g.rule == "default"


def test_job_without_annotation_is_elastic() -> None:
    j = job(spec={"parallelism": 3})
    g = group_pod(pod(owner=j), [j])
    assert g.name == "pg-train-uid-train"
    assert g.owner.kind == "Job" and g.owner.uid == "uid-train"
    assert g.min_member == 1
    assert g.default_priority_class == "train"
    assert g.issues == ()


def test_job_batch_min_member_sets_min_member() -> None:
    j = job(annotations={MIN_MEMBER_ANNOTATION: "3"}, spec={"parallelism": 3})
    pods = [pod(f"train-{i}", owner=j) for i in range(3)]
    groupings = [group_pod(p, [j]) for p in pods]
    assert {g.name for g in groupings} == {"pg-train-uid-train"}, "one PodGroup per Job"
    assert {g.min_member for g in groupings} == {3}


@pytest.mark.parametrize("raw", ["0", "-2", "three", "", "1.5"])
def test_job_bad_min_member_falls_back_to_one_with_an_issue(raw: str) -> None:
    j = job(annotations={MIN_MEMBER_ANNOTATION: raw})
    g = group_pod(pod(owner=j), [j])
    assert g.min_member == 1
    (issue,) = g.issues
    assert issue.reason == "InvalidMinMember"
    assert MIN_MEMBER_ANNOTATION in issue.message and "Job/train" in issue.message


def test_job_min_member_above_parallelism_is_told() -> None:
    j = job(annotations={MIN_MEMBER_ANNOTATION: "5"}, spec={"parallelism": 3})
    g = group_pod(pod(owner=j), [j])
    assert g.min_member == 5
    assert [i.reason for i in g.issues] == ["MinMemberAboveParallelism"]


def test_cronjob_groups_per_job_and_reads_the_cronjob_labels() -> None:
    cron = obj(
        "CronJob",
        "nightly",
        api_version="batch/v1",
        labels={"kai.scheduler/queue": "batch"},
    )
    j = job("nightly-2901", owner=cron, annotations={MIN_MEMBER_ANNOTATION: "2"})
    g = group_pod(pod(owner=j), [j, cron])
    assert g.name == "pg-nightly-2901-uid-nightly-2901"
    assert g.owner.kind == "Job" and g.owner.name == "nightly-2901"
    assert g.workload.kind == "Job"
    assert g.queue == "batch" and "CronJob/nightly" in g.queue_source
    assert g.min_member == 2
    assert g.rule == "cronjob"


def test_deployment_gets_one_podgroup_per_pod_owned_by_the_pod_and_inference() -> None:
    d = obj(
        "Deployment",
        "serve",
        api_version="apps/v1",
        labels={"kai.scheduler/queue": "prod", "app": "serve"},
    )
    rs = obj("ReplicaSet", "serve-7d9", api_version="apps/v1", owner=d)
    p1, p2 = pod("serve-7d9-a", owner=rs), pod("serve-7d9-b", owner=rs)
    g1, g2 = group_pod(p1, [rs, d]), group_pod(p2, [rs, d])
    assert g1.name == "pg-serve-7d9-a-uid-serve-7d9-a" != g2.name
    assert g1.owner == OwnerRef("v1", "Pod", "serve-7d9-a", "uid-serve-7d9-a")
    assert g1.default_priority_class == "inference"
    assert g1.queue == "prod"
    assert g1.labels == {"kai.scheduler/queue": "prod", "app": "serve"}, "the Deployment's"
    meta = yaml.safe_load(g1.annotations[TOP_OWNER_ANNOTATION])
    assert meta == {
        "name": "serve",
        "uid": "uid-serve",
        "group": "apps",
        "version": "v1",
        "kind": "Deployment",
    }


def test_bare_replicaset_is_one_podgroup_with_train() -> None:
    rs = obj("ReplicaSet", "rs", api_version="apps/v1")
    g = group_pod(pod(owner=rs), [rs])
    assert (g.name, g.owner.kind, g.min_member) == ("pg-rs-uid-rs", "ReplicaSet", 1)
    assert g.default_priority_class == "train"


def test_statefulset_min_member_needs_parallel() -> None:
    parallel = obj(
        "StatefulSet",
        "db",
        api_version="apps/v1",
        annotations={"kai.scheduler/min-member": "3"},
        spec={"podManagementPolicy": "Parallel"},
    )
    g = group_pod(pod(owner=parallel), [parallel])
    assert (g.name, g.min_member, g.issues) == ("pg-db-uid-db", 3, ())
    ordered = obj(
        "StatefulSet",
        "db",
        api_version="apps/v1",
        annotations={"kai.scheduler/min-member": "3"},
    )
    g = group_pod(pod(owner=ordered), [ordered])
    assert g.min_member == 1
    assert [i.reason for i in g.issues] == ["MinMemberNeedsParallel"]
    assert "podManagementPolicy: Parallel" in g.issues[0].message


def _lws(**spec: Any) -> ObjectInfo:
    return obj(
        "LeaderWorkerSet",
        "llm",
        api_version="leaderworkerset.x-k8s.io/v1",
        spec={"leaderWorkerTemplate": {"size": 4}, **spec},
    )


def _lws_pod(name: str, group: int, worker: int, owner: ObjectInfo, **spec: Any) -> ObjectInfo:
    return pod(
        name,
        owner=owner,
        labels={
            "leaderworkerset.sigs.k8s.io/name": "llm",
            "leaderworkerset.sigs.k8s.io/group-index": str(group),
            "leaderworkerset.sigs.k8s.io/worker-index": str(worker),
        },
        annotations={"leaderworkerset.sigs.k8s.io/size": "4"},
        spec=spec,
    )


def test_leaderworkerset_one_podgroup_per_group_min_member_size() -> None:
    lws = _lws()
    leader_sts = obj("StatefulSet", "llm", api_version="apps/v1", owner=lws)
    leader = _lws_pod("llm-1", 1, 0, leader_sts)
    worker_sts = obj("StatefulSet", "llm-1", api_version="apps/v1", owner=leader)
    worker = _lws_pod("llm-1-2", 1, 2, worker_sts)
    other_leader = _lws_pod("llm-0", 0, 0, leader_sts)
    g_leader = group_pod(leader, [leader_sts, lws])
    g_worker = group_pod(worker, [worker_sts, leader, leader_sts, lws])
    g_other = group_pod(other_leader, [leader_sts, lws])
    assert g_leader.name == g_worker.name == "pg-llm-uid-llm-group-1"
    assert g_other.name == "pg-llm-uid-llm-group-0"
    assert g_leader.owner.kind == "LeaderWorkerSet"
    assert g_leader.min_member == g_worker.min_member == 4
    assert g_leader.rule == "leaderworkerset"


def test_leaderworkerset_leader_ready_starts_the_leader_alone() -> None:
    lws = _lws(startupPolicy="LeaderReady")
    sts = obj("StatefulSet", "llm", api_version="apps/v1", owner=lws)
    pending_leader = _lws_pod("llm-0", 0, 0, sts)
    assert group_pod(pending_leader, [sts, lws]).min_member == 1
    bound_leader = _lws_pod("llm-0", 0, 0, sts, nodeName="n1")
    assert group_pod(bound_leader, [sts, lws]).min_member == 4
    worker = _lws_pod("llm-0-1", 0, 1, sts)
    assert group_pod(worker, [sts, lws]).min_member == 4


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ({"leaderWorkerTemplate": {"size": 0}}, "InvalidGroupSize"),
        ({"leaderWorkerTemplate": {"size": "x"}}, "InvalidGroupSize"),
        ({"startupPolicy": "Whenever"}, "UnknownStartupPolicy"),
    ],
)
def test_leaderworkerset_bad_spec_is_an_issue_not_a_failure(
    spec: dict[str, Any], reason: str
) -> None:
    lws = obj(
        "LeaderWorkerSet",
        "llm",
        api_version="leaderworkerset.x-k8s.io/v1",
        spec={"leaderWorkerTemplate": {"size": 2}, **spec},
    )
    sts = obj("StatefulSet", "llm", api_version="apps/v1", owner=lws)
    g = group_pod(_lws_pod("llm-0", 0, 0, sts), [sts, lws])
    assert reason in [i.reason for i in g.issues]
    assert g.min_member >= 1


def test_unknown_top_owner_kind_uses_the_default_rule() -> None:
    top = obj("RayCluster", "ray", api_version="ray.io/v1")
    g = group_pod(pod(owner=top), [top])
    assert (g.name, g.owner.kind, g.min_member, g.rule) == (
        "pg-ray-uid-ray",
        "RayCluster",
        1,
        "default",
    )


# ---------------------------------------------------------------- shared fields


def test_queue_from_workload_then_pod_then_default() -> None:
    j = job(labels={"kai.scheduler/queue": "from-job"})
    p = pod(owner=j, labels={"kai.scheduler/queue": "from-pod"})
    assert group_pod(p, [j]).queue == "from-job"
    j = job()
    g = group_pod(p, [j])
    assert g.queue == "from-pod" and "Pod/p-0" in g.queue_source
    g = group_pod(pod(owner=j), [j], GroupingContext(default_queue="fallback"))
    assert (g.queue, g.queue_source) == ("fallback", "the default queue")


def test_priority_class_label_on_workload_then_pod_then_spec() -> None:
    j = job(labels={"priorityClassName": "build"})
    p = pod(owner=j, labels={"priorityClassName": "inference"}, spec={"priorityClassName": "x"})
    g = group_pod(p, [j])
    assert (g.requested_priority_class, g.requested_from) == (
        "build",
        "label priorityClassName on Job/train",
    )
    g = group_pod(p, [job()])
    assert g.requested_priority_class == "inference"
    g = group_pod(pod(owner=job(), spec={"priorityClassName": "x"}), [job()])
    assert g.requested_priority_class == "x" and "spec.priorityClassName" in g.requested_from
    assert group_pod(pod(owner=job()), [job()]).requested_priority_class == ""


def test_preemptibility_label_passes_through_and_a_bad_one_is_an_issue() -> None:
    j = job(labels={"kai.scheduler/preemptibility": "non-preemptible"})
    assert group_pod(pod(owner=j), [j]).preemptibility == "non-preemptible"
    p = pod(owner=job(), labels={"kai.scheduler/preemptibility": "Preemptible"})
    assert group_pod(p, [job()]).preemptibility == "preemptible"
    j = job(labels={"kai.scheduler/preemptibility": "sometimes"})
    g = group_pod(pod(owner=j), [j])
    assert g.preemptibility == ""
    assert [i.reason for i in g.issues] == ["InvalidPreemptibility"]


def test_workload_annotations_are_copied_but_not_kubectl_or_gang_ones() -> None:
    j = job(
        annotations={
            "team": "nlp",
            "kubectl.kubernetes.io/last-applied-configuration": "{...}",
            POD_GROUP_ANNOTATION: "x",
            "kai.scheduler/topology": "dc",
            "kai.scheduler/topology-required-placement": "rack",
        }
    )
    g = group_pod(pod(owner=j), [j])
    assert g.annotations["team"] == "nlp"
    assert "kubectl.kubernetes.io/last-applied-configuration" not in g.annotations
    assert POD_GROUP_ANNOTATION not in g.annotations
    assert TOP_OWNER_ANNOTATION in g.annotations
    assert g.topology == {"topology": "dc", "requiredTopologyLevel": "rack"}


def test_long_names_are_shortened_to_what_the_api_accepts() -> None:
    name = "a" * 250
    got = podgroup_name(name, "0123-abcd")
    assert len(got) <= 253 and got.startswith("pg-aaa") and got.endswith("-0123-abcd")
    assert podgroup_name("short", "u") == "pg-short-u"


# ---------------------------------------------------------------- owners


def test_controller_reference_is_followed_first() -> None:
    raw = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "1"},
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": "j",
                    "uid": "2",
                    "controller": True,
                },
            ],
        },
    }
    ref = controller_ref(ObjectInfo.from_k8s(raw))
    assert ref is not None and ref.kind == "Job"
    raw["metadata"]["ownerReferences"][1]["controller"] = False
    ref = controller_ref(ObjectInfo.from_k8s(raw))
    assert ref is not None and ref.kind == "ConfigMap", "else the first (as KAI)"
    assert controller_ref(pod()) is None


def test_skip_is_read_from_the_pod_and_every_owner() -> None:
    assert skip_requested(pod(annotations={SKIP_KEY: "true"})) is not None
    assert skip_requested(pod(labels={SKIP_KEY: "True"})) is not None
    assert skip_requested(pod(annotations={SKIP_KEY: "false"})) is None
    j = job(annotations={SKIP_KEY: "true"})
    rs = obj("ReplicaSet", "rs", api_version="apps/v1")
    found = skip_requested(pod(owner=rs), [rs, j])
    assert found is not None and found.kind == "Job"
