"""The bench's side of the API: a small REST client, the pending backlog, the watch that times
binds, and the clean-up between contenders.

The bench talks to kube-apiserver with plain aiohttp and raw JSON rather than a generated client:
with 10,000 pods and several events per pod, decoding into model objects would make the bench's
own CPU use (on a machine it shares with the scheduler under test) much larger than needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp

__all__ = [
    "Api",
    "ApiError",
    "Backlog",
    "BindWatch",
    "create_backlog",
    "create_namespace",
    "delete_namespace",
]

GPU = "nvidia.com/gpu"
PODGROUPS = "/apis/scheduling.run.ai/v2alpha2/namespaces/{ns}/podgroups"
BINDREQUESTS = "/apis/scheduling.run.ai/v1alpha2/namespaces/{ns}/bindrequests"


class ApiError(RuntimeError):
    """kube-apiserver answered a bench request with an unexpected status."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path} -> {status}: {body[:500]}")
        self.status = status


class Api:
    """An aiohttp session against one API server with a bearer token (use ``async with``)."""

    def __init__(self, server: str, token: str, ca_file: Path, *, connections: int = 32) -> None:
        self.server = server
        self._headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self._ssl = ssl.create_default_context(cafile=str(ca_file))
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Api:
        connector = aiohttp.TCPConnector(ssl=self._ssl, limit=self._connections)
        self._session = aiohttp.ClientSession(
            connector=connector, headers=self._headers, timeout=aiohttp.ClientTimeout(total=None)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        """The open session (inside ``async with``)."""
        if self._session is None:
            raise RuntimeError("Api used outside 'async with'")
        return self._session

    async def call(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        params: Mapping[str, str] | None = None,
        allow: tuple[int, ...] = (),
    ) -> dict[str, Any]:
        """One request; the decoded body. Statuses in ``allow`` (e.g. 404) return ``{}``."""
        async with self.session.request(
            method,
            self.server + path,
            json=body,
            params=params,
            timeout=aiohttp.ClientTimeout(total=120),
        ) as resp:
            text = await resp.text()
            if resp.status in allow:
                return {}
            if resp.status >= 300:
                raise ApiError(method, path, resp.status, text)
            return dict(json.loads(text)) if text else {}

    async def watch(self, path: str, resource_version: str) -> AsyncIterator[dict[str, Any]]:
        """Watch events of the collection at ``path`` from ``resource_version`` until the
        server ends the stream (then the caller resumes from the last version it saw)."""
        params = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": "1800",
        }
        async with self.session.get(
            self.server + path, params=params, timeout=aiohttp.ClientTimeout(total=None)
        ) as resp:
            if resp.status != 200:
                raise ApiError("WATCH", path, resp.status, await resp.text())
            while True:
                line = await resp.content.readline()
                if not line:
                    return
                if line.strip():
                    yield json.loads(line)


@dataclass(frozen=True)
class Backlog:
    """The pending work every contender gets, identically: ``pods`` pods, in gangs of
    ``gang_size`` (one PodGroup per gang) when it is above 1."""

    pods: int
    gang_size: int = 1
    pod_gpus: int = 1
    pod_cpu: str = "100m"
    pod_memory: str = "64Mi"
    queue: str = "default-queue"

    def gang_of(self, index: int) -> str | None:
        """The PodGroup name of pod ``index``, or None for single pods."""
        return f"gang-{index // self.gang_size:05d}" if self.gang_size > 1 else None

    def podgroups(self) -> list[dict[str, Any]]:
        """PodGroup manifests (``scheduling.run.ai/v2alpha2``), one per gang."""
        if self.gang_size <= 1:
            return []
        gangs = sorted({g for i in range(self.pods) if (g := self.gang_of(i))})
        return [
            {
                "apiVersion": "scheduling.run.ai/v2alpha2",
                "kind": "PodGroup",
                "metadata": {"name": name},
                "spec": {"minMember": self.gang_size, "queue": self.queue},
            }
            for name in gangs
        ]

    def pod(self, index: int, scheduler_name: str, *, with_gangs: bool) -> dict[str, Any]:
        """The manifest of pod ``index`` for the scheduler serving ``scheduler_name``."""
        resources: dict[str, Any] = {"requests": {"cpu": self.pod_cpu, "memory": self.pod_memory}}
        if self.pod_gpus:
            resources["limits"] = {GPU: str(self.pod_gpus)}
        gang = self.gang_of(index)
        annotations = {"pod-group-name": gang} if gang and with_gangs else {}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"pod-{index:05d}",
                "annotations": annotations,
                "labels": {"app": "kai-bench", "kai.scheduler/queue": self.queue},
            },
            "spec": {
                "schedulerName": scheduler_name,
                "terminationGracePeriodSeconds": 0,
                "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
                "containers": [
                    {"name": "main", "image": "registry.invalid/fake:1", "resources": resources}
                ],
            },
        }


