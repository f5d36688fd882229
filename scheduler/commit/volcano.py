"""Volcano's PodGroup lifecycle and Queue status, written in place of volcano-scheduler.

Volcano's job controller creates no pod until the Job's PodGroup leaves ``Pending``: that
step (volcano-scheduler's ``enqueue`` action) is the scheduler's. After each cycle, with the
status writes, this module

1. **enqueues**: every Volcano PodGroup in phase ``Pending`` (or none yet) is moved to
   ``Inqueue`` when its ``spec.minResources`` fit (the rule: :mod:`.volcanophase`); pending
   PodGroups are taken in order of priority (higher first), then age, then name, and each
   admitted one reserves its minResources for the next. One that does not fit stays
   ``Pending`` with the condition ``Unschedulable=True`` whose reason and message say why
   (``QueueCapability``: the queue's capability, naming the queue, the resource and the
   amounts; ``ClusterCapacity``; ``QueueClosed``; a missing, invalid or non-leaf queue), and a
   Warning Event on the PodGroup. A PodGroup without minResources is always enqueued (Volcano:
   best effort).
2. **follows** an enqueued PodGroup as Volcano reports it: ``Running`` once ``minMember`` of
   its pods are bound or finished (``Completed`` when all of those succeeded), ``Unknown``
   while some run but the gang cannot be placed, back to ``Pending`` when a running gang
   falls below ``minMember`` (then enqueued again); ``Inqueue`` otherwise. ``running``,
   ``succeeded`` and ``failed`` count the pods. The condition ``Scheduled=True`` marks a gang
   with minMember placed; ``Unschedulable=True`` (reason ``NotEnoughResources``, Volcano's)
   one that waits, with the placement's own reason. Conditions of other types are kept.
3. **reports** each Volcano Queue's ``status.allocated`` (what its pods and its children's
   hold), as volcano-scheduler does. ``state`` and the PodGroup counts stay the job of
   Volcano's queue controller.
4. **creates** Volcano's ``default`` Queue (weight 1, reclaimable) when Volcano's Queue API is
   installed and no queue of that name exists: volcano-scheduler does so at start, and
   Volcano's job controller refuses Jobs whose queue does not exist.

The enqueue rule and the phases are decided in :mod:`scheduler.commit.volcanophase`; this
module writes them.

Writes only happen when something changed (compared with the object and with the last write)
and go through the leader-checked :class:`~scheduler.k8s.writer.Writer`. Volcano v1.10's
PodGroup CRD has no status subresource, so the PodGroup is merge-patched as a whole (only
``status``); should a later CRD add the subresource (the API's discovery lists
``podgroups/status``), that is used instead.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog

from scheduler.cache import Cache
from scheduler.cache.volcano import DEFAULT_QUEUE, k8s_resource_list
from scheduler.cluster.snapshot import Snapshot
from scheduler.commit.volcanophase import (
    OVERCOMMIT_FACTOR,
    SCHEDULED,
    UNSCHEDULABLE,
    PodGroupStatus,
    podgroup_phase,
    podgroup_statuses,
)
from scheduler.fairness import FairShareReport
from scheduler.k8s.client import JSON_CONTENT, MERGE_PATCH
from scheduler.k8s.errors import Conflict, Forbidden, KubeError, NotFound
from scheduler.k8s.resources import VOLCANO_PODGROUP, VOLCANO_QUEUE
from scheduler.k8s.writer import ObjectRef, Writer, now_rfc3339
from scheduler.solver.placement import GangOutcome

__all__ = ["VolcanoStatus"]

log = structlog.get_logger("scheduler.commit.volcano")

#: Seconds between attempts to create the ``default`` queue after a failure.
_CREATE_RETRY = 60.0


def _conditions(raw: Mapping[str, Any], status: PodGroupStatus, now: str) -> list[dict[str, Any]]:
    """The PodGroup's conditions with ours replaced (times kept for unchanged ones)."""
    old = list((raw.get("status") or {}).get("conditions") or [])
    kept = [c for c in old if c.get("type") not in (UNSCHEDULABLE, SCHEDULED)]
    if status.condition is None:
        return kept
    kind, reason, message = status.condition
    mine = {"type": kind, "status": "True", "reason": reason, "message": message}
    before = next((c for c in old if c.get("type") == kind), None)
    same = before is not None and all(before.get(k) == v for k, v in mine.items())
    stamp = before.get("lastTransitionTime") if same and before is not None else None
    return [*kept, {**mine, "lastTransitionTime": stamp or now}]


