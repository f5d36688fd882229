"""Every API request the pod grouper makes, with the caches that keep them few.

- **Owners** are read with GET (no watches): :meth:`KubeGrouperApi.owner_chain` follows a
  pod's ownerReferences to its top owner. Each owner is cached for ``owner_ttl`` seconds
  (a Job's hundred pods cost one GET of the Job), concurrent reads of the same owner share one
  request, and a cached owner whose UID differs from the reference is read again (a workload
  deleted and recreated under the same name).
- **Kinds** map to URLs through a table of the common workload kinds, else API discovery
  (``GET /apis/<group>/<version>``, cached).
- **Queues and PriorityClasses** are only checked for existence (cached ``exists_ttl``).
- At most ``max_in_flight`` requests run at once, so a burst of pods cannot flood the API.
- **Events** go through the scheduler's :class:`~scheduler.k8s.writer.EventLimiter`: the same
  (object, reason, message) at most once per ``event_interval``.

Errors (besides :mod:`scheduler.k8s.errors`)::

    GrouperError
    ├── OwnerGone         an owner was deleted (or replaced) while the pod was being grouped
    └── OwnerUnreadable   an owner cannot be read (RBAC, or a kind the API does not serve):
                          the chain stops below it, as in KAI
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

import structlog
from kubernetes_asyncio.client import ApiClient

from scheduler.k8s.client import MERGE_PATCH, request_json
from scheduler.k8s.errors import Conflict, Forbidden, KubeError, NotFound, PermanentError
from scheduler.k8s.resources import POD, PODGROUP, ResourceKind
from scheduler.k8s.writer import EventLimiter, ObjectRef, event_body
from scheduler.podgrouper.owners import ObjectInfo, OwnerRef, controller_ref, split_api_version

__all__ = [
    "GrouperApi",
    "GrouperError",
    "KubeGrouperApi",
    "OwnerGone",
    "OwnerUnreadable",
]

log = structlog.get_logger("scheduler.podgrouper.api")

#: An owner chain longer than this is cut (a reference cycle, or something odd).
MAX_CHAIN = 10
#: Seconds before a kind the API did not serve is looked up again.
_DISCOVERY_RETRY = 60.0

#: Workload kinds whose URL is known without discovery: (apiVersion, kind) -> (plural,
#: namespaced).
_KNOWN_KINDS: dict[tuple[str, str], tuple[str, bool]] = {
    ("v1", "Pod"): ("pods", True),
    ("v1", "ReplicationController"): ("replicationcontrollers", True),
    ("batch/v1", "Job"): ("jobs", True),
    ("batch/v1", "CronJob"): ("cronjobs", True),
    ("apps/v1", "Deployment"): ("deployments", True),
    ("apps/v1", "ReplicaSet"): ("replicasets", True),
    ("apps/v1", "StatefulSet"): ("statefulsets", True),
    ("apps/v1", "DaemonSet"): ("daemonsets", True),
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): ("leaderworkersets", True),
}


class GrouperError(Exception):
    """Base of the pod grouper's own errors."""


class OwnerGone(GrouperError):
    """An owner in the chain no longer exists (or is a new object under the old name)."""

    def __init__(self, ref: OwnerRef, why: str) -> None:
        super().__init__(f"{ref.kind}/{ref.name} (uid {ref.uid}) {why}")
        self.ref = ref


class OwnerUnreadable(GrouperError):
    """An owner cannot be read: the chain stops at the object below it."""


