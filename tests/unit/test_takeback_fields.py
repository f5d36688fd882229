"""Taking back at the edge: Queue min runtimes, PodGroup preemption delay and preemptibility
(spec, label, priority), pod preemption policy and start time, and the errors for each."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.cluster.podspec import (
    PREEMPTIBILITY_LABEL,
    PREEMPTION_DELAY_ANNOTATION,
    GangHints,
    PodSpecError,
    gang_hints,
    pod_from_k8s,
)
from scheduler.cluster.queue import QueueTree
from scheduler.cluster.queuespec import SpecError, gang_from_k8s, parse_duration, queue_from_k8s

LABEL_FIELD = f"metadata.labels[{PREEMPTIBILITY_LABEL}]"
ANNOTATION_FIELD = f"metadata.annotations[{PREEMPTION_DELAY_ANNOTATION}]"
PRIORITIES = {"train": 50, "build": 100, "inference": 125}


def queue_obj(name: str = "team-a", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": spec}


def group_obj(
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ns",
            "name": "job",
            "labels": labels or {},
            "annotations": annotations or {},
        },
        "spec": spec,
    }


def gang(obj: dict[str, Any]) -> Any:
    return gang_from_k8s(obj, default_queue="default-queue", priorities=PRIORITIES)


def pod_obj(
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    node: str | None = None,
    scheduler: str = "kai",
    status: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
        **spec,
    }
    if node:
        body["nodeName"] = node
    return {
        "metadata": {
            "namespace": "ns",
            "name": "p",
            "uid": "u1",
            "labels": labels or {},
            "annotations": annotations or {},
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": body,
        "status": status or {"phase": "Pending"},
    }


def convert(obj: dict[str, Any], *, strict: bool = False) -> Any:
    return pod_from_k8s(obj, scheduler_name="kai", default_queue="default-queue", strict=strict)


# --- durations ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [("0", 0.0), ("100ns", 1e-7), ("10us", 1e-5), ("10\u00b5s", 1e-5), ("1m0.5s", 60.5)],
)
def test_go_durations_the_crds_accept_are_read(raw: str, seconds: float) -> None:
    assert parse_duration(raw, "f") == pytest.approx(seconds)


# --- Queue: preemptMinRuntime / reclaimMinRuntime ----------------------------------------


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [("30s", 30.0), ("5m", 300.0), ("1h30m", 5400.0), ("0", 0.0), ("0s", 0.0), ("1.5h", 5400.0)],
)
@pytest.mark.parametrize("key", ["preemptMinRuntime", "reclaimMinRuntime"])
def test_queue_min_runtimes_are_seconds(key: str, raw: str, seconds: float) -> None:
    q = queue_from_k8s(queue_obj(**{key: raw}))
    attr = "preempt_min_runtime" if key == "preemptMinRuntime" else "reclaim_min_runtime"
    assert getattr(q, attr) == seconds
    other = "reclaim_min_runtime" if attr == "preempt_min_runtime" else "preempt_min_runtime"
    assert getattr(q, other) is None


@pytest.mark.parametrize("spec", [{}, {"preemptMinRuntime": None, "reclaimMinRuntime": ""}])
def test_queue_min_runtimes_absent_are_none(spec: dict[str, Any]) -> None:
    q = queue_from_k8s(queue_obj(**spec))
    assert q.preempt_min_runtime is None and q.reclaim_min_runtime is None


def test_queue_min_runtimes_both_set() -> None:
    q = queue_from_k8s(queue_obj(preemptMinRuntime="2m", reclaimMinRuntime="1h"))
    assert (q.preempt_min_runtime, q.reclaim_min_runtime) == (120.0, 3600.0)


@pytest.mark.parametrize("raw", ["ten", "-5m", "5 m", "1d", "m5", True, -3, float("inf")])
@pytest.mark.parametrize("key", ["preemptMinRuntime", "reclaimMinRuntime"])
def test_queue_min_runtime_errors_name_the_field_and_the_fix(key: str, raw: Any) -> None:
    with pytest.raises(SpecError) as err:
        queue_from_k8s(queue_obj(**{key: raw}))
    assert err.value.field == f"spec.{key}"
    assert repr(raw) in err.value.message
    assert "such as 30s, 5m or 1h30m" in err.value.message
    assert "inherit" in err.value.message


def test_parsed_min_runtimes_are_inherited_down_the_tree() -> None:
    tree = QueueTree.build(
        [
            queue_from_k8s(queue_obj("org", reclaimMinRuntime="10m", preemptMinRuntime="1m")),
            queue_from_k8s(queue_obj("dept", parentQueue="org", preemptMinRuntime="5m")),
            queue_from_k8s(queue_obj("team", parentQueue="dept")),
        ]
    )
    assert tree.min_runtime("team", "preempt") == 300.0
    assert tree.min_runtime("team", "reclaim") == 600.0
    assert tree.min_runtime("org", "preempt") == 60.0


# --- PodGroup: preemptionDelay -------------------------------------------------------------


def test_preemption_delay_from_spec_annotation_or_zero() -> None:
    assert gang(group_obj(preemptionDelay="2m")).preemption_delay_seconds == 120.0
    by_annotation = group_obj(annotations={PREEMPTION_DELAY_ANNOTATION: "45s"})
    assert gang(by_annotation).preemption_delay_seconds == 45.0
    both = group_obj(annotations={PREEMPTION_DELAY_ANNOTATION: "45s"}, preemptionDelay="10s")
    assert gang(both).preemption_delay_seconds == 10.0  # the spec wins
    assert gang(group_obj()).preemption_delay_seconds == 0.0
    assert gang(group_obj(preemptionDelay="0")).preemption_delay_seconds == 0.0


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        (group_obj(preemptionDelay="soon"), "spec.preemptionDelay"),
        (group_obj(preemptionDelay="-1s"), "spec.preemptionDelay"),
        (group_obj(preemptionDelay=-30), "spec.preemptionDelay"),
        (group_obj(annotations={PREEMPTION_DELAY_ANNOTATION: "1 hour"}), ANNOTATION_FIELD),
        # An invalid annotation is reported even when the spec overrides it.
        (
            group_obj(annotations={PREEMPTION_DELAY_ANNOTATION: "x"}, preemptionDelay="5s"),
            ANNOTATION_FIELD,
        ),
    ],
)
def test_preemption_delay_errors_name_the_field(obj: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as err:
        gang(obj)
    assert err.value.field == field
    assert "such as 30s, 5m or 1h30m" in err.value.message


# --- PodGroup: preemptibility --------------------------------------------------------------


@pytest.mark.parametrize(
    ("label", "spec", "preemptible"),
    [
        # the priority decides when neither says: below 100 is preemptible
        (None, {"priorityClassName": "train"}, True),
        (None, {"priorityClassName": "build"}, False),
        # the label beats the priority
        ("non-preemptible", {"priorityClassName": "train"}, False),
        ("preemptible", {"priorityClassName": "inference"}, True),
        # the spec beats the label
        ("preemptible", {"priorityClassName": "train", "preemptibility": "non-preemptible"}, False),
        ("non-preemptible", {"preemptibility": "preemptible"}, True),
        ("", {"priorityClassName": "inference"}, False),  # empty label: not set
    ],
)
def test_preemptibility_precedence_spec_label_priority(
    label: str | None, spec: dict[str, Any], preemptible: bool
) -> None:
    labels = {PREEMPTIBILITY_LABEL: label} if label is not None else {}
    assert gang(group_obj(labels, **spec)).preemptible is preemptible


@pytest.mark.parametrize("spec", [{}, {"preemptibility": "preemptible"}])
def test_invalid_preemptibility_label_is_an_error_naming_the_label(spec: dict[str, Any]) -> None:
    with pytest.raises(SpecError) as err:
        gang(group_obj({PREEMPTIBILITY_LABEL: "sometimes"}, **spec))
    assert err.value.field == LABEL_FIELD
    assert "'sometimes'" in err.value.message
    assert "preemptible or non-preemptible" in err.value.message


def test_invalid_spec_preemptibility_still_names_the_spec() -> None:
    with pytest.raises(SpecError) as err:
        gang(group_obj({PREEMPTIBILITY_LABEL: "preemptible"}, preemptibility="maybe"))
    assert err.value.field == "spec.preemptibility"


def test_podgroup_gang_may_preempt_by_default() -> None:
    assert gang(group_obj()).may_preempt


# --- pods: preemptionPolicy, label and annotation of implicit gangs, startTime -----------------


@pytest.mark.parametrize(
    ("policy", "may_preempt"), [(None, True), ("PreemptLowerPriority", True), ("Never", False)]
)
def test_preemption_policy_never_means_may_not_preempt(
    policy: str | None, may_preempt: bool
) -> None:
    spec = {"preemptionPolicy": policy} if policy else {}
    assert gang_hints(pod_obj(**spec)).may_preempt is may_preempt
    # ... also for a pod that names a PodGroup
    member = pod_obj(annotations={"pod-group-name": "g"}, **spec)
    assert gang_hints(member).may_preempt is may_preempt


def test_hints_of_an_implicit_gang_pod() -> None:
    obj = pod_obj(
        labels={PREEMPTIBILITY_LABEL: "non-preemptible"},
        annotations={PREEMPTION_DELAY_ANNOTATION: "1m30s"},
        preemptionPolicy="Never",
    )
    assert gang_hints(obj) == GangHints(False, "non-preemptible", 90.0)
    assert gang_hints(pod_obj()) == GangHints(True, "", None)


def test_members_of_a_podgroup_do_not_carry_label_or_annotation() -> None:
    # The PodGroup's own label and annotation apply; a member's are not read (nor checked).
    obj = pod_obj(
        labels={PREEMPTIBILITY_LABEL: "nonsense"},
        annotations={"pod-group-name": "g", PREEMPTION_DELAY_ANNOTATION: "forever"},
    )
    assert gang_hints(obj) == GangHints()
    convert(obj, strict=True)  # does not raise


@pytest.mark.parametrize(
    ("labels", "annotations", "field", "text"),
    [
        ({PREEMPTIBILITY_LABEL: "yes"}, {}, LABEL_FIELD, "preemptible or non-preemptible"),
        ({}, {PREEMPTION_DELAY_ANNOTATION: "soon"}, ANNOTATION_FIELD, "such as 30s"),
        ({}, {PREEMPTION_DELAY_ANNOTATION: "-5s"}, ANNOTATION_FIELD, "such as 30s"),
    ],
)
def test_invalid_hints_of_an_implicit_gang_pod(
    labels: dict[str, str], annotations: dict[str, str], field: str, text: str
) -> None:
    obj = pod_obj(labels=labels, annotations=annotations)
    with pytest.raises(PodSpecError) as err:
        gang_hints(obj)
    assert (err.value.field, text in err.value.message) == (field, True)
    assert gang_hints(obj, strict=False) == GangHints()  # lenient: ignored
    # A pending pod cannot be scheduled with it: the parser refuses it, naming the field.
    with pytest.raises(PodSpecError) as err:
        convert(obj)
    assert err.value.field == field
    with pytest.raises(PodSpecError):
        convert(obj, strict=True)


def test_a_bound_pod_with_an_invalid_label_still_occupies_its_node() -> None:
    obj = pod_obj(labels={PREEMPTIBILITY_LABEL: "yes"}, node="n1")
    assert convert(obj).node_name == "n1"  # lenient: kept
    with pytest.raises(PodSpecError):
        convert(obj, strict=True)  # strict (the cache): reported


def test_pods_of_other_schedulers_are_not_checked() -> None:
    obj = pod_obj(labels={PREEMPTIBILITY_LABEL: "yes"}, scheduler="default-scheduler")
    assert not convert(obj, strict=True).managed


def test_start_time_from_status() -> None:
    running = pod_obj(node="n1", status={"phase": "Running", "startTime": "2026-01-01T00:10:00Z"})
    pod = convert(running)
    assert pod.start_time == pod.creation_time + 600 == pod.started
    pending = convert(pod_obj())
    assert pending.start_time == 0.0 and pending.started == pending.creation_time
    garbled = convert(pod_obj(status={"phase": "Running", "startTime": "yesterday"}))
    assert garbled.start_time == 0.0


def test_start_time_before_the_kubelet_reports_it_is_the_bind_time() -> None:
    scheduled = {"type": "PodScheduled", "status": "True"}
    bound = pod_obj(
        node="n1",
        status={
            "phase": "Pending",
            "conditions": [
                {"type": "Ready", "status": "False", "lastTransitionTime": "2026-01-01T00:00:01Z"},
                {**scheduled, "lastTransitionTime": "2026-01-01T00:05:00Z"},
            ],
        },
    )
    pod = convert(bound)
    assert pod.start_time == pod.creation_time + 300
    # status.startTime wins once set
    bound["status"]["startTime"] = "2026-01-01T00:06:00Z"
    assert convert(bound).start_time == pod.creation_time + 360
    # an unschedulable pod's PodScheduled=False is no bind time
    waiting = pod_obj(
        status={
            "phase": "Pending",
            "conditions": [
                {**scheduled, "status": "False", "lastTransitionTime": "2026-01-01T00:05:00Z"}
            ],
        }
    )
    assert convert(waiting).start_time == 0.0
