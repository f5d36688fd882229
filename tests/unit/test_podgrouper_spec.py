"""The PodGroup the grouper writes, and which of its fields it owns (pure functions)."""

from __future__ import annotations

from typing import Any

from scheduler.podgrouper.groupers import group_pod
from scheduler.podgrouper.keys import MIN_MEMBER_ANNOTATION
from scheduler.podgrouper.spec import (
    choose_priority_class,
    desired_podgroup,
    spec_drift,
    update_patch,
)
from tests.unit.podgrouper_objects import job, pod


def _grouping(**job_kw: Any) -> Any:
    j = job(**job_kw)
    return group_pod(pod(owner=j), [j])


def test_desired_podgroup_is_owned_by_the_workload_without_blocking_its_deletion() -> None:
    g = _grouping(
        annotations={MIN_MEMBER_ANNOTATION: "3"},
        labels={"kai.scheduler/queue": "team-a", "kai.scheduler/preemptibility": "preemptible"},
    )
    pg = desired_podgroup(g, "train")
    assert pg["apiVersion"] == "scheduling.run.ai/v2alpha2" and pg["kind"] == "PodGroup"
    assert pg["metadata"]["name"] == "pg-train-uid-train"
    assert pg["metadata"]["namespace"] == "team"
    assert pg["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": "train",
            "uid": "uid-train",
            "blockOwnerDeletion": False,
        }
    ]
    assert pg["spec"] == {
        "minMember": 3,
        "queue": "team-a",
        "priorityClassName": "train",
        "preemptibility": "preemptible",
    }


def test_no_priority_class_and_no_preemptibility_leave_the_fields_out() -> None:
    pg = desired_podgroup(_grouping(), "")
    assert pg["spec"] == {"minMember": 1, "queue": "default-queue"}


def test_priority_class_asked_for_and_existing_is_used() -> None:
    g = _grouping(labels={"priorityClassName": "build"})
    assert choose_priority_class(g, lambda n: True) == ("build", ())


def test_missing_priority_class_falls_back_to_the_kind_default_with_an_issue() -> None:
    g = _grouping(labels={"priorityClassName": "gold"})
    name, issues = choose_priority_class(g, lambda n: n != "gold")
    assert name == "train"
    (issue,) = issues
    assert issue.reason == "PriorityClassNotFound"
    assert "'gold'" in issue.message and "label priorityClassName on Job/train" in issue.message


def test_missing_default_is_left_out_so_the_pods_priority_counts() -> None:
    g = _grouping(labels={"priorityClassName": "gold"})
    name, issues = choose_priority_class(g, lambda n: False)
    assert name == ""
    assert "does not exist either" in issues[0].message
    assert choose_priority_class(_grouping(), lambda n: False) == ("", ())


def test_unknown_existence_trusts_the_name() -> None:
    g = _grouping(labels={"priorityClassName": "gold"})
    assert choose_priority_class(g, lambda n: None) == ("gold", ())


def _on_cluster(desired: dict[str, Any], **spec: Any) -> dict[str, Any]:
    current = {
        "metadata": {
            **desired["metadata"],
            "resourceVersion": "7",
            "labels": {**desired["metadata"]["labels"], "added-by-user": "yes"},
        },
        "spec": {**desired["spec"], **spec},
        "status": {"phase": "Running"},
    }
    return current


def test_in_sync_podgroup_needs_no_patch_even_with_user_fields() -> None:
    desired = desired_podgroup(_grouping(), "train")
    current = _on_cluster(desired, markUnschedulable=True, stalenessGracePeriod="5m")
    assert spec_drift(current, desired) == ()
    assert update_patch(current, desired) is None


def test_owned_spec_fields_drift_and_are_patched_back() -> None:
    desired = desired_podgroup(_grouping(annotations={MIN_MEMBER_ANNOTATION: "3"}), "train")
    current = _on_cluster(desired, minMember=5, priorityClassName="build", preemptionDelay="1m")
    drift = spec_drift(current, desired)
    assert [(d.field, d.current, d.desired) for d in drift] == [
        ("spec.minMember", 5, 3),
        ("spec.priorityClassName", "build", "train"),
    ]
    assert drift[0].describe() == "spec.minMember is 5 (the workload says 3)"
    assert update_patch(current, desired) == {
        "spec": {"minMember": 3, "priorityClassName": "train"}
    }


def test_queue_is_the_users_once_the_podgroup_exists() -> None:
    desired = desired_podgroup(_grouping(labels={"kai.scheduler/queue": "a"}), "train")
    current = _on_cluster(desired, queue="moved-by-admin")
    assert spec_drift(current, desired) == ()
    assert update_patch(current, desired) is None


def test_labels_and_annotations_patch_only_the_copied_keys() -> None:
    desired = desired_podgroup(_grouping(labels={"team": "nlp"}), "train")
    current = _on_cluster(desired)
    current["metadata"]["labels"]["team"] = "cv"
    patch = update_patch(current, desired)
    assert patch == {"metadata": {"labels": {"team": "nlp"}}}