async def create_namespace(api: Api, name: str, timeout: float = 60.0) -> None:
    """Create namespace ``name`` and wait for its ``default`` ServiceAccount (pods are refused
    until the service-account controller has made it)."""
    await api.call("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    deadline = time.monotonic() + timeout
    while not await api.call(
        "GET", f"/api/v1/namespaces/{name}/serviceaccounts/default", allow=(404,)
    ):
        if time.monotonic() > deadline:
            raise TimeoutError(f"namespace {name}: no default ServiceAccount after {timeout}s")
        await asyncio.sleep(0.2)


async def _in_parallel(jobs: Iterable[Callable[[], Awaitable[object]]], concurrency: int) -> None:
    """Run the jobs (coroutine functions), at most ``concurrency`` at a time."""
    queue = deque(jobs)

    async def worker() -> None:
        while queue:
            await queue.popleft()()

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def create_backlog(
    api: Api,
    namespace: str,
    backlog: Backlog,
    scheduler_name: str,
    *,
    with_gangs: bool,
    concurrency: int = 24,
) -> None:
    """Create the PodGroups (when ``with_gangs``), then every pod, ``concurrency`` at a time."""
    if with_gangs:
        # PodGroups first, so no scheduler ever sees a gang pod whose group is missing.
        path = PODGROUPS.format(ns=namespace)
        await _in_parallel(
            (partial(api.call, "POST", path, pg) for pg in backlog.podgroups()), concurrency
        )
    path = f"/api/v1/namespaces/{namespace}/pods"
    pods = (backlog.pod(i, scheduler_name, with_gangs=with_gangs) for i in range(backlog.pods))
    await _in_parallel((partial(api.call, "POST", path, pod) for pod in pods), concurrency)


async def _pod_names(api: Api, namespace: str) -> list[str]:
    names: list[str] = []
    params = {"limit": "500"}
    while True:
        page = await api.call("GET", f"/api/v1/namespaces/{namespace}/pods", params=params)
        names += [str(p["metadata"]["name"]) for p in page.get("items", [])]
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return names
        params = {"limit": "500", "continue": str(token)}


async def delete_namespace(
    api: Api, namespace: str, *, kai_crds: bool, timeout: float, concurrency: int = 24
) -> None:
    """Remove every pod of ``namespace`` (grace period 0: kwok's fake kubelet need not confirm)
    and wait until none is left, so the next contender finds every node empty; then delete the
    namespace, which takes its PodGroups (and KAI's BindRequests) with it.

    Pods are deleted one request each, ``concurrency`` at a time: a delete-collection runs on a
    single API server worker and, with 10,000 pods, outlives the 60 s request timeout (504)."""
    ns = namespace
    grace = {"gracePeriodSeconds": "0"}
    deadline = time.monotonic() + timeout
    while names := await _pod_names(api, ns):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(names)} pods of namespace {ns} left after {timeout}s")
        await _in_parallel(
            (
                partial(api.call, "DELETE", f"/api/v1/namespaces/{ns}/pods/{name}", params=grace,
                        allow=(404, 409, 429, 500, 504))
                for name in names
            ),
            concurrency,
        )  # fmt: skip
    # Not waited for: nothing left in the namespace holds node capacity.
    for collection in [PODGROUPS, BINDREQUESTS] if kai_crds else [PODGROUPS]:
        await api.call("DELETE", collection.format(ns=ns), allow=(404, 500, 504))
    await api.call("DELETE", f"/api/v1/namespaces/{ns}", allow=(404, 409))


@dataclass
class BindWatch:
    """Watches the pods of one namespace and notes, on the bench's monotonic clock, when each
    pod first appeared and when it was first seen with ``spec.nodeName`` set.

    Arrival times of watch events are what an outside observer (a user, a job controller) sees,
    so they are the bench's definition of "bound", for every contender alike.
    """

    api: Api
    namespace: str
    #: pod -> monotonic time its ADDED event arrived.
    added: dict[str, float] = field(default_factory=dict)
    #: pod -> monotonic time of the first event showing it bound.
    bound: dict[str, float] = field(default_factory=dict)
    #: pod -> node it was bound to.
    node_of: dict[str, str] = field(default_factory=dict)
    #: Pods seen bound to a second, different node (never expected).
    rebound: set[str] = field(default_factory=set)
    #: Pods deleted while the watch ran (e.g. a scheduler evicting a stale gang).
    deleted: set[str] = field(default_factory=set)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """List the namespace's pods, then follow the watch in a background task."""
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        listing = await self.api.call("GET", path)
        for pod in listing.get("items", []):
            self._observe("ADDED", pod, time.monotonic())
        version = str(listing["metadata"]["resourceVersion"])
        self._task = asyncio.create_task(self._follow(path, version), name="bench-bind-watch")

    async def _follow(self, path: str, version: str) -> None:
        while True:
            async for event in self.api.watch(path, version):
                now = time.monotonic()
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    raise ApiError("WATCH", path, int(obj.get("code", 0)), json.dumps(obj))
                version = str(obj.get("metadata", {}).get("resourceVersion", version))
                if event.get("type") != "BOOKMARK":
                    self._observe(str(event.get("type")), obj, now)

    def _observe(self, kind: str, pod: Mapping[str, Any], now: float) -> None:
        name = str(pod["metadata"]["name"])
        if kind == "DELETED":
            self.deleted.add(name)
        else:
            self.added.setdefault(name, now)
            node = (pod.get("spec") or {}).get("nodeName")
            if node and name not in self.bound:
                self.bound[name] = now
                self.node_of[name] = str(node)
            elif node and self.node_of.get(name) != node:
                self.rebound.add(name)
        self._changed.set()

    async def wait(self, done: Callable[[], bool], timeout: float, poll: float = 0.5) -> bool:
        """Wait until ``done()`` is true (checked after each event and every ``poll`` seconds);
        False on timeout. Re-raises if the watch task failed."""
        deadline = time.monotonic() + timeout
        while not done():
            if self._task is not None and self._task.done():
                self._task.result()  # raises the watch's error
                raise RuntimeError("the bench's pod watch ended unexpectedly")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(poll, remaining))
        return True

    async def stop(self) -> None:
        """Cancel the watch task."""
        if self._task is not None:
            self._task.cancel()
            # The run is over and its outcome recorded: how the watch ended no longer matters.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
