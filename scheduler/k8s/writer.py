"""Every write the scheduler makes: bind, record the GPU grant, evict, conditions, status, Events.

Binding goes through the ``pods/binding`` subresource with the pod's UID as a precondition, so
a pod deleted and recreated under the same name is never bound by mistake, and the API server
itself refuses a second binding of the same pod (409), which is what makes "no pod is bound
twice" hold even across scheduler restarts.

Events are rate limited twice: the same (object, reason, message) is sent at most once per
``event_interval`` seconds, and all Events together at most ``events_per_second`` (a token
bucket), so a thousand unschedulable pods cannot flood the API server.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from kubernetes_asyncio.client import ApiClient

from scheduler.cache.grants import GPU_GRANT_ANNOTATION, format_gpu_grant
from scheduler.k8s.client import MERGE_PATCH, STRATEGIC_MERGE_PATCH, request_json
from scheduler.k8s.errors import Conflict, KubeError, NotFound, TemporaryError
from scheduler.k8s.resources import POD, PODGROUP, QUEUE

__all__ = [
    "BindOutcome",
    "EventLimiter",
    "ObjectRef",
    "Writer",
    "now_rfc3339",
]

log = structlog.get_logger("scheduler.k8s.writer")

#: The API rejects longer Event messages.
_MAX_MESSAGE = 1000


def now_rfc3339() -> str:
    """The current time as the API writes timestamps (second precision, UTC, ``Z``)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an Event is about."""

    kind: str
    api_version: str
    name: str
    namespace: str = ""
    uid: str = ""

    def involved(self) -> dict[str, str]:
        """The ``involvedObject`` of a core Event."""
        out = {"kind": self.kind, "apiVersion": self.api_version, "name": self.name}
        if self.namespace:
            out["namespace"] = self.namespace
        if self.uid:
            out["uid"] = self.uid
        return out


class EventLimiter:
    """Decides whether an Event may be sent now (see module docstring)."""

    def __init__(
        self,
        interval: float = 60.0,
        per_second: float = 20.0,
        burst: int = 100,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = interval
        self.per_second = per_second
        self.burst = burst
        self._clock = clock
        self._last: dict[tuple[str, ...], float] = {}
        self._tokens = float(burst)
        self._refilled = clock()

    def allow(self, key: tuple[str, ...]) -> bool:
        """True (and record it) when an Event with this key may go out now."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            return False
        self._tokens = min(self.burst, self._tokens + (now - self._refilled) * self.per_second)
        self._refilled = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        self._last[key] = now
        if len(self._last) > 50_000:  # forget keys whose interval passed long ago
            self._last = {k: t for k, t in self._last.items() if now - t < self.interval}
        return True


class BindOutcome:
    """How one bind ended: ``bound`` (by us, now or by an earlier attempt) or a failure."""

    __slots__ = ("bound", "error")

    def __init__(self, bound: bool, error: str = "") -> None:
        self.bound = bound
        self.error = error


