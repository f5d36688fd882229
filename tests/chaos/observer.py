"""Feeds the invariant checker from the API server: its own list + watch per kind.

It connects straight to kube-apiserver with the admin token, never through the relay the
scheduler uses, so the faults aimed at the scheduler's connections do not blind it. Watch
events arrive in resourceVersion order, so every state the checker sees was a real state of
the cluster. After any interruption (the API server restarting, 410 Gone) it lists again and
the list replaces what it held, which is again a real state.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from tests.chaos.api import ApiError, KubeApi, WatchExpired
from tests.chaos.invariants import InvariantChecker

__all__ = ["Observer"]

#: Collection paths per kind (all namespaces).
_PATHS = {
    "Pod": "/api/v1/pods",
    "Node": "/api/v1/nodes",
    "PodGroup": "/apis/scheduling.run.ai/v2alpha2/podgroups",
}


@dataclass
class ObserverStats:
    """How the observer's own watches fared."""

    lists: dict[str, int] = field(default_factory=dict)
    events: int = 0
    interruptions: int = 0
    last_error: str = ""


class Observer:
    """List + watch pods, nodes and PodGroups into ``checker`` until :meth:`stop`."""

    def __init__(
        self, api: KubeApi, checker: InvariantChecker, *, started: float | None = None
    ) -> None:
        self.api = api
        self.checker = checker
        self.started = time.monotonic() if started is None else started
        self.synced = asyncio.Event()
        self.stats = ObserverStats()
        self._listed: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []

    def now(self) -> float:
        """Seconds since the run started (the checker's clock)."""
        return time.monotonic() - self.started

    def start(self) -> None:
        """Start one task per kind and the gang clock."""
        self._tasks = [
            asyncio.create_task(self._run(kind), name=f"observe-{kind}") for kind in _PATHS
        ]
        self._tasks.append(asyncio.create_task(self._tick(), name="observe-tick"))

    async def stop(self) -> None:
        """Cancel the tasks."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _tick(self) -> None:
        while True:
            self.checker.tick(self.now())
            await asyncio.sleep(0.25)

    async def _run(self, kind: str) -> None:
        path = _PATHS[kind]
        rv = ""
        while True:
            try:
                if not rv:
                    items, rv = await self.api.list(path)
                    self.checker.relisted(kind, items, self.now())
                    self.stats.lists[kind] = self.stats.lists.get(kind, 0) + 1
                    self._listed.add(kind)
                    if len(self._listed) == len(_PATHS):
                        self.synced.set()
                async for event in self.api.watch(path, rv):
                    obj = event.get("object") or {}
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if event.get("type") == "BOOKMARK":
                        continue
                    self.stats.events += 1
                    self._apply(kind, str(event.get("type")), obj)
            except WatchExpired:
                rv = ""
            except ApiError as e:
                # The API server is restarting (or similar): list again once it answers; the
                # list is a consistent state, whatever happened meanwhile.
                self.stats.interruptions += 1
                self.stats.last_error = f"{kind}: {str(e)[:200]}"
                rv = ""
                await asyncio.sleep(0.5)

    def _apply(self, kind: str, event_type: str, obj: dict[str, object]) -> None:
        now = self.now()
        deleted = event_type == "DELETED"
        if kind == "Pod":
            (self.checker.pod_deleted if deleted else self.checker.pod_upsert)(obj, now)
        elif kind == "Node":
            (self.checker.node_deleted if deleted else self.checker.node_upsert)(obj, now)
        else:
            (self.checker.podgroup_deleted if deleted else self.checker.podgroup_upsert)(obj, now)
