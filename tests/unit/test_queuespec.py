"""Queue and PodGroup objects to domain types: units, -1, errors naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.cluster.queue import UNLIMITED, QueueResource
from scheduler.cluster.queuespec import SpecError, gang_from_k8s, parse_duration, queue_from_k8s


def queue_obj(resources: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "team-a", "creationTimestamp": "2024-01-01T00:00:00Z"},
        "spec": {"resources": resources or {}, **spec},
    }


def group_obj(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "job"}, "spec": spec}


PRIORITIES = {"train": 50, "build": 100, "inference": 125}


@pytest.mark.parametrize(
    ("resource", "raw", "expected"),
    [
        ("gpu", {"quota": 0.5}, QueueResource(500, 1, UNLIMITED)),
        ("gpu", {"quota": 2, "limit": 4, "overQuotaWeight": 3}, QueueResource(2000, 3, 4000)),
        ("gpu", {"quota": -1, "limit": -1}, QueueResource(UNLIMITED, 1, UNLIMITED)),
        ("cpu", {"quota": 8000, "limit": "16000"}, QueueResource(8000, 1, 16000)),
        ("memory", {"quota": 1024}, QueueResource(1024 * 10**6, 1, UNLIMITED)),
        ("memory", {"quota": "0.5"}, QueueResource(500_000, 1, UNLIMITED)),
        ("gpu", {"quota": -1, "limit": 2}, QueueResource(UNLIMITED, 1, 2000)),
        ("gpu", {"overQuotaWeight": 0}, QueueResource(0, 0, UNLIMITED)),
        ("gpu", {"overQuotaWeight": 0.5}, QueueResource(0, 1, UNLIMITED)),  # rounded up
    ],
)
def test_queue_units(resource: str, raw: dict[str, Any], expected: QueueResource) -> None:
    q = queue_from_k8s(queue_obj({resource: raw}))
    assert q.resource(resource) == expected
    assert dict(q.resources) == {resource: expected}


def test_resources_must_be_an_object() -> None:
    obj = queue_obj()
    obj["spec"]["resources"] = ["gpu"]
    with pytest.raises(SpecError) as err:
        queue_from_k8s(obj)
    assert err.value.field == "spec.resources"


def test_queue_fields_and_defaults() -> None:
    q = queue_from_k8s(queue_obj(parentQueue="dept", priority=7, displayName="A"))
    assert (q.name, q.parent, q.priority, q.display_name) == ("team-a", "dept", 7, "A")
    assert q.creation_time == 1704067200.0
    assert q.resource("gpu") == QueueResource()  # omitted: no quota, weight 1, unlimited
    assert queue_from_k8s(queue_obj()).priority == 100


@pytest.mark.parametrize(
    ("resources", "spec", "field", "text"),
    [
        ({"gpu": {"quota": 4, "limit": 2}}, {}, "spec.resources.gpu.limit", "below quota"),
        ({"gpu": {"quota": "four"}}, {}, "spec.resources.gpu.quota", "not a number"),
        ({"cpu": {"limit": -5}}, {}, "spec.resources.cpu.limit", "use -1 for unlimited"),
        ({"memory": {"overQuotaWeight": "x"}}, {}, "spec.resources.memory.overQuotaWeight", ""),
        ({"memory": {"overQuotaWeight": -1}}, {}, "spec.resources.memory.overQuotaWeight", ""),
        ({"gpu": 4}, {}, "spec.resources.gpu", "must be an object"),
        ({}, {"priority": "high"}, "spec.priority", "whole number"),
        ({}, {"priority": True}, "spec.priority", "whole number"),
    ],
)
def test_queue_errors_name_the_field(
    resources: dict[str, Any], spec: dict[str, Any], field: str, text: str
) -> None:
    with pytest.raises(SpecError) as err:
        queue_from_k8s(queue_obj(resources, **spec))
    assert err.value.field == field
    assert text in err.value.message


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [
        ("60s", 60),
        ("5m", 300),
        ("1h30m", 5400),
        ("500ms", 0.5),
        ("1.5h", 5400),
        (90, 90),
        (2.5, 2.5),
        ("0s", 0),
    ],
)
def test_parse_duration(raw: Any, seconds: float) -> None:
    assert parse_duration(raw, "f") == seconds


@pytest.mark.parametrize("raw", ["", "1d", "5 m", "m5", "-1s", "1h 30m", "abc", True])
def test_parse_duration_errors(raw: Any) -> None:
    with pytest.raises(SpecError) as err:
        parse_duration(raw, "spec.stalenessGracePeriod")
    assert err.value.field == "spec.stalenessGracePeriod"


def test_gang_from_k8s() -> None:
    g = gang_from_k8s(
        group_obj(
            minMember=4, queue="team-a", priorityClassName="train", stalenessGracePeriod="2m"
        ),
        default_queue="default",
        priorities=PRIORITIES,
    )
    assert (g.key, g.min_member, g.queue, g.priority) == ("ns/job", 4, "team-a", 50)
    assert g.preemptible and g.staleness_grace_seconds == 120
    default = gang_from_k8s(group_obj(), default_queue="default", priorities=PRIORITIES)
    assert default.queue == "default" and default.min_member == 1
    assert default.staleness_grace_seconds == 60


@pytest.mark.parametrize(
    ("spec", "preemptible"),
    [
        ({"priorityClassName": "train"}, True),
        ({"priorityClassName": "build"}, False),
        ({"priorityClassName": "inference"}, False),
        ({"priorityClassName": "inference", "preemptibility": "preemptible"}, True),
        ({"priorityClassName": "train", "preemptibility": "non-preemptible"}, False),
    ],
)
def test_gang_preemptibility(spec: dict[str, Any], preemptible: bool) -> None:
    g = gang_from_k8s(group_obj(**spec), default_queue="d", priorities=PRIORITIES)
    assert g.preemptible is preemptible


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"minMember": -1}, "spec.minMember"),
        ({"minMember": "4"}, "spec.minMember"),
        ({"preemptibility": "sometimes"}, "spec.preemptibility"),
        ({"priorityClassName": "nope"}, "spec.priorityClassName"),
        ({"stalenessGracePeriod": "soon"}, "spec.stalenessGracePeriod"),
    ],
)
def test_gang_errors_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as err:
        gang_from_k8s(group_obj(**spec), default_queue="d", priorities=PRIORITIES)
    assert err.value.field == field
