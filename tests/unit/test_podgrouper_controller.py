"""The pod grouper's controller, driven the way the kopf handlers drive it (pod and PodGroup
watch events), over an in-memory API: per kind, and what happens on bad input - an owner
deleted midway, a PodGroup edited by a user, a label naming a missing queue, failing requests.
Each case must end with a clear Event and nothing stuck."""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import Mapping
from typing import Any

import pytest

from scheduler.k8s.errors import Conflict, Forbidden, KubeError, NotFound, TemporaryError
from scheduler.k8s.resources import PRIORITY_CLASS, QUEUE, ResourceKind
from scheduler.k8s.writer import ObjectRef
from scheduler.podgrouper.api import OwnerGone
from scheduler.podgrouper.controller import PodGrouper
from scheduler.podgrouper.keys import MIN_MEMBER_ANNOTATION, POD_GROUP_ANNOTATION, SKIP_KEY
from scheduler.podgrouper.owners import ObjectInfo, controller_ref
from scheduler.podgrouper.settings import GrouperSettings
from tests.unit.podgrouper_objects import NS, obj, raw

JOB = "pg-train-uid-train"


class FakeApi:
    """An in-memory API server for the grouper: objects, PodGroups, pods, Events.

    ``fail[method]`` is a list of errors raised by the next calls of that method."""

    def __init__(self) -> None:
        self.owners: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.podgroups: dict[str, dict[str, Any]] = {}
        self.queues = {"default-queue", "team-a"}
        self.classes = {"train", "inference", "build"}
        self.events: list[tuple[str, str, str, str]] = []
        self.fail: dict[str, list[KubeError]] = {}
        self.calls: list[str] = []
        self.fresh_reads = 0
        self._rv = itertools.count(1)

    def _call(self, method: str) -> None:
        self.calls.append(method)
        errors = self.fail.get(method)
        if errors:
            raise errors.pop(0)

    def add(self, obj_raw: dict[str, Any]) -> ObjectInfo:
        """Store an owner (or a pod) and return it parsed."""
        info = ObjectInfo.from_k8s(obj_raw)
        if info.kind == "Pod":
            self.pods[info.name] = copy.deepcopy(obj_raw)
        else:
            self.owners[(info.kind, info.name)] = obj_raw
        return info

    async def owner_chain(self, pod: ObjectInfo, *, fresh: bool = False) -> list[ObjectInfo]:
        self._call("owner_chain")
        self.fresh_reads += fresh
        chain: list[ObjectInfo] = []
        current = pod
        while (ref := controller_ref(current)) is not None:
            found = self.owners.get((ref.kind, ref.name))
            if found is None and ref.kind == "Pod" and ref.name in self.pods:
                found = self.pods[ref.name]
            if found is None:
                raise OwnerGone(ref, "no longer exists")
            current = ObjectInfo.from_k8s(found)
            chain.append(current)
        return chain

    async def exists(self, kind: ResourceKind, name: str) -> bool | None:
        self._call("exists")
        if kind is QUEUE:
            return name in self.queues
        if kind is PRIORITY_CLASS:
            return name in self.classes
        return None

    async def get_podgroup(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._call("get_podgroup")
        found = self.podgroups.get(name)
        return copy.deepcopy(found) if found else None

    async def create_podgroup(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self._call("create_podgroup")
        name = body["metadata"]["name"]
        if name in self.podgroups:
            raise Conflict("exists", status=409, reason="AlreadyExists")
        made = copy.deepcopy(dict(body))
        made["metadata"]["uid"] = f"pg-uid-{name}"
        made["metadata"]["resourceVersion"] = str(next(self._rv))
        self.podgroups[name] = made
        return copy.deepcopy(made)

    async def patch_podgroup(
        self, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any]:
        self._call("patch_podgroup")
        if name not in self.podgroups:
            raise NotFound("gone", status=404, reason="NotFound")
        pg = self.podgroups[name]
        pg["spec"].update(patch.get("spec", {}))
        for key in ("labels", "annotations"):
            pg["metadata"].setdefault(key, {}).update(patch.get("metadata", {}).get(key, {}))
        pg["metadata"]["resourceVersion"] = str(next(self._rv))
        return copy.deepcopy(pg)

    def user_edit(self, name: str, **spec: Any) -> dict[str, Any]:
        """Someone else changes the PodGroup; returns it as the watch shows it."""
        pg = self.podgroups[name]
        pg["spec"].update(spec)
        pg["metadata"]["resourceVersion"] = str(next(self._rv))
        return copy.deepcopy(pg)

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._call("get_pod")
        found = self.pods.get(name)
        return copy.deepcopy(found) if found else None

    async def annotate_pod(
        self, namespace: str, name: str, uid: str, annotations: Mapping[str, str]
    ) -> bool:
        self._call("annotate_pod")
        found = self.pods.get(name)
        if found is None or found["metadata"]["uid"] != uid:
            return False
        found["metadata"].setdefault("annotations", {}).update(annotations)
        return True

    async def event(self, ref: ObjectRef, reason: str, message: str, *, warning: bool) -> bool:
        self.events.append(
            (f"{ref.kind}/{ref.name}", reason, message, "Warning" if warning else "Normal")
        )
        return True

    def reasons(self) -> list[str]:
        return [e[1] for e in self.events]


async def _no_sleep(_: float) -> None:
    await asyncio.sleep(0)


def _grouper(api: FakeApi, **settings: Any) -> PodGrouper:
    return PodGrouper(api, GrouperSettings(**settings), sleep=_no_sleep)


async def _drain(grouper: PodGrouper) -> None:
    for _ in range(200):
        if not grouper.retrying:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"retries still pending: {sorted(grouper.retrying)}")


def _job(api: FakeApi, *, min_member: str | None = None, **kw: Any) -> ObjectInfo:
    annotations = dict(kw.pop("annotations", {}))
    if min_member:
        annotations[MIN_MEMBER_ANNOTATION] = min_member
    return api.add(raw("Job", "train", api_version="batch/v1", annotations=annotations, **kw))


def _pod(api: FakeApi, name: str, owner: ObjectInfo | None = None, **kw: Any) -> dict[str, Any]:
    spec = {"schedulerName": "kai-scheduler", **kw.pop("spec", {})}
    body = raw("Pod", name, owner=owner, spec=spec, **kw)
    api.add(body)
    return body


# ---------------------------------------------------------------- grouping per kind


async def test_job_pods_get_one_podgroup_and_the_annotation() -> None:
    api = FakeApi()
    job = _job(api, min_member="3", labels={"kai.scheduler/queue": "team-a"})
    grouper = _grouper(api)
    bodies = [_pod(api, f"train-{i}", job) for i in range(3)]
    results = await asyncio.gather(*(grouper.on_pod_event(None, b) for b in bodies))
    assert {r.action for r in results} == {"grouped"}
    assert list(api.podgroups) == [JOB]
    pg = api.podgroups[JOB]
    assert pg["spec"] == {"minMember": 3, "queue": "team-a", "priorityClassName": "train"}
    assert pg["metadata"]["ownerReferences"][0]["uid"] == "uid-train"
    for i in range(3):
        assert api.pods[f"train-{i}"]["metadata"]["annotations"][POD_GROUP_ANNOTATION] == JOB
    assert api.calls.count("create_podgroup") == 1, "concurrent pods share one create"
    assert api.events == []


async def test_deployment_pod_gets_its_own_podgroup_with_inference() -> None:
    api = FakeApi()
    deploy = api.add(raw("Deployment", "serve", api_version="apps/v1"))
    rs = api.add(raw("ReplicaSet", "serve-1", api_version="apps/v1", owner=deploy))
    body = _pod(api, "serve-1-x", rs)
    result = await _grouper(api).on_pod_event(None, body)
    assert result.podgroup == "pg-serve-1-x-uid-serve-1-x"
    pg = api.podgroups[result.podgroup]
    assert pg["spec"]["priorityClassName"] == "inference"
    assert pg["metadata"]["ownerReferences"][0]["kind"] == "Pod"


async def test_bare_pod_is_grouped_alone() -> None:
    api = FakeApi()
    result = await _grouper(api).on_pod_event(None, _pod(api, "solo"))
    assert result.action == "grouped" and result.podgroup == "pg-solo-uid-solo"


@pytest.mark.parametrize(
    ("mutate", "detail"),
    [
        (lambda b: b["metadata"]["annotations"].update({POD_GROUP_ANNOTATION: "mine"}), "explicit"),
        (
            lambda b: b["metadata"]["annotations"].update(
                {"scheduling.k8s.io/group-name": "vc-pg"}
            ),
            "Volcano",
        ),
        (lambda b: b["metadata"]["annotations"].update({SKIP_KEY: "true"}), "skip-podgrouper"),
        (lambda b: b["metadata"].update({"deletionTimestamp": "2026-01-01T00:00:00Z"}), "deleted"),
    ],
)
async def test_pods_that_are_not_ours_to_group_are_left_alone(mutate: Any, detail: str) -> None:
    api = FakeApi()
    body = _pod(api, "p")
    mutate(body)
    result = await _grouper(api).on_pod_event(None, body)
    assert result.action == "skipped" and detail in result.detail
    assert api.podgroups == {} and "annotate_pod" not in api.calls


async def test_owned_pod_naming_another_podgroup_is_an_explicit_gang() -> None:
    api = FakeApi()
    job = _job(api)
    body = _pod(api, "train-0", job, annotations={POD_GROUP_ANNOTATION: "llm-train"})
    result = await _grouper(api).on_pod_event(None, body)
    assert (result.action, result.detail) == ("skipped", "explicit PodGroup")
    assert api.podgroups == {}


async def test_skip_on_an_owner_leaves_the_pod_alone() -> None:
    api = FakeApi()
    job = _job(api, annotations={SKIP_KEY: "true"})
    result = await _grouper(api).on_pod_event(None, _pod(api, "train-0", job))
    assert result.action == "skipped" and "Job/train" in result.detail
    assert api.podgroups == {}


async def test_other_schedulers_pods_are_ignored() -> None:
    api = FakeApi()
    body = _pod(api, "p", spec={"schedulerName": "default-scheduler"})
    grouper = _grouper(api)
    assert not grouper.handles(body)
    assert (await grouper.on_pod_event(None, body)).action == "ignored"
    multi = _grouper(api, scheduler_names=frozenset({"kai-scheduler", "default-scheduler"}))
    assert (await multi.on_pod_event(None, body)).action == "grouped"


async def test_status_updates_of_a_grouped_pod_cost_no_requests() -> None:
    api = FakeApi()
    job = _job(api)
    grouper = _grouper(api)
    await grouper.on_pod_event(None, _pod(api, "train-0", job))
    api.calls.clear()
    again = await grouper.on_pod_event("MODIFIED", api.pods["train-0"])
    assert (again.action, again.detail) == ("grouped", "known")
    assert api.calls == []


# ---------------------------------------------------------------- bad input


async def test_owner_deleted_midway_stops_with_an_event_and_no_podgroup() -> None:
    api = FakeApi()
    job = _job(api)
    body = _pod(api, "train-0", job)
    del api.owners[("Job", "train")]
    result = await _grouper(api).on_pod_event(None, body)
    assert result.action == "owner-gone"
    assert api.podgroups == {}
    ((target, reason, message, kind),) = api.events
    assert (target, reason, kind) == ("Pod/train-0", "OwnerDeleted", "Normal")
    assert "Job/train" in message


async def test_pod_deleted_between_podgroup_and_annotation_is_fine() -> None:
    api = FakeApi()
    body = _pod(api, "solo")
    del api.pods["solo"]
    result = await _grouper(api).on_pod_event(None, body)
    assert (result.action, result.detail) == ("skipped", "pod is gone")


async def test_missing_queue_still_creates_the_podgroup_and_warns_the_workload() -> None:
    api = FakeApi()
    job = _job(api, labels={"kai.scheduler/queue": "nope"})
    result = await _grouper(api).on_pod_event(None, _pod(api, "train-0", job))
    assert result.action == "grouped"
    assert api.podgroups[JOB]["spec"]["queue"] == "nope"
    ((target, reason, message, kind),) = api.events
    assert (target, reason, kind) == ("Job/train", "QueueNotFound", "Warning")
    assert "'nope'" in message and "label kai.scheduler/queue on Job/train" in message


async def test_missing_priority_class_falls_back_and_warns() -> None:
    api = FakeApi()
    job = _job(api, labels={"priorityClassName": "gold"})
    await _grouper(api).on_pod_event(None, _pod(api, "train-0", job))
    assert api.podgroups[JOB]["spec"]["priorityClassName"] == "train"
    assert api.reasons() == ["PriorityClassNotFound"]


async def test_bad_min_member_warns_and_groups_elastically() -> None:
    api = FakeApi()
    job = _job(api, min_member="lots")
    await _grouper(api).on_pod_event(None, _pod(api, "train-0", job))
    assert api.podgroups[JOB]["spec"]["minMember"] == 1
    assert api.reasons() == ["InvalidMinMember"]


async def test_user_edit_of_an_owned_field_is_set_back_with_an_event() -> None:
    api = FakeApi()
    job = _job(api, min_member="3")
    grouper = _grouper(api)
    await grouper.on_pod_event(None, _pod(api, "train-0", job))
    # The watch shows our own create: nothing to do.
    await grouper.on_podgroup_event("ADDED", copy.deepcopy(api.podgroups[JOB]))
    assert api.events == []
    edited = api.user_edit(JOB, minMember=1, markUnschedulable=True)
    await grouper.on_podgroup_event("MODIFIED", edited)
    spec = api.podgroups[JOB]["spec"]
    assert spec["minMember"] == 3, "owned: set back"
    assert spec["markUnschedulable"] is True, "not owned: the user's"
    ((target, reason, message, kind),) = api.events
    assert (target, reason, kind) == (f"PodGroup/{JOB}", "PodGroupEditReverted", "Warning")
    assert "spec.minMember is 1 (the workload says 3)" in message
    assert "Job/train" in message and SKIP_KEY in message


async def test_user_moving_the_podgroup_to_another_queue_is_respected() -> None:
    api = FakeApi()
    job = _job(api)
    grouper = _grouper(api)
    await grouper.on_pod_event(None, _pod(api, "train-0", job))
    await grouper.on_podgroup_event("MODIFIED", api.user_edit(JOB, queue="team-a"))
    assert api.podgroups[JOB]["spec"]["queue"] == "team-a"
    assert api.events == [] and "patch_podgroup" not in api.calls


async def test_deleted_podgroup_is_created_again_while_its_pods_remain() -> None:
    api = FakeApi()
    job = _job(api, min_member="2")
    grouper = _grouper(api)
    for i in range(2):
        await grouper.on_pod_event(None, _pod(api, f"train-{i}", job))
    gone = api.podgroups.pop(JOB)
    await grouper.on_podgroup_event("DELETED", gone)
    await _drain(grouper)
    assert api.podgroups[JOB]["spec"]["minMember"] == 2
    assert api.fresh_reads == 1, "the owners are read again, not taken from the cache"


async def test_podgroup_collected_with_its_deleted_owner_is_not_recreated() -> None:
    api = FakeApi()
    job = _job(api)
    grouper = _grouper(api)
    await grouper.on_pod_event(None, _pod(api, "train-0", job))
    # The Job is deleted; garbage collection takes the PodGroup before the pod.
    del api.owners[("Job", "train")]
    await grouper.on_podgroup_event("DELETED", api.podgroups.pop(JOB))
    await _drain(grouper)
    assert api.podgroups == {}
    assert api.reasons() == ["OwnerDeleted"]


async def test_podgroup_of_deleted_pods_is_not_recreated() -> None:
    api = FakeApi()
    grouper = _grouper(api)
    body = _pod(api, "solo")
    await grouper.on_pod_event(None, body)
    await grouper.on_pod_event("DELETED", api.pods.pop("solo"))
    gone = api.podgroups.pop("pg-solo-uid-solo")
    await grouper.on_podgroup_event("DELETED", gone)
    await _drain(grouper)
    assert api.podgroups == {}


# ---------------------------------------------------------------- failing requests


async def test_temporary_failure_is_retried_until_it_works() -> None:
    api = FakeApi()
    job = _job(api)
    api.fail["create_podgroup"] = [TemporaryError("etcd busy", status=503)] * 3
    grouper = _grouper(api)
    result = await grouper.on_pod_event(None, _pod(api, "train-0", job))
    assert result.action == "retry"
    await _drain(grouper)
    assert JOB in api.podgroups
    assert api.pods["train-0"]["metadata"]["annotations"][POD_GROUP_ANNOTATION] == JOB
    assert api.events == [], "a temporary failure is not the user's business"
    assert grouper.stats["retries"] == 3


async def test_refused_write_is_told_on_the_pod_and_retried() -> None:
    api = FakeApi()
    job = _job(api)
    api.fail["create_podgroup"] = [Forbidden("podgroups is forbidden", status=403)]
    grouper = _grouper(api)
    await grouper.on_pod_event(None, _pod(api, "train-0", job))
    await _drain(grouper)
    assert JOB in api.podgroups
    ((target, reason, message, kind),) = api.events
    assert (target, reason, kind) == ("Pod/train-0", "PodGroupNotWritten", "Warning")
    assert "forbidden" in message


async def test_concurrent_create_by_someone_else_is_adopted() -> None:
    api = FakeApi()
    job = _job(api)
    grouper = _grouper(api)
    await api.create_podgroup(
        {"metadata": {"name": JOB, "namespace": NS, "labels": {}}, "spec": {"minMember": 9}}
    )
    api.calls.clear()
    result = await grouper.on_pod_event(None, _pod(api, "train-0", job))
    assert result.action == "grouped"
    assert api.podgroups[JOB]["spec"]["minMember"] == 1
    assert "patch_podgroup" in api.calls


async def test_retry_of_a_deleted_pod_stops() -> None:
    api = FakeApi()
    job = _job(api)
    api.fail["create_podgroup"] = [TemporaryError("down", status=503)]
    grouper = _grouper(api)
    await grouper.on_pod_event(None, _pod(api, "train-0", job))
    del api.pods["train-0"]
    await _drain(grouper)
    assert api.podgroups == {}


async def test_close_cancels_pending_retries() -> None:
    api = FakeApi()

    async def forever(_: float) -> None:
        await asyncio.Event().wait()

    grouper = PodGrouper(api, GrouperSettings(), sleep=forever)
    api.fail["create_podgroup"] = [TemporaryError("down", status=503)]
    await grouper.on_pod_event(None, _pod(api, "solo"))
    assert grouper.retrying == {f"{NS}/solo"}
    await grouper.close()
    assert grouper.retrying == frozenset()


def test_obj_helper_parses_owner_references() -> None:
    owner = obj("Job", "j", api_version="batch/v1")
    child = obj("Pod", "p", owner=owner)
    ref = controller_ref(child)
    assert ref is not None and (ref.kind, ref.uid) == ("Job", "uid-j")
