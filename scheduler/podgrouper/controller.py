"""The pod grouper's reconcile loop: a pod in, its PodGroup created or updated, the pod
annotated. Driven by pod and PodGroup events (the kopf handlers in
:mod:`scheduler.podgrouper.operator`); all API access goes through a
:class:`~scheduler.podgrouper.api.GrouperApi`.

For each pod of our scheduler(s):

1. Leave it alone when it is being deleted, names a Volcano PodGroup
   (``scheduling.k8s.io/group-name``), asks to be skipped (``kai.scheduler/skip-podgrouper:
   "true"`` on the pod or an owner), or already names a PodGroup the grouper did not make
   (an explicit gang: a bare pod with ``pod-group-name``, or one naming another PodGroup
   than its workload's).
2. Walk its owners to the top (:mod:`~scheduler.podgrouper.api`), pick the rule by the top
   owner's kind and compute the :class:`~scheduler.podgrouper.groupers.Grouping`.
3. Check the queue and PriorityClass exist; tell the workload (a Warning Event) about any
   bad input. A missing queue does not stop the PodGroup (KAI does the same): the scheduler
   keeps it pending and says why, and it starts as soon as the queue is created.
4. Create the PodGroup, or patch the fields the grouper owns (:mod:`~scheduler.podgrouper.spec`).
5. Annotate the pod with ``pod-group-name`` - after the PodGroup exists, so the scheduler
   never sees a pod naming a missing PodGroup.

Failures: an owner deleted midway stops the pod's grouping (a Normal Event on the pod; the
garbage collector removes what is left). A failed request is retried with exponential
back-off (1 s doubling to 60 s, as KAI's controller) by fetching the pod again, for as long as
the pod exists; a refusal that will not go away by itself (RBAC, validation) is also told as a
Warning Event on the pod.

PodGroup events keep the grouper's fields true: a change to an owned field that the grouper
did not write is set back, with a Warning Event on the PodGroup; a PodGroup deleted while
its pods remain is created again.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from scheduler.k8s.errors import Conflict, KubeError, NotFound, TemporaryError
from scheduler.k8s.resources import PODGROUP, PRIORITY_CLASS, QUEUE
from scheduler.k8s.writer import ObjectRef
from scheduler.podgrouper.api import GrouperApi, OwnerGone
from scheduler.podgrouper.groupers import Grouping, GroupingContext, Issue, group_pod
from scheduler.podgrouper.keys import POD_GROUP_ANNOTATION, VOLCANO_GROUP_ANNOTATION
from scheduler.podgrouper.owners import ObjectInfo, skip_requested
from scheduler.podgrouper.settings import GrouperSettings
from scheduler.podgrouper.spec import (
    OWNED_SPEC_FIELDS,
    choose_priority_class,
    desired_podgroup,
    spec_drift,
    update_patch,
)

__all__ = ["PodGrouper", "Result"]

log = structlog.get_logger("scheduler.podgrouper")

#: How many of its own recent specs the grouper remembers per PodGroup, to tell its own
#: (possibly late) watch events from a user's edit.
_HISTORY = 4


@dataclass(frozen=True, slots=True)
class Result:
    """What one reconcile did: ``grouped``, ``skipped`` (with why), ``ignored`` (another
    scheduler's pod), ``owner-gone`` or ``retry``."""

    action: str
    podgroup: str = ""
    detail: str = ""


def _owned_view(pg: Mapping[str, Any], fields: tuple[str, ...]) -> tuple[Any, ...]:
    spec = pg.get("spec") or {}
    return tuple(spec.get(f) for f in fields)


def _ref(obj: ObjectInfo) -> ObjectRef:
    return ObjectRef(obj.kind, obj.api_version, obj.name, obj.namespace, obj.uid)


def _pg_ref(pg: Mapping[str, Any]) -> ObjectRef:
    meta = pg.get("metadata") or {}
    return ObjectRef(
        PODGROUP.kind,
        PODGROUP.api_version,
        str(meta.get("name", "")),
        str(meta.get("namespace", "")),
        str(meta.get("uid", "")),
    )


def _slim(pg: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a PodGroup the grouper compares (not its status)."""
    meta = pg.get("metadata") or {}
    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
            "labels": dict(meta.get("labels") or {}),
            "annotations": dict(meta.get("annotations") or {}),
        },
        "spec": dict(pg.get("spec") or {}),
    }


@dataclass
class _Managed:
    """What the grouper knows of one PodGroup it manages."""

    desired: dict[str, Any]
    grouping: Grouping
    #: Pod keys (``namespace/name``) annotated with this PodGroup.
    members: set[str] = field(default_factory=set)
    #: Owned-field views of specs the grouper wanted recently (its own writes).
    history: collections.deque[tuple[Any, ...]] = field(
        default_factory=lambda: collections.deque(maxlen=_HISTORY)
    )
    #: Monotonic time of the last full reconcile (0: due now).
    synced_at: float = 0.0


class PodGrouper:
    """Groups pods into PodGroups (see the module docstring)."""

    def __init__(
        self,
        api: GrouperApi,
        settings: GrouperSettings | None = None,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self._clock = clock
        self.settings = settings or GrouperSettings()
        self.context = GroupingContext(default_queue=self.settings.default_queue)
        self._sleep = sleep
        self._locks: dict[str, asyncio.Lock] = {}
        #: Last seen PodGroups (``namespace/name``), from our writes and the watch.
        self._podgroups: dict[str, dict[str, Any]] = {}
        self._managed: dict[str, _Managed] = {}
        self._pod_group: dict[str, str] = {}
        self._retries: dict[str, asyncio.Task[None]] = {}
        self._attempts: dict[str, int] = {}
        #: Counts of what happened, by name (exported as metrics).
        self.stats: collections.Counter[str] = collections.Counter()

    # ------------------------------------------------------------------ entry points

    def handles(self, pod: Mapping[str, Any]) -> bool:
        """True for a pod of one of our schedulers (the kopf handler's filter)."""
        spec = pod.get("spec") or {}
        return spec.get("schedulerName") in self.settings.scheduler_names

    async def on_pod_event(self, event_type: str | None, body: Mapping[str, Any]) -> Result:
        """A pod watch event (``None`` for the initial listing)."""
        meta = body.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        if event_type == "DELETED":
            self.forget_pod(key)
            return Result("skipped", detail="deleted")
        return await self.sync_pod(body)

    async def on_podgroup_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A PodGroup watch event: keep the cache, revert edits, recreate if deleted."""
        meta = body.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        if event_type == "DELETED":
            self._podgroups.pop(key, None)
            managed = self._managed.get(key)
            if managed is not None and managed.members:
                managed.synced_at = 0.0
                pod_key = sorted(managed.members)[0]
                log.info("podgroup_deleted_recreating", podgroup=key, pod=pod_key)
                self._schedule_retry(pod_key, 0.0)
            return
        async with self._lock(key):
            self._podgroups[key] = _slim(body)
            managed = self._managed.get(key)
            if managed is None:
                return
            fields = tuple(f for f in OWNED_SPEC_FIELDS if f in managed.desired.get("spec", {}))
            if _owned_view(body, fields) in managed.history:
                return
            if spec_drift(body, managed.desired):
                await self._revert(key, body, managed)

    def forget_pod(self, pod_key: str) -> None:
        """A pod is gone: drop its membership and any pending retry."""
        task = self._retries.pop(pod_key, None)
        if task is not None:
            task.cancel()
        self._attempts.pop(pod_key, None)
        pg_key = self._pod_group.pop(pod_key, None)
        if pg_key is None:
            return
        managed = self._managed.get(pg_key)
        if managed is not None:
            managed.members.discard(pod_key)
            if not managed.members:
                del self._managed[pg_key]
                self._podgroups.pop(pg_key, None)

    @property
    def retrying(self) -> frozenset[str]:
        """Pods (``namespace/name``) with a retry pending."""
        return frozenset(self._retries)

    async def close(self) -> None:
        """Cancel pending retries."""
        tasks = list(self._retries.values())
        self._retries.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------ one pod

    async def sync_pod(self, body: Mapping[str, Any], *, fresh: bool = False) -> Result:
        """Reconcile one pod; a failed request schedules a retry instead of raising.
        ``fresh``: read the owners from the API, not the cache (retries do)."""
        pod = ObjectInfo.from_k8s({"apiVersion": "v1", "kind": "Pod", **body})
        try:
            result = await self.reconcile(pod, fresh=fresh)
        except KubeError as e:
            attempt = self._attempts.get(pod.key, 0)
            self._attempts[pod.key] = attempt + 1
            delay = min(self.settings.retry_base * 2**attempt, self.settings.retry_max)
            if isinstance(e, TemporaryError) and e.retry_after:
                delay = max(delay, min(e.retry_after, self.settings.retry_max))
            self.stats["retries"] += 1
            log.warning(
                "group_failed_retrying", pod=pod.key, error=e.message, status=e.status, delay=delay
            )
            if not isinstance(e, TemporaryError | Conflict):
                await self.api.event(
                    _ref(pod),
                    "PodGroupNotWritten",
                    f"the pod grouper could not group this pod ({e.message}); it retries every "
                    f"{self.settings.retry_max:.0f}s at most. Check the pod grouper's "
                    "permissions and log",
                    warning=True,
                )
            self._schedule_retry(pod.key, delay)
            return Result("retry", detail=e.message)
        self._attempts.pop(pod.key, None)
        return result

    async def reconcile(self, pod: ObjectInfo, *, fresh: bool = False) -> Result:
        """Group one pod (the steps in the module docstring); raises :class:`KubeError`
        when a request fails."""
        if pod.spec.get("schedulerName") not in self.settings.scheduler_names:
            return Result("ignored")
        if pod.deleting:
            return Result("skipped", detail="pod is being deleted")
        if VOLCANO_GROUP_ANNOTATION in pod.annotations:
            return Result("skipped", detail="Volcano PodGroup")
        if skip_requested(pod) is not None:
            return Result("skipped", detail="skip-podgrouper on the pod")
        named = pod.annotations.get(POD_GROUP_ANNOTATION, "")
        if named and not pod.owner_refs:
            return Result("skipped", detail="explicit PodGroup")
        known = self._managed.get(self._pod_group.get(pod.key, ""))
        if (
            named
            and known is not None
            and known.grouping.name == named
            and self._clock() - known.synced_at < self.settings.resync_period
            and not fresh
        ):
            # A status change of a pod already grouped: nothing to do until the resync.
            return Result("grouped", named, "known")
        try:
            chain = await self.api.owner_chain(pod, fresh=fresh)
        except OwnerGone as e:
            self.stats["owner_gone"] += 1
            log.info("owner_gone", pod=pod.key, owner=str(e))
            await self.api.event(
                _ref(pod),
                "OwnerDeleted",
                f"not grouped: its owner {e}; the garbage collector removes what is left",
                warning=False,
            )
            return Result("owner-gone", detail=str(e))
        skipper = skip_requested(pod, chain)
        if skipper is not None:
            return Result("skipped", detail=f"skip-podgrouper on {skipper.describe()}")
        grouping = group_pod(pod, chain, self.context)
        if named and named != grouping.name:
            return Result("skipped", detail="explicit PodGroup")
        desired, issues = await self._desired(grouping)
        for issue in issues:
            self.stats["issues"] += 1
            log.info("bad_input", workload=grouping.workload.key, reason=issue.reason)
            await self.api.event(_ref(grouping.workload), issue.reason, issue.message, warning=True)
        pg_key = f"{grouping.namespace}/{grouping.name}"
        async with self._lock(pg_key):
            await self._apply(pg_key, desired, grouping)
        if named != grouping.name:
            annotated = await self.api.annotate_pod(
                pod.namespace, pod.name, pod.uid, {POD_GROUP_ANNOTATION: grouping.name}
            )
            if not annotated:
                return Result("skipped", grouping.name, "pod is gone")
            self.stats["pods_annotated"] += 1
            log.info("pod_grouped", pod=pod.key, podgroup=pg_key, rule=grouping.rule)
        self._join(pod.key, pg_key)
        return Result("grouped", grouping.name)

    async def _desired(self, grouping: Grouping) -> tuple[dict[str, Any], tuple[Issue, ...]]:
        """The PodGroup to write and the issues to tell (missing queue, PriorityClass)."""
        names = {grouping.requested_priority_class, grouping.default_priority_class} - {""}
        known = {n: await self.api.exists(PRIORITY_CLASS, n) for n in sorted(names)}
        priority_class, issues = choose_priority_class(grouping, lambda n: known.get(n))
        issues = grouping.issues + issues
        # The queue is the user's once the PodGroup exists: check the one it names.
        existing = self._podgroups.get(f"{grouping.namespace}/{grouping.name}")
        queue, source = grouping.queue, grouping.queue_source
        if existing is not None and existing["spec"].get("queue"):
            queue, source = existing["spec"]["queue"], "spec.queue of the PodGroup"
        if await self.api.exists(QUEUE, queue) is False:
            issues += (
                Issue(
                    "QueueNotFound",
                    f"queue {queue!r} ({source}) does not exist; the "
                    f"PodGroup {grouping.name} names it and stays pending until the queue is "
                    "created. Create the queue or correct the label",
                ),
            )
        return desired_podgroup(grouping, priority_class), issues

    async def _apply(self, key: str, desired: dict[str, Any], grouping: Grouping) -> None:
        """Create the PodGroup or patch its owned fields; the caller holds the key's lock."""
        namespace, name = key.split("/", 1)
        managed = self._managed.get(key)
        if managed is None:
            managed = self._managed[key] = _Managed(desired, grouping)
        managed.desired, managed.grouping = desired, grouping
        fields = tuple(f for f in OWNED_SPEC_FIELDS if f in desired["spec"])
        if _owned_view(desired, fields) not in managed.history:
            managed.history.append(_owned_view(desired, fields))
        current = self._podgroups.get(key)
        if current is None:
            current = await self.api.get_podgroup(namespace, name)
        if current is None:
            try:
                made = await self.api.create_podgroup(desired)
            except Conflict:
                current = await self.api.get_podgroup(namespace, name)
                if current is None:
                    raise
            else:
                self._podgroups[key] = _slim(made)
                managed.synced_at = self._clock()
                self.stats["podgroups_created"] += 1
                spec = desired["spec"]
                log.info(
                    "podgroup_created",
                    podgroup=key,
                    workload=f"{grouping.workload.describe()}",
                    rule=grouping.rule,
                    min_member=spec["minMember"],
                    queue=spec["queue"],
                    priority_class=spec.get("priorityClassName", ""),
                )
                return
        managed.synced_at = self._clock()
        patch = update_patch(current, desired)
        if patch is None:
            self._podgroups[key] = _slim(current)
            return
        try:
            done = await self.api.patch_podgroup(namespace, name, patch)
        except NotFound:
            self._podgroups.pop(key, None)
            made = await self.api.create_podgroup(desired)
            self._podgroups[key] = _slim(made)
            self.stats["podgroups_created"] += 1
            return
        self._podgroups[key] = _slim(done)
        self.stats["podgroups_updated"] += 1
        log.info("podgroup_updated", podgroup=key, patch=patch)

    async def _revert(self, key: str, body: Mapping[str, Any], managed: _Managed) -> None:
        """Set owned fields a user changed back to the workload's values, and say so."""
        drift = spec_drift(body, managed.desired)
        namespace, name = key.split("/", 1)
        patch = {"spec": {d.field.removeprefix("spec."): d.desired for d in drift}}
        try:
            done = await self.api.patch_podgroup(namespace, name, patch)
        except NotFound:
            return
        except KubeError as e:
            log.warning("revert_failed", podgroup=key, error=e.message)
            if managed.members:
                self._schedule_retry(sorted(managed.members)[0], self.settings.retry_base)
            return
        self._podgroups[key] = _slim(done)
        self.stats["edits_reverted"] += 1
        workload = managed.grouping.workload.describe()
        changes = "; ".join(d.describe() for d in drift)
        log.info("podgroup_edit_reverted", podgroup=key, changes=changes)
        await self.api.event(
            _pg_ref(body),
            "PodGroupEditReverted",
            f"set back: {changes}. The pod grouper keeps these fields as {workload} says; "
            f"change the labels or annotations of {workload} instead, or set "
            'kai.scheduler/skip-podgrouper: "true" on it to manage the PodGroup yourself',
            warning=True,
        )

    # ------------------------------------------------------------------ plumbing

    def _lock(self, key: str) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            if len(self._locks) > 10_000:
                self._locks = {k: v for k, v in self._locks.items() if v.locked()}
            lock = self._locks[key] = asyncio.Lock()
        return lock

    def _join(self, pod_key: str, pg_key: str) -> None:
        previous = self._pod_group.get(pod_key)
        if previous is not None and previous != pg_key:
            self.forget_pod(pod_key)
        self._pod_group[pod_key] = pg_key
        managed = self._managed.get(pg_key)
        if managed is not None:
            managed.members.add(pod_key)

    def _schedule_retry(self, pod_key: str, delay: float) -> None:
        if pod_key in self._retries:
            return
        self._retries[pod_key] = asyncio.create_task(
            self._retry_later(pod_key, delay), name=f"podgrouper-retry:{pod_key}"
        )

    async def _retry_later(self, pod_key: str, delay: float) -> None:
        await self._sleep(delay)
        self._retries.pop(pod_key, None)
        namespace, name = pod_key.split("/", 1)
        try:
            body = await self.api.get_pod(namespace, name)
        except KubeError as e:
            attempt = self._attempts.get(pod_key, 0)
            self._attempts[pod_key] = attempt + 1
            log.warning("retry_get_pod_failed", pod=pod_key, error=e.message)
            self._schedule_retry(
                pod_key, min(self.settings.retry_base * 2**attempt, self.settings.retry_max)
            )
            return
        if body is None:
            self.forget_pod(pod_key)
            return
        # A retry follows a failure or a deleted PodGroup (perhaps collected with its owner):
        # the cached owners may be stale.
        await self.sync_pod(body, fresh=True)