class Writer:
    """The scheduler's writes to the API server (one ``ApiClient`` shared with the cache)."""

    def __init__(
        self,
        api: ApiClient,
        *,
        component: str = "kai-scheduler",
        instance: str = "",
        limiter: EventLimiter | None = None,
        bind_attempts: int = 3,
        retry_delay: float = 0.2,
        max_in_flight: int = 8,
    ) -> None:
        self.api = api
        self.component = component
        self.instance = instance or component
        self.limiter = limiter or EventLimiter()
        self.bind_attempts = max(1, bind_attempts)
        self.retry_delay = retry_delay
        self._in_flight = asyncio.Semaphore(max(1, max_in_flight))

    # ------------------------------------------------------------------ pods

    async def record_grant(self, namespace: str, name: str, grant: Mapping[int, int]) -> None:
        """Write the GPU device grant annotation (before binding, so a restart sees it)."""
        body = {"metadata": {"annotations": {GPU_GRANT_ANNOTATION: format_gpu_grant(grant)}}}
        await self._retry(
            lambda: self._request(
                "PATCH",
                POD.object_path(namespace, name),
                body=body,
                content_type=MERGE_PATCH,
            )
        )

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> BindOutcome:
        """Bind through ``pods/binding``; retries temporary errors ``bind_attempts`` times.

        A 409 means the pod already has a node: if it is ``node`` an earlier attempt of ours
        succeeded (its answer was lost), otherwise the bind failed for good.
        """
        meta: dict[str, str] = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        path = POD.object_path(namespace, name, "binding")
        error = ""
        for attempt in range(self.bind_attempts):
            try:
                await self._request("POST", path, body=body)
                return BindOutcome(True)
            except Conflict as e:
                return await self._bound_already(namespace, name, node, e)
            except TemporaryError as e:
                error = e.message
                await asyncio.sleep(self.retry_delay * 2**attempt)
            except KubeError as e:
                return BindOutcome(False, e.message)
        return BindOutcome(False, error)

    async def _bound_already(
        self, namespace: str, name: str, node: str, conflict: KubeError
    ) -> BindOutcome:
        try:
            pod = await self._request("GET", POD.object_path(namespace, name))
        except KubeError as e:
            return BindOutcome(False, f"{conflict.message}; then {e.message}")
        current = ((pod or {}).get("spec") or {}).get("nodeName")
        if current == node:
            return BindOutcome(True)
        return BindOutcome(False, f"pod is already bound to {current}: {conflict.message}")

    async def evict(self, namespace: str, name: str, uid: str = "") -> bool:
        """Evict through ``pods/eviction`` (honours PodDisruptionBudgets); True when gone."""
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if uid:
            body["deleteOptions"] = {"preconditions": {"uid": uid}}
        try:
            await self._retry(
                lambda: self._request(
                    "POST", POD.object_path(namespace, name, "eviction"), body=body
                )
            )
        except NotFound:
            return True
        except KubeError as e:
            log.warning("evict_failed", pod=f"{namespace}/{name}", error=e.message)
            return False
        return True

    async def set_unschedulable(self, namespace: str, name: str, message: str) -> None:
        """Set ``PodScheduled=False, reason=Unschedulable`` (what autoscalers look for)."""
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message[:_MAX_MESSAGE],
            "lastTransitionTime": now_rfc3339(),
            "lastProbeTime": None,
        }
        body = {"status": {"conditions": [condition]}}
        await self._retry(
            lambda: self._request(
                "PATCH",
                POD.object_path(namespace, name, "status"),
                body=body,
                content_type=STRATEGIC_MERGE_PATCH,
            )
        )

    # ------------------------------------------------------------------ status of CRDs

    async def patch_podgroup_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None:
        """Merge-patch ``status`` of a PodGroup."""
        await self._retry(
            lambda: self._request(
                "PATCH",
                PODGROUP.object_path(namespace, name, "status"),
                body={"status": dict(status)},
                content_type=MERGE_PATCH,
            )
        )

    async def patch_queue_status(self, name: str, status: Mapping[str, Any]) -> None:
        """Merge-patch ``status`` of a Queue."""
        await self._retry(
            lambda: self._request(
                "PATCH",
                QUEUE.object_path(None, name, "status"),
                body={"status": dict(status)},
                content_type=MERGE_PATCH,
            )
        )

    # ------------------------------------------------------------------ events

    async def event(
        self, ref: ObjectRef, reason: str, message: str, *, warning: bool = False
    ) -> bool:
        """Send a core/v1 Event unless the limiter holds it back; True when sent.

        Failures are logged, never raised: telling users is best effort.
        """
        key = (ref.kind, ref.namespace, ref.name, ref.uid, reason, message)
        if not self.limiter.allow(key):
            return False
        now = now_rfc3339()
        # Cluster-scoped objects (Queues, Nodes) get their Events in "default", as kubectl
        # describe looks for them there.
        namespace = ref.namespace or "default"
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{ref.name}.", "namespace": namespace},
            "involvedObject": ref.involved(),
            "reason": reason,
            "message": message[:_MAX_MESSAGE],
            "type": "Warning" if warning else "Normal",
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self._request("POST", f"/api/v1/namespaces/{namespace}/events", body=body)
        except KubeError as e:
            log.warning("event_failed", object=f"{ref.kind}/{ref.name}", error=e.message)
            return False
        return True

    # ------------------------------------------------------------------ plumbing

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        """One API request, at most ``max_in_flight`` at a time.

        Bounding concurrency keeps the event loop responsive: a gang of hundreds of pods
        would otherwise make hundreds of requests ready in the same loop iteration.
        """
        async with self._in_flight:
            return await request_json(self.api, method, path, **kwargs)

    async def _retry(self, call: Callable[[], Any]) -> Any:
        """Run ``call``; retry TemporaryError with back-off, re-raise everything else."""
        for attempt in range(self.bind_attempts):
            try:
                return await call()
            except TemporaryError:
                if attempt == self.bind_attempts - 1:
                    raise
                await asyncio.sleep(self.retry_delay * 2**attempt)
        return None
