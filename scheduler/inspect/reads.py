"""The API reads behind ``kai-scheduler explain``: the object, its gang, queue and Events.

Only GETs and LISTs, so any user who may ``kubectl describe`` the object may explain it. A
Queue, PodGroup or Event list that cannot be read (not installed, or RBAC) leaves that part
out with a note instead of failing; only the object asked about must be readable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio.client import ApiClient

from scheduler.inspect.model import gang_name_of, queue_name_of
from scheduler.k8s.client import request_json
from scheduler.k8s.errors import KubeError, NotFound
from scheduler.k8s.resources import POD, PODGROUP, QUEUE, VOLCANO_PODGROUP, ResourceKind

__all__ = [
    "CORE_EVENT",
    "NotFoundError",
    "Objects",
    "kind_of_name",
    "read_for_pod",
    "read_for_podgroup",
]

#: Events as ``kubectl describe`` reads them (the scheduler writes core/v1 Events).
CORE_EVENT = ResourceKind("Event", "", "v1", "events", namespaced=True)
#: How far up the queue tree to read (a cycle in parentQueue stops earlier).
_MAX_PARENTS = 10


class NotFoundError(Exception):
    """The object asked about does not exist (the message says which, and where)."""


@dataclass
class Objects:
    """Everything read for one explanation."""

    target: dict[str, Any]
    podgroup: dict[str, Any] | None = None
    members: list[dict[str, Any]] = field(default_factory=list)
    queues: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    #: Parts that could not be read, said for the user.
    notes: list[str] = field(default_factory=list)


class _Reader:
    """One API client and the per-request timeout."""

    def __init__(self, api: ApiClient, timeout: float) -> None:
        self.api = api
        self.timeout = timeout

    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> dict[str, Any]:
        path = kind.object_path(namespace, name)
        return dict(await request_json(self.api, "GET", path, timeout=self.timeout))

    async def items(
        self, kind: ResourceKind, namespace: str, query: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]:
        path = kind.list_path(namespace)
        body = await request_json(self.api, "GET", path, query=query, timeout=self.timeout)
        return list((body or {}).get("items") or [])

    async def podgroup(self, namespace: str, name: str) -> dict[str, Any] | None:
        """KAI's PodGroup of that name, else Volcano's (as the scheduler reads them)."""
        for kind in (PODGROUP, VOLCANO_PODGROUP):
            try:
                return await self.get(kind, namespace, name)
            except NotFound:
                continue  # not there, or that API is not installed
        return None

    async def gang_and_queue(
        self, out: Objects, namespace: str, group: str, default_queue: str
    ) -> None:
        """The members of ``group`` and the queue chain of the gang."""
        try:
            # Pods name their PodGroup by annotation, which no selector matches: list them all.
            pods = await self.items(POD, namespace)
            out.members = [p for p in pods if gang_name_of(p) == group]
        except KubeError as e:
            out.notes.append(f"the pods of PodGroup {group} could not be listed: {e.message}")
        queue, _ = queue_name_of(out.podgroup, out.members or [out.target], default_queue)
        await self.queues(queue, out)

    async def queues(self, name: str, out: Objects) -> None:
        """The queue ``name`` and its ancestors into ``out.queues`` (a missing one is left
        out: the model says it does not exist)."""
        current, seen = name, set[str]()
        while current and current not in seen and len(seen) <= _MAX_PARENTS:
            seen.add(current)
            try:
                queue = await self.get(QUEUE, None, current)
            except NotFound:
                return
            except KubeError as e:
                out.notes.append(f"queue {current} could not be read: {e.message}")
                return
            out.queues[current] = queue
            current = str((queue.get("spec") or {}).get("parentQueue") or "")

    async def events(self, out: Objects, namespace: str, kind: str, obj: Mapping[str, Any]) -> None:
        """The Events about ``obj`` into ``out.events``."""
        meta = obj.get("metadata") or {}
        name, uid = str(meta.get("name", "")), str(meta.get("uid") or "")
        query = {"fieldSelector": f"involvedObject.kind={kind},involvedObject.name={name}"}
        try:
            events = await self.items(CORE_EVENT, namespace, query)
        except KubeError as e:
            out.notes.append(f"Events of {kind.lower()}/{name} could not be read: {e.message}")
            return
        for event in events:
            seen = (event.get("involvedObject") or {}).get("uid")
            # An older object of the same name (deleted and recreated) is not this one.
            if not (uid and seen and seen != uid):
                out.events.append(event)


async def read_for_pod(
    api: ApiClient, namespace: str, name: str, *, default_queue: str, timeout: float = 15.0
) -> Objects:
    """The pod, its PodGroup and fellow members, its queue chain and its Events.

    Raises :class:`NotFoundError` if there is no such pod, :class:`KubeError` if it cannot
    be read.
    """
    reader = _Reader(api, timeout)
    try:
        pod = await reader.get(POD, namespace, name)
    except NotFound as e:
        raise NotFoundError(f"pod {name} not found in namespace {namespace}") from e
    out = Objects(pod)
    group = gang_name_of(pod)
    if group:
        try:
            out.podgroup = await reader.podgroup(namespace, group)
        except KubeError as e:
            out.notes.append(f"PodGroup {group} could not be read: {e.message}")
        await reader.gang_and_queue(out, namespace, group, default_queue)
    else:
        out.members = [pod]
        queue, _ = queue_name_of(None, [pod], default_queue)
        await reader.queues(queue, out)
    await reader.events(out, namespace, "Pod", pod)
    return out


async def read_for_podgroup(
    api: ApiClient, namespace: str, name: str, *, default_queue: str, timeout: float = 15.0
) -> Objects:
    """The PodGroup, its member pods, its queue chain, and the Events of it and its pods.

    Raises :class:`NotFoundError` if there is no such PodGroup (KAI's or Volcano's).
    """
    reader = _Reader(api, timeout)
    podgroup = await reader.podgroup(namespace, name)
    if podgroup is None:
        raise NotFoundError(f"PodGroup {name} not found in namespace {namespace}")
    out = Objects(podgroup, podgroup=podgroup)
    await reader.gang_and_queue(out, namespace, name, default_queue)
    await reader.events(out, namespace, str(podgroup.get("kind") or "PodGroup"), podgroup)
    for pod in out.members:
        await reader.events(out, namespace, "Pod", pod)
    return out


async def kind_of_name(api: ApiClient, namespace: str, name: str, timeout: float = 15.0) -> str:
    """For a bare NAME: ``pod`` if such a pod exists, else ``podgroup`` (whose read then says
    whether that exists)."""
    try:
        await _Reader(api, timeout).get(POD, namespace, name)
    except NotFound:
        return "podgroup"
    return "pod"