class GrouperApi(Protocol):
    """What the controller needs from the API (a fake implements it in unit tests)."""

    async def owner_chain(self, pod: ObjectInfo, *, fresh: bool = False) -> list[ObjectInfo]:
        """The pod's owners, direct owner first, top owner last ([] for a bare pod);
        ``fresh`` reads every owner from the API, not the cache."""
        ...

    async def exists(self, kind: ResourceKind, name: str) -> bool | None:
        """Whether a cluster-scoped object exists; None when that cannot be told."""
        ...

    async def get_podgroup(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The PodGroup, or None when it does not exist."""
        ...

    async def create_podgroup(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create; raises :class:`Conflict` when it exists already."""
        ...

    async def patch_podgroup(
        self, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch; raises :class:`NotFound` when it is gone."""
        ...

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod, or None when it does not exist."""
        ...

    async def annotate_pod(
        self, namespace: str, name: str, uid: str, annotations: Mapping[str, str]
    ) -> bool:
        """Set annotations on the pod with this UID; False when it is gone (or replaced)."""
        ...

    async def event(self, ref: ObjectRef, reason: str, message: str, *, warning: bool) -> bool:
        """Post a core Event (rate limited, best effort); True when sent."""
        ...


@dataclass
class _Entry:
    """One owner read: the object, gone (NotFound), or unreadable."""

    value: ObjectInfo | NotFound | OwnerUnreadable
    at: float


class KubeGrouperApi:
    """:class:`GrouperApi` over a kubernetes-asyncio ``ApiClient`` (see module docstring)."""

    def __init__(
        self,
        api: ApiClient,
        *,
        component: str = "kai-podgrouper",
        instance: str = "",
        max_in_flight: int = 16,
        owner_ttl: float = 10.0,
        exists_ttl: float = 30.0,
        event_interval: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.component = component
        self.instance = instance or component
        self.owner_ttl = owner_ttl
        self.exists_ttl = exists_ttl
        self.limiter = EventLimiter(interval=event_interval, clock=clock)
        self._clock = clock
        self._slots = asyncio.Semaphore(max_in_flight)
        self._owners: dict[tuple[str, str, str, str], _Entry] = {}
        self._inflight: dict[tuple[str, str, str, str], asyncio.Future[_Entry]] = {}
        self._kinds: dict[tuple[str, str], tuple[str, bool]] = dict(_KNOWN_KINDS)
        self._kinds_missing: dict[tuple[str, str], float] = {}
        self._exists: dict[tuple[str, str], tuple[bool, float]] = {}

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        async with self._slots:
            return await request_json(self.api, method, path, **kwargs)

    # ------------------------------------------------------------------ owners

    async def _resource(self, api_version: str, kind: str) -> tuple[str, bool] | None:
        """(plural, namespaced) of a kind, from the table or discovery; None if not served."""
        key = (api_version, kind)
        if key in self._kinds:
            return self._kinds[key]
        missed = self._kinds_missing.get(key)
        if missed is not None and self._clock() - missed < _DISCOVERY_RETRY:
            return None
        group, version = split_api_version(api_version)
        path = f"/apis/{group}/{version}" if group else f"/api/{version}"
        try:
            listing = await self._request("GET", path)
        except PermanentError:
            listing = None
        found = None
        for res in (listing or {}).get("resources") or []:
            if res.get("kind") == kind and "/" not in str(res.get("name", "")):
                found = (str(res["name"]), bool(res.get("namespaced")))
                break
        if found is None:
            # Not served now; perhaps once its CRD is installed.
            self._kinds_missing[key] = self._clock()
        else:
            self._kinds[key] = found
        return found

    async def _fetch(self, ref: OwnerRef, namespace: str) -> _Entry:
        resource = await self._resource(ref.api_version, ref.kind)
        now = self._clock()
        if resource is None:
            why = f"{ref.kind}/{ref.name}: the API serves no kind {ref.kind} in {ref.api_version}"
            return _Entry(OwnerUnreadable(why), now)
        plural, namespaced = resource
        group, version = split_api_version(ref.api_version)
        kind = ResourceKind(ref.kind, group, version, plural, namespaced)
        try:
            raw = await self._request("GET", kind.object_path(namespace, ref.name))
        except NotFound as e:
            return _Entry(e, self._clock())
        except Forbidden as e:
            return _Entry(OwnerUnreadable(f"{ref.kind}/{ref.name}: {e.message}"), self._clock())
        info = ObjectInfo.from_k8s(raw)
        if not info.api_version:
            info = ObjectInfo.from_k8s({**raw, "apiVersion": ref.api_version, "kind": ref.kind})
        return _Entry(info, self._clock())

    async def get_owner(self, ref: OwnerRef, namespace: str, *, fresh: bool = False) -> ObjectInfo:
        """The owner ``ref`` points at (cached unless ``fresh``); raises :class:`OwnerGone`,
        :class:`OwnerUnreadable`, or a :class:`KubeError` for a failed request."""
        key = (ref.api_version, ref.kind, namespace, ref.name)
        entry = None if fresh else self._owners.get(key)
        recent = entry is not None and self._clock() - entry.at < self.owner_ttl
        stale_uid = (
            entry is not None and isinstance(entry.value, ObjectInfo) and entry.value.uid != ref.uid
        )
        # "Not found" is never taken from the cache: a workload deleted and created again
        # under the same name must be found at once.
        missing = entry is not None and isinstance(entry.value, NotFound)
        if entry is None or not recent or stale_uid or missing:
            entry = await self._shared_fetch(key, ref, namespace)
        value = entry.value
        if isinstance(value, OwnerUnreadable):
            raise OwnerUnreadable(str(value))
        if isinstance(value, NotFound):
            raise OwnerGone(ref, "no longer exists")
        if ref.uid and value.uid != ref.uid:
            raise OwnerGone(ref, f"was replaced by a new object (uid {value.uid})")
        return value

    async def _shared_fetch(
        self, key: tuple[str, str, str, str], ref: OwnerRef, namespace: str
    ) -> _Entry:
        pending = self._inflight.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._fetch(ref, namespace))
            self._inflight[key] = pending
            try:
                # Shielded: a cancelled caller must not cancel the read others wait for.
                entry = await asyncio.shield(pending)
            finally:
                self._inflight.pop(key, None)
            self._owners[key] = entry
            if len(self._owners) > 20_000:
                now = self._clock()
                self._owners = {
                    k: e for k, e in self._owners.items() if now - e.at < self.owner_ttl
                }
            return entry
        return await asyncio.shield(pending)

    async def owner_chain(self, pod: ObjectInfo, *, fresh: bool = False) -> list[ObjectInfo]:
        """The pod's owners up to the top (see :class:`GrouperApi`); stops below an owner
        that cannot be read; raises :class:`OwnerGone` when one was deleted."""
        chain: list[ObjectInfo] = []
        seen = {pod.uid}
        obj = pod
        while (ref := controller_ref(obj)) is not None and len(chain) < MAX_CHAIN:
            try:
                owner = await self.get_owner(ref, pod.namespace, fresh=fresh)
            except OwnerUnreadable as e:
                log.debug(
                    "owner_unreadable", pod=pod.key, owner=f"{ref.kind}/{ref.name}", why=str(e)
                )
                break
            if owner.uid in seen:
                break
            seen.add(owner.uid)
            chain.append(owner)
            obj = owner
        return chain

    # ------------------------------------------------------------------ lookups

    async def exists(self, kind: ResourceKind, name: str) -> bool | None:
        """Whether the cluster-scoped ``kind`` named ``name`` exists (cached); None if the
        answer is unknown (forbidden, or a failed request)."""
        key = (kind.kind, name)
        cached = self._exists.get(key)
        if cached is not None and self._clock() - cached[1] < self.exists_ttl:
            return cached[0]
        try:
            await self._request("GET", kind.object_path(None, name))
            found = True
        except NotFound:
            found = False
        except KubeError as e:
            log.debug("exists_unknown", kind=kind.kind, name=name, error=e.message)
            return None
        self._exists[key] = (found, self._clock())
        return found

    # ------------------------------------------------------------------ PodGroups and pods

    async def get_podgroup(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The PodGroup, or None."""
        try:
            got: dict[str, Any] = await self._request("GET", PODGROUP.object_path(namespace, name))
        except NotFound:
            return None
        return got

    async def create_podgroup(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST the PodGroup; :class:`Conflict` when it already exists."""
        namespace = body["metadata"]["namespace"]
        made: dict[str, Any] = await self._request(
            "POST", PODGROUP.list_path(namespace), body=dict(body)
        )
        return made

    async def patch_podgroup(
        self, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch the PodGroup."""
        done: dict[str, Any] = await self._request(
            "PATCH",
            PODGROUP.object_path(namespace, name),
            body=dict(patch),
            content_type=MERGE_PATCH,
        )
        return done

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod, or None."""
        try:
            got: dict[str, Any] = await self._request("GET", POD.object_path(namespace, name))
        except NotFound:
            return None
        return got

    async def annotate_pod(
        self, namespace: str, name: str, uid: str, annotations: Mapping[str, str]
    ) -> bool:
        """Merge-patch annotations, with the UID as a precondition (a pod recreated under
        the same name is not touched); False when the pod is gone."""
        patch = {"metadata": {"uid": uid, "annotations": dict(annotations)}}
        try:
            await self._request(
                "PATCH", POD.object_path(namespace, name), body=patch, content_type=MERGE_PATCH
            )
        except (NotFound, Conflict):
            return False
        return True

    # ------------------------------------------------------------------ events

    async def event(self, ref: ObjectRef, reason: str, message: str, *, warning: bool) -> bool:
        """A core/v1 Event about ``ref`` (see :class:`GrouperApi`)."""
        if not self.limiter.allow((ref.kind, ref.namespace, ref.name, ref.uid, reason, message)):
            return False
        namespace, body = event_body(
            ref, reason, message, warning=warning, component=self.component, instance=self.instance
        )
        try:
            await self._request(
                "POST", f"/api/v1/namespaces/{quote(namespace, safe='')}/events", body=body
            )
        except KubeError as e:
            log.warning("event_failed", object=f"{ref.kind}/{ref.name}", error=e.message)
            return False
        return True
