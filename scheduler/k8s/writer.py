"""Every write the scheduler makes: bind (with the GPU grant), evict, conditions, status, Events.

Binding goes through the ``pods/binding`` subresource with the pod's UID as a precondition, so
a pod deleted and recreated under the same name is never bound by mistake, and the API server
itself refuses a second binding of the same pod (409), which is what makes "no pod is bound
twice" hold even across scheduler restarts.

The GPU device grant travels in the Binding's own ``metadata.annotations``: the API server
copies them onto the pod in the same write that sets ``spec.nodeName``, and refuses the whole
write if the pod is already bound. So a grant can never be written to a pod without its bind,
never rewrites the grant of a pod that already runs, and a bound pod always carries the grant
it was bound with.

Eviction goes through ``pods/eviction`` (so PodDisruptionBudgets are honoured by the API server
itself, whatever the scheduler planned), with the pod's UID as a precondition, after marking the
pod ``DisruptionTarget=True`` as kube-scheduler marks its victims; a refusal (429 from a budget)
is an answer, not an error to retry, and sets the condition back to False.

Every mutating request first asks ``may_write`` (leadership): a replica that lost its Lease
sends nothing more, whatever was queued behind the in-flight limit or a retry's back-off.

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
from typing import Any, Literal

import structlog
from kubernetes_asyncio.client import ApiClient

from scheduler.cache.grants import GPU_GRANT_ANNOTATION, format_gpu_grant
from scheduler.k8s.client import MERGE_PATCH, STRATEGIC_MERGE_PATCH, request_json
from scheduler.k8s.errors import Conflict, KubeError, NotFound, PermanentError, TemporaryError
from scheduler.k8s.resources import PERSISTENT_VOLUME, POD, PODGROUP, QUEUE, ResourceKind

__all__ = [
    "DISRUPTION_REASON",
    "DISRUPTION_TARGET",
    "BindOutcome",
    "EventLimiter",
    "EvictOutcome",
    "EvictStatus",
    "NotLeader",
    "ObjectRef",
    "Writer",
    "event_body",
    "now_rfc3339",
]

log = structlog.get_logger("scheduler.k8s.writer")

#: The API rejects longer Event messages.
_MAX_MESSAGE = 1000


def event_body(
    ref: ObjectRef, reason: str, message: str, *, warning: bool, component: str, instance: str
) -> tuple[str, dict[str, Any]]:
    """(namespace, body) of a core/v1 Event about ``ref``. Cluster-scoped objects (Queues,
    Nodes) get their Events in "default", as kubectl describe looks for them there."""
    now = now_rfc3339()
    namespace = ref.namespace or "default"
    return namespace, {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{ref.name}.", "namespace": namespace},
        "involvedObject": ref.involved(),
        "reason": reason,
        "message": message[:_MAX_MESSAGE],
        "type": "Warning" if warning else "Normal",
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": instance,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


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


class NotLeader(PermanentError):
    """A write was refused locally: this replica does not hold the Lease (any more)."""


#: The pod condition kube-scheduler sets on the pods it preempts.
DISRUPTION_TARGET = "DisruptionTarget"
#: Its reason for a pod the scheduler takes resources back from.
DISRUPTION_REASON = "PreemptionByScheduler"

EvictStatus = Literal["evicted", "gone", "refused", "not_leader", "error"]


@dataclass(frozen=True, slots=True)
class EvictOutcome:
    """How one eviction ended (see :meth:`Writer.evict`); true when the pod is on its way
    out (``evicted``) or already gone."""

    status: EvictStatus
    message: str = ""

    def __bool__(self) -> bool:
        return self.status in ("evicted", "gone")


def _budget_refusal(e: TemporaryError) -> bool:
    """A 429 from ``pods/eviction`` because of a PodDisruptionBudget, not API throttling."""
    text = " ".join((e.message, *e.causes)).lower()
    return e.status == 429 and "disruption budget" in text


class BindOutcome:
    """How one bind ended.

    ``bound``: the pod is bound to the node with our grant (now, or by an earlier attempt whose
    answer was lost). Otherwise ``error`` says why, and ``uncertain`` is True when the bind may
    still have happened (every attempt ended without an answer): the caller must not treat the
    pod as pending until it has seen it unbound. ``observed`` is the pod as read back after a
    409, so the caller can learn where it really is without waiting for the watch.
    """

    __slots__ = ("bound", "error", "observed", "uncertain")

    def __init__(
        self,
        bound: bool,
        error: str = "",
        *,
        uncertain: bool = False,
        observed: dict[str, Any] | None = None,
    ) -> None:
        self.bound = bound
        self.error = error
        self.uncertain = uncertain
        self.observed = observed


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
        may_write: Callable[[], bool] = lambda: True,
    ) -> None:
        self.api = api
        self.may_write = may_write
        self.component = component
        self.instance = instance or component
        self.limiter = limiter or EventLimiter()
        self.bind_attempts = max(1, bind_attempts)
        self.retry_delay = retry_delay
        self._in_flight = asyncio.Semaphore(max(1, max_in_flight))

    # ------------------------------------------------------------------ pods

    async def bind(
        self,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        grant: Mapping[int, int] | None = None,
    ) -> BindOutcome:
        """Bind through ``pods/binding`` carrying the GPU ``grant`` (see the module docstring);
        retries temporary errors ``bind_attempts`` times.

        A 409 means the pod already has a node: if it is ``node`` with the same grant, an
        earlier attempt of ours succeeded (its answer was lost); otherwise the bind failed for
        good and the outcome carries the pod as it is.
        """
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        annotation = format_gpu_grant(grant) if grant else None
        if annotation is not None:
            meta["annotations"] = {GPU_GRANT_ANNOTATION: annotation}
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
                return await self._bound_already(namespace, name, node, annotation, e)
            except TemporaryError as e:
                error = e.message
                if attempt < self.bind_attempts - 1:
                    await asyncio.sleep(self.retry_delay * 2**attempt)
            except KubeError as e:
                return BindOutcome(False, e.message)
        # No answer to any attempt: the last one may have bound the pod all the same.
        return BindOutcome(False, error, uncertain=True)

    async def _bound_already(
        self, namespace: str, name: str, node: str, annotation: str | None, conflict: KubeError
    ) -> BindOutcome:
        try:
            pod = await self._request("GET", POD.object_path(namespace, name), write=False)
        except NotFound:
            return BindOutcome(False, f"{conflict.message}; the pod is gone")
        except KubeError as e:
            return BindOutcome(False, f"{conflict.message}; then {e.message}", uncertain=True)
        current = ((pod or {}).get("spec") or {}).get("nodeName")
        annotations = ((pod or {}).get("metadata") or {}).get("annotations") or {}
        if current == node and annotations.get(GPU_GRANT_ANNOTATION) == annotation:
            return BindOutcome(True, observed=pod)
        return BindOutcome(
            False, f"pod is already bound to {current}: {conflict.message}", observed=pod
        )

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod as the API server has it now, or None when it does not exist."""
        try:
            pod = await self._request("GET", POD.object_path(namespace, name), write=False)
        except NotFound:
            return None
        return pod if isinstance(pod, dict) else None

    async def evict(
        self,
        namespace: str,
        name: str,
        uid: str = "",
        *,
        message: str = "",
        condition_reason: str | None = DISRUPTION_REASON,
    ) -> EvictOutcome:
        """Evict one pod through ``pods/eviction``, which honours PodDisruptionBudgets.

        Unless ``condition_reason`` is None, the pod first gets the condition
        ``DisruptionTarget=True`` with that reason and ``message`` (as kube-scheduler marks
        its victims), so the workload's controller and Job pod-failure policies can tell a
        preempted pod from a failed one. The Eviction carries the pod's ``uid`` as a
        precondition, so a pod recreated under the same name is never evicted by mistake.

        The API server's eviction replaces the condition's reason with its own; once the
        eviction is accepted ours is written again (best effort: the pod may be gone already).

        The outcome is ``evicted``; ``gone`` (404, or the uid no longer matches);
        ``refused`` (429 from a PodDisruptionBudget: not retried, the plan that needed it is
        dropped); ``not_leader`` (nothing was sent); or ``error``. When the eviction did not
        happen, the condition is set back to ``False``. Never raises for API errors.
        """
        key = f"{namespace}/{name}"
        marked = False
        if condition_reason is not None:
            try:
                await self._disruption_condition(namespace, name, "True", condition_reason, message)
                marked = True
            except NotFound:
                return EvictOutcome("gone", "the pod no longer exists")
            except NotLeader as e:
                return EvictOutcome("not_leader", e.message)
            except KubeError as e:
                # The condition only informs; the eviction itself is what frees the node.
                log.warning("disruption_condition_failed", pod=key, error=e.message)
        outcome = await self._post_eviction(namespace, name, uid)
        if marked and condition_reason is not None and outcome.status == "evicted":
            # The Eviction API writes its own reason over ours (EvictionByEvictionAPI,
            # "Eviction API: evicting"); say again who evicted the pod and why, so the
            # terminating pod shows what kube-scheduler's victims show.
            try:
                await self._disruption_condition(namespace, name, "True", condition_reason, message)
            except KubeError as e:
                log.debug("disruption_condition_not_restated", pod=key, error=e.message)
        if marked and outcome.status in ("refused", "error"):
            try:
                reason = "EvictionRefused" if outcome.status == "refused" else "EvictionFailed"
                await self._disruption_condition(namespace, name, "False", reason, outcome.message)
            except KubeError as e:
                log.info("disruption_condition_not_reset", pod=key, error=e.message)
        return outcome

    async def _disruption_condition(
        self, namespace: str, name: str, status: str, reason: str, message: str
    ) -> None:
        condition = {
            "type": DISRUPTION_TARGET,
            "status": status,
            "reason": reason,
            "message": message[:_MAX_MESSAGE],
            "lastTransitionTime": now_rfc3339(),
        }
        await self._patch_pod_condition(namespace, name, condition)

    async def _post_eviction(self, namespace: str, name: str, uid: str) -> EvictOutcome:
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if uid:
            body["deleteOptions"] = {"preconditions": {"uid": uid}}
        path = POD.object_path(namespace, name, "eviction")
        error = ""
        for attempt in range(self.bind_attempts):
            try:
                await self._request("POST", path, body=body)
                return EvictOutcome("evicted")
            except NotFound:
                return EvictOutcome("gone", "the pod no longer exists")
            except NotLeader as e:
                return EvictOutcome("not_leader", e.message)
            except Conflict as e:
                # The uid precondition failed (the name now belongs to a new pod), or the
                # pod changed under the eviction: read it to tell which.
                return await self._evict_conflict(namespace, name, uid, e)
            except TemporaryError as e:
                if _budget_refusal(e):
                    detail = "; ".join(e.causes) or e.message
                    return EvictOutcome("refused", f"refused by a PodDisruptionBudget: {detail}")
                error = e.message
                if attempt < self.bind_attempts - 1:
                    await asyncio.sleep(min(e.retry_after or self.retry_delay * 2**attempt, 5.0))
            except KubeError as e:
                return EvictOutcome("error", e.message)
        return EvictOutcome("error", error)

    async def _evict_conflict(
        self, namespace: str, name: str, uid: str, conflict: KubeError
    ) -> EvictOutcome:
        try:
            pod = await self.get_pod(namespace, name)
        except KubeError as e:
            return EvictOutcome("error", f"{conflict.message}; then {e.message}")
        if pod is None or (uid and (pod.get("metadata") or {}).get("uid") != uid):
            return EvictOutcome("gone", "the pod no longer exists (its name was reused)")
        return EvictOutcome("error", conflict.message)

    async def _patch_pod_condition(
        self, namespace: str, name: str, condition: dict[str, Any]
    ) -> None:
        """Set one condition in the pod's status (merged by type), with retries."""
        body = {"status": {"conditions": [condition]}}
        await self._retry(
            lambda: self._request(
                "PATCH",
                POD.object_path(namespace, name, "status"),
                body=body,
                content_type=STRATEGIC_MERGE_PATCH,
            )
        )

    async def set_nominated_node(self, namespace: str, name: str, node: str | None) -> None:
        """Set (or clear, with None) ``status.nominatedNodeName``: the node held for a pod
        while the pods evicted for it terminate (as kube-scheduler marks its preemptors)."""
        await self._retry(
            lambda: self._request(
                "PATCH",
                POD.object_path(namespace, name, "status"),
                body={"status": {"nominatedNodeName": node}},
                content_type=STRATEGIC_MERGE_PATCH,
            )
        )

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
        await self._patch_pod_condition(namespace, name, condition)

    # ------------------------------------------------------------------ volumes

    async def patch_persistent_volume(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """Merge-patch a PersistentVolume, once (no retries): binding a volume to a claim
        (:mod:`scheduler.commit.volumebind`). A ``metadata.resourceVersion`` in ``patch`` is
        a precondition: :class:`Conflict` when the volume changed since. The volume as
        written."""
        out = await self._request(
            "PATCH",
            PERSISTENT_VOLUME.object_path(None, name),
            body=dict(patch),
            content_type=MERGE_PATCH,
        )
        return out if isinstance(out, dict) else {}

    async def update_object(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        body: Mapping[str, Any],
        *,
        subresource: str = "",
    ) -> dict[str, Any]:
        """PUT an object (or its ``subresource``, e.g. ``status``), once (no retries): the
        body's ``metadata.resourceVersion`` is a precondition, :class:`Conflict` when the
        object changed since (:mod:`scheduler.commit.dra` writes ResourceClaims so). The
        object as written."""
        out = await self._request(
            "PUT", kind.object_path(namespace, name, subresource), body=dict(body)
        )
        return out if isinstance(out, dict) else {}

    async def get_object(
        self, kind: ResourceKind, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        """An object as the API server has it now, or None when it does not exist."""
        try:
            out = await self._request("GET", kind.object_path(namespace, name), write=False)
        except NotFound:
            return None
        return out if isinstance(out, dict) else None

    async def create_object(
        self, kind: ResourceKind, namespace: str | None, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        """POST a new object (temporary errors retried); :class:`Conflict` if it exists."""
        out = await self._retry(
            lambda: self._request("POST", kind.list_path(namespace), body=dict(body))
        )
        return out if isinstance(out, dict) else {}

    async def replace_object(
        self, kind: ResourceKind, namespace: str | None, name: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        """PUT an object whole (temporary errors retried)."""
        out = await self._retry(
            lambda: self._request("PUT", kind.object_path(namespace, name), body=dict(body))
        )
        return out if isinstance(out, dict) else {}

    async def delete_object(
        self, kind: ResourceKind, namespace: str | None, name: str, uid: str = ""
    ) -> bool:
        """DELETE an object (only that incarnation when ``uid`` is given); False if gone."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self._retry(
                lambda: self._request("DELETE", kind.object_path(namespace, name), body=body)
            )
        except (NotFound, Conflict):
            return False
        return True

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
        namespace, body = event_body(
            ref, reason, message, warning=warning, component=self.component, instance=self.instance
        )
        try:
            await self._request("POST", f"/api/v1/namespaces/{namespace}/events", body=body)
        except KubeError as e:
            log.warning("event_failed", object=f"{ref.kind}/{ref.name}", error=e.message)
            return False
        return True

    # ------------------------------------------------------------------ plumbing

    async def _request(self, method: str, path: str, *, write: bool = True, **kwargs: Any) -> Any:
        """One API request, at most ``max_in_flight`` at a time.

        Bounding concurrency keeps the event loop responsive: a gang of hundreds of pods
        would otherwise make hundreds of requests ready in the same loop iteration. A write
        checks leadership *after* waiting for its slot, right before it goes out.
        """
        async with self._in_flight:
            if write and method != "GET" and not self.may_write():
                raise NotLeader(f"{method} {path}: not the leader; write not sent", status=0)
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