def _comparable(status: Mapping[str, Any]) -> tuple[Any, ...]:
    conditions = sorted(
        (str(c.get("type")), str(c.get("status")), str(c.get("reason")), str(c.get("message")))
        for c in status.get("conditions") or []
    )
    return (
        status.get("phase") or "",
        int(status.get("running") or 0),
        int(status.get("succeeded") or 0),
        int(status.get("failed") or 0),
        tuple(conditions),
    )


class VolcanoStatus:
    """Writes the Volcano side of each cycle (see the module docstring)."""

    def __init__(
        self,
        cache: Cache,
        writer: Writer,
        *,
        overcommit: float = OVERCOMMIT_FACTOR,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cache = cache
        self.writer = writer
        self.overcommit = overcommit
        self._clock = clock
        #: ``namespace/name`` -> (uid, status) last written: a PodGroup deleted and made again
        #: under the same name (Volcano's job controller does so on every Job restart) is
        #: another object and is written afresh, even when it should get the same status.
        self._written: dict[str, tuple[str, tuple[Any, ...]]] = {}
        #: Queue name -> (uid, status.allocated) last written (uid: as for ``_written``).
        self._queue_written: dict[str, tuple[str, dict[str, str]]] = {}
        #: Whether PodGroups have a status subresource (None: not asked yet).
        self._status_subresource: bool | None = None
        self._create_after = 0.0

    def owned(self, snapshot: Snapshot) -> tuple[frozenset[str], frozenset[str]]:
        """Gang keys and queue names whose status is written here, not as KAI's: Volcano's
        PodGroups and every queue of the snapshot that is not a KAI Queue object (Volcano's,
        Volcano's ``root``/``default`` without objects, implicit ones)."""
        gangs = frozenset(self.cache.volcano_podgroups())
        kai = self.cache.kai_queue_names()
        return gangs, frozenset(q.name for q in snapshot.queues if q.name not in kai)

    async def publish(
        self,
        snapshot: Snapshot,
        outcomes: Mapping[str, GangOutcome],
        report: FairShareReport,
    ) -> None:
        """Enqueue, PodGroup and Queue status, the ``default`` queue (errors are logged)."""
        try:
            await self._publish(snapshot, outcomes, report)
        except Exception:
            log.exception("volcano_status_failed")

    async def _publish(
        self,
        snapshot: Snapshot,
        outcomes: Mapping[str, GangOutcome],
        report: FairShareReport,
    ) -> None:
        podgroups = self.cache.volcano_podgroups()
        queues = self.cache.volcano_queues()
        calls: list[Awaitable[None]] = []
        if self.cache.volcano_queue_api():
            calls.append(self._ensure_default_queue(queues))
            calls += self._queue_status(queues, report)
        if podgroups:
            statuses = podgroup_statuses(
                snapshot,
                report,
                podgroups,
                queues,
                outcomes,
                overcommit=self.overcommit,
                foreign=self.cache.foreign_podgroups(),
            )
            self._written = {k: v for k, v in self._written.items() if k in podgroups}
            now = now_rfc3339()
            for key, status in statuses.items():
                calls += self._podgroup(podgroups[key], status, now)
        else:
            self._written.clear()
        if calls:
            await asyncio.gather(*calls)

    # --- PodGroups -----------------------------------------------------------------------

    def _podgroup(
        self, raw: Mapping[str, Any], status: PodGroupStatus, now: str
    ) -> list[Awaitable[None]]:
        meta = raw.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        key = f"{namespace}/{name}"
        body = {
            "phase": status.phase,
            "running": status.counts.running,
            "succeeded": status.counts.succeeded,
            "failed": status.counts.failed,
            "conditions": _conditions(raw, status, now),
        }
        calls: list[Awaitable[None]] = []
        wanted = _comparable(body)
        mark = (str(meta.get("uid") or ""), wanted)
        if wanted != _comparable(raw.get("status") or {}) and self._written.get(key) != mark:
            self._written[key] = mark
            if podgroup_phase(raw) != status.phase:
                log.info(
                    "volcano_podgroup_phase",
                    podgroup=key,
                    phase=status.phase,
                    was=podgroup_phase(raw) or "none",
                    reason=status.condition[1] if status.condition else "",
                )
            calls.append(self._patch_podgroup(namespace, name, body))
        if status.event:
            ref = ObjectRef(
                VOLCANO_PODGROUP.kind,
                VOLCANO_PODGROUP.api_version,
                name,
                namespace,
                str(meta.get("uid") or ""),
            )
            calls.append(self._event(ref, status.event))
        return calls

    async def _event(self, ref: ObjectRef, message: str) -> None:
        await self.writer.event(ref, "Unschedulable", message, warning=True)

    async def _patch_podgroup(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        if self._status_subresource is None:
            self._status_subresource = await self._has_status_subresource()
        sub = "status" if self._status_subresource else ""
        path = VOLCANO_PODGROUP.object_path(namespace, name, sub)
        try:
            await _send(self.writer, "PATCH", path, {"status": status})
        except NotFound:
            self._written.pop(f"{namespace}/{name}", None)  # gone meanwhile
        except KubeError as e:
            self._written.pop(f"{namespace}/{name}", None)  # try again next time
            log.warning(
                "volcano_podgroup_status_failed", podgroup=f"{namespace}/{name}", error=e.message
            )

    async def _has_status_subresource(self) -> bool:
        """Whether the PodGroup CRD serves ``podgroups/status`` (API discovery)."""
        try:
            found = await self.writer._request("GET", VOLCANO_PODGROUP.base, write=False)
        except KubeError as e:
            log.warning("volcano_discovery_failed", error=e.message)
            return False
        names = {r.get("name") for r in (found or {}).get("resources") or []}
        return f"{VOLCANO_PODGROUP.plural}/status" in names

    # --- Queues --------------------------------------------------------------------------

    def _queue_status(
        self, queues: Mapping[str, Mapping[str, Any]], report: FairShareReport
    ) -> list[Awaitable[None]]:
        calls: list[Awaitable[None]] = []
        self._queue_written = {k: v for k, v in self._queue_written.items() if k in queues}
        for name, raw in queues.items():
            status = report.queues.get(name)
            if status is None:
                continue
            allocated = k8s_resource_list(status.allocated)
            current = (raw.get("status") or {}).get("allocated") or {}
            mark = (str((raw.get("metadata") or {}).get("uid") or ""), allocated)
            if allocated == current or self._queue_written.get(name) == mark:
                continue
            self._queue_written[name] = mark
            calls.append(self._patch_queue(name, allocated))
        return calls

    async def _patch_queue(self, name: str, allocated: dict[str, str]) -> None:
        path = VOLCANO_QUEUE.object_path(None, name, "status")
        try:
            await _send(self.writer, "PATCH", path, {"status": {"allocated": allocated}})
        except NotFound:
            self._queue_written.pop(name, None)
        except KubeError as e:
            self._queue_written.pop(name, None)
            log.warning("volcano_queue_status_failed", queue=name, error=e.message)

    async def _ensure_default_queue(self, queues: Mapping[str, Any]) -> None:
        """Create Volcano's ``default`` Queue as volcano-scheduler would (see docstring)."""
        if DEFAULT_QUEUE in queues or DEFAULT_QUEUE in self.cache.kai_queue_names():
            return
        if self.cache.raw(VOLCANO_QUEUE.key, "", DEFAULT_QUEUE) is not None:
            return
        if self._clock() < self._create_after:
            return
        self._create_after = self._clock() + _CREATE_RETRY
        body = {
            "apiVersion": VOLCANO_QUEUE.api_version,
            "kind": VOLCANO_QUEUE.kind,
            "metadata": {"name": DEFAULT_QUEUE},
            "spec": {"weight": 1, "reclaimable": True},
        }
        try:
            await _send(self.writer, "POST", VOLCANO_QUEUE.list_path(), body)
        except Conflict:
            return  # someone else made it
        except Forbidden as e:
            log.error(
                "volcano_default_queue_forbidden",
                error=e.message,
                fix="grant create on queues.scheduling.volcano.sh (manifests/20-rbac.yaml), "
                "or create the Volcano Queue 'default'",
            )
            return
        except KubeError as e:
            log.warning("volcano_default_queue_failed", error=e.message)
            return
        log.info("volcano_default_queue_created", queue=DEFAULT_QUEUE)


async def _send(writer: Writer, method: str, path: str, body: Mapping[str, Any]) -> Any:
    """One leader-checked write with the writer's retries (the Writer has no Volcano-shaped
    methods; these are its own request and retry steps)."""
    content_type = MERGE_PATCH if method == "PATCH" else JSON_CONTENT
    return await writer._retry(
        lambda: writer._request(method, path, body=dict(body), content_type=content_type)
    )
