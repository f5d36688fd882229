"""List, then watch, every kind the scheduler needs, feeding a :class:`Cache`.

One task per kind runs rounds of:

1. **list** (paged) when there is no resourceVersion to resume from; the result replaces the
   kind in the cache (``Cache.relisted``), and the first list of every kind sets ``synced``;
2. **watch** from the list's resourceVersion with ``allowWatchBookmarks``; BOOKMARK events only
   move the resourceVersion forward; the server ends a watch after ``timeoutSeconds`` and the
   next round resumes from the last resourceVersion seen.

Bookmarks are also the heartbeat: the API server sends one on every idle watch about once a
minute, so a watch silent for ``heartbeat_timeout`` seconds is dead (a half-open connection, a
stalled proxy) and is dropped and resumed, instead of waiting out the whole server-side
timeout (which took 6-11 minutes before).

``410 Gone`` (history compacted) means list again. Temporary failures (connection refused
while the API server restarts, 5xx, 429, timeouts) and permanent ones (403 from RBAC) are
logged and retried with capped exponential back-off and jitter; other kinds keep going
meanwhile. A kind in :attr:`Watcher.optional` whose list answers 404 (its CRD is not installed)
counts as listed with no objects, so it never holds up the first cycle: plain pods are
scheduled, and only what needs that kind waits; the list is retried with back-off and the kind
appears once its CRD is installed (Volcano's kinds say so once, at info level: they are
optional extras). Kinds are known by :attr:`ResourceKind.key` (``VolcanoPodGroup`` for
Volcano's PodGroup). A kind in :attr:`Watcher.degradable`
(PodDisruptionBudgets) is treated the same way when its list is *forbidden* too (an RBAC role
from before the kind was watched): the scheduler works without it, logs how to grant it, and
keeps retrying. A bug in a kind task is not retried: :meth:`Watcher.run`
cancels the other tasks and re-raises, so the process stops instead of limping on.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import structlog
from kubernetes_asyncio.client import ApiClient

from scheduler.k8s.client import open_stream, request_json
from scheduler.k8s.errors import (
    Forbidden,
    Gone,
    KubeError,
    NotFound,
    PermanentError,
    TemporaryError,
    error_for_status,
    translate,
)
from scheduler.k8s.resources import (
    DEGRADABLE_KINDS,
    VOLCANO_KINDS,
    WATCHED_KINDS,
    ResourceKind,
    kind_of,
)

__all__ = ["FIELD_SELECTORS", "EventSink", "WatchSettings", "Watcher"]

log = structlog.get_logger("scheduler.k8s.watch")

#: Longest stretch a watch task handles buffered events before letting other tasks run.
_YIELD_EVERY_SECONDS = 0.02


class EventSink(Protocol):
    """What the watcher feeds (implemented by :class:`scheduler.cache.Cache`)."""

    def apply(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        """One ADDED/MODIFIED/DELETED event."""
        ...

    def relisted(self, kind: str, objs: Iterable[dict[str, Any]]) -> None:
        """Every object of ``kind`` after a full list."""
        ...

    def relist_done(self, kind: str, listed: AbstractSet[tuple[str, str]]) -> None:
        """A list of ``kind`` whose pages went in through :meth:`apply` has ended: objects
        not in ``listed`` (namespace, name) are gone."""
        ...


@dataclass(frozen=True)
class WatchSettings:
    """Timings of list and watch."""

    #: Objects per list page (``limit``); big clusters are listed in pages.
    page_size: int = 500
    #: Server-side watch duration in seconds; each watch gets a random value in [t, 2t) so
    #: many watches do not reconnect together.
    watch_timeout: int = 300
    #: Seconds to wait for a TCP connection.
    connect_timeout: float = 10.0
    #: Extra seconds of silence beyond ``watch_timeout`` before a watch counts as dead.
    read_grace: float = 60.0
    #: Seconds without any line (event or bookmark) after which a watch counts as dead; the
    #: API server sends a bookmark on an idle watch about every 60 s.
    heartbeat_timeout: float = 90.0
    #: Seconds for one list page.
    list_timeout: float = 60.0
    #: First retry delay after a failure; doubles per consecutive failure up to ``backoff_max``.
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    #: A watch that ends sooner than this with no events counts as a failure (back off).
    min_watch_seconds: float = 1.0


#: Server-side filters per kind. Finished pods are NOT filtered (unlike kube-scheduler's
#: informer): a gang member that succeeded still counts toward its gang's minMember, so a gang
#: whose first workers finish is neither reported as partial nor evicted as stale, and its
#: PodGroup can report Succeeded. They hold no resources (see Pod.active).
FIELD_SELECTORS: dict[str, str] = {}


class _Relist(Exception):
    """The resourceVersion is gone: list again."""


class Watcher:
    """List and watch ``kinds`` into ``cache`` (see the module docstring).

    ``sleep`` and ``rng`` are injectable so tests can run without real delays.
    """

    def __init__(
        self,
        api: ApiClient,
        cache: EventSink,
        kinds: Iterable[str | ResourceKind] = WATCHED_KINDS,
        *,
        settings: WatchSettings | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: Callable[[], float] = random.random,
        on_restart: Callable[[str], None] | None = None,
    ) -> None:
        self.api = api
        self.cache = cache
        self.kinds: tuple[ResourceKind, ...] = tuple(
            k if isinstance(k, ResourceKind) else kind_of(k) for k in kinds
        )
        self.settings = settings or WatchSettings()
        self._sleep = sleep
        self._rng = rng
        #: Called with the kind whenever a watch ends abnormally (for a metric).
        self._on_restart = on_restart
        #: Set once every kind has been listed once; no cycle may run before.
        self.synced = asyncio.Event()
        #: Kinds listed at least once.
        self.listed: set[str] = set()
        #: Last resourceVersion seen per listed kind: where the next watch of that kind resumes.
        self.resource_versions: dict[str, str] = {}
        #: Number of full lists per kind (1 + relists).
        self.list_count: dict[str, int] = {}
        #: Last error per kind, None once the kind is healthy again (for readiness/metrics).
        self.errors: dict[str, KubeError | None] = {}
        #: Kinds whose API is not installed (list answered 404): empty until it appears.
        self.absent: set[str] = set()
        #: Kinds that may be absent (CRDs): everything outside the core and built-in groups.
        self.optional: frozenset[str] = frozenset(
            k.key for k in self.kinds if k.group and not k.group.endswith("k8s.io")
        )
        #: Kinds whose list may also be forbidden without holding up the sync.
        self.degradable: frozenset[str] = frozenset(
            k.key for k in self.kinds if k.key in DEGRADABLE_KINDS
        )

    # --- driving -----------------------------------------------------------------------

    async def run(self, iterations: int | None = None) -> None:
        """Watch every kind until cancelled, or for ``iterations`` rounds per kind.

        A round is one list or one watch (however it ended). If a kind's task fails with an
        unexpected exception, the others are cancelled and the exception propagates. Calling
        ``run`` again resumes each listed kind's watch from :attr:`resource_versions`.
        """
        if not self.kinds:
            self.synced.set()
            return
        tasks = [
            asyncio.create_task(self._run_kind(kind, iterations), name=f"watch-{kind.key}")
            for kind in self.kinds
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    log.error(
                        "watch_task_crashed",
                        kind=task.get_name().removeprefix("watch-"),
                        error=repr(task.exception()),
                    )
                    task.result()  # re-raise
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def backoff(self, failures: int) -> float:
        """Delay before retry number ``failures`` (1-based): exponential, capped, with jitter
        in [50%, 100%] so many clients do not retry in step."""
        s = self.settings
        delay = min(s.backoff_max, s.backoff_base * 2 ** max(0, failures - 1))
        return float(delay * (0.5 + 0.5 * self._rng()))

    async def _run_kind(self, kind: ResourceKind, iterations: int | None) -> None:
        rv = self.resource_versions.get(kind.key) if kind.key in self.listed else None
        # ``rv`` None means: list first (the initial sync, or after 410 Gone).
        failures = 0
        rounds = 0
        while iterations is None or rounds < iterations:
            rounds += 1
            try:
                if rv is None:
                    rv = await self._list(kind)
                    healthy = True
                else:
                    rv, healthy = await self._watch(kind, rv)
            except _Relist:
                log.info("watch_relist", kind=kind.key, resource_version=rv, reason="Gone")
                self.resource_versions.pop(kind.key, None)
                rv = None
                continue
            except KubeError as e:
                failures += 1
                self.errors[kind.key] = e
                if self._on_restart is not None:
                    self._on_restart(kind.key)
                if rv is None and self._may_work_without(kind, e):
                    self._mark_absent(kind)
                hint = e.retry_after if isinstance(e, TemporaryError) else None
                delay = hint if hint else self.backoff(failures)
                warming = (
                    isinstance(e, Forbidden)
                    and kind.key in self.listed
                    and kind.key not in self.absent
                )
                if warming:
                    # We were allowed before: a restarted API server answers 403 for a few
                    # seconds while its RBAC caches fill. Retry soon instead of going blind
                    # for a long back-off (seen in the chaos runs).
                    delay = min(delay, self.settings.backoff_base * 2)
                self._log_failure(kind, rv, e, failures, delay, transient=warming)
                if iterations is not None and rounds >= iterations:
                    return
                await self._sleep(delay)
                continue
            if healthy:
                failures = 0
                self.errors[kind.key] = None
            else:
                failures += 1
                await self._sleep(self.backoff(failures))

    def _log_failure(
        self,
        kind: ResourceKind,
        rv: str | None,
        e: KubeError,
        failures: int,
        delay: float,
        *,
        transient: bool = False,
    ) -> None:
        fields: dict[str, Any] = {
            "kind": kind.key,
            "resource_version": rv,
            "reason": type(e).__name__,
            "error": e.message,
            "attempt": failures,
            "retry_in": round(delay, 2),
        }
        if isinstance(e, Forbidden) and kind.key in self.degradable:
            log.error(
                "watch_kind_forbidden_working_without",
                fix=f"grant list and watch on {kind.plural}.{kind.group or 'core'} to the "
                "scheduler's ServiceAccount (see manifests/20-rbac.yaml)",
                **fields,
            )
        elif isinstance(e, NotFound) and kind.key in VOLCANO_KINDS:
            # Volcano's API is optional: without its CRDs nothing needs it. Said once.
            (log.info if failures == 1 else log.debug)(
                "watch_kind_not_installed",
                note=f"optional: {kind.plural}.{kind.group} is read when Volcano's CRDs are "
                "installed; until then nothing needs it",
                **fields,
            )
        elif isinstance(e, NotFound) and kind.group:
            log.error(
                "watch_kind_not_installed",
                fix=f"install the CRD for {kind.plural}.{kind.group} "
                f"(version {kind.version}), e.g. kubectl apply -f crds/",
                **fields,
            )
        elif isinstance(e, PermanentError) and not transient:
            log.error("watch_failed", **fields)
        else:
            log.warning("watch_interrupted", **fields)

    def _may_work_without(self, kind: ResourceKind, e: KubeError) -> bool:
        """Whether a failed first list of ``kind`` counts as listed with no objects."""
        if isinstance(e, NotFound):
            return kind.key in self.optional or kind.key in self.degradable
        return isinstance(e, Forbidden) and kind.key in self.degradable

    def _mark_absent(self, kind: ResourceKind) -> None:
        """An optional kind's API is not installed: it has no objects, and it counts as
        listed for the initial sync (see the module docstring)."""
        if kind.key not in self.absent:
            self.absent.add(kind.key)
            self.cache.relist_done(kind.key, set())
            note = getattr(self.cache, "set_absent", None)
            if note is not None:
                note(kind.key, True)
        self._listed(kind)

    def _listed(self, kind: ResourceKind) -> None:
        if kind.key not in self.listed:
            self.listed.add(kind.key)
            if len(self.listed) == len(self.kinds):
                log.info("synced", kinds=sorted(self.listed), absent=sorted(self.absent))
                self.synced.set()

    # --- list --------------------------------------------------------------------------

    async def _list(self, kind: ResourceKind) -> str:
        """List every object of ``kind`` (paged) into the cache; returns the resourceVersion.

        Each page goes into the cache as it arrives, while the next one is already being
        fetched: parsing 10,000 pods costs about as much as the API server takes to send
        them, so the two overlap instead of adding up (the first cycle after a restart
        starts that much sooner). Objects are only removed at the end, once the whole list
        says which are gone, so a cycle never sees a half-listed kind as deletions.
        """
        listed: set[tuple[str, str]] = set()
        restarts = 0
        token: str | None = None
        fetch = asyncio.ensure_future(self._page(kind, token))
        try:
            while True:
                try:
                    page = await fetch
                except Gone:
                    # The continue token expired between pages: start the list over (a few
                    # times; after that the failure goes through the normal back-off).
                    restarts += 1
                    if token is None or restarts > 3:
                        raise
                    log.info("list_restart", kind=kind.key, reason="continue token expired")
                    listed, token = set(), None
                    fetch = asyncio.ensure_future(self._page(kind, token))
                    continue
                meta = page.get("metadata") or {}
                token = meta.get("continue") or None
                if token is not None:
                    fetch = asyncio.ensure_future(self._page(kind, token))
                    # Let the request go out before this page is parsed (a task starts only
                    # when the loop gets control), so the server works meanwhile.
                    await asyncio.sleep(0)
                for item in page.get("items") or []:
                    item.setdefault("kind", kind.kind)
                    item.setdefault("apiVersion", kind.api_version)
                    item_meta = item.get("metadata") or {}
                    listed.add((item_meta.get("namespace") or "", item_meta.get("name") or ""))
                    self.cache.apply(kind.key, "MODIFIED", item)
                if token is None:
                    rv = str(meta.get("resourceVersion") or "")
                    break
                # Let probes and the lease run between pages.
                await asyncio.sleep(0)
        finally:
            if not fetch.done():
                fetch.cancel()
            elif not fetch.cancelled():
                fetch.exception()  # retrieved: an error here was raised or is superseded
        self.cache.relist_done(kind.key, listed)
        self.resource_versions[kind.key] = rv
        self.list_count[kind.key] = self.list_count.get(kind.key, 0) + 1
        log.info("listed", kind=kind.key, resource_version=rv, count=len(listed))
        if kind.key in self.absent:
            self.absent.discard(kind.key)
            log.info("watch_kind_installed", kind=kind.key)
            note = getattr(self.cache, "set_absent", None)
            if note is not None:
                note(kind.key, False)
        self._listed(kind)
        return rv

    async def _page(self, kind: ResourceKind, token: str | None) -> dict[str, Any]:
        query = {
            "limit": self.settings.page_size,
            "continue": token,
            "fieldSelector": FIELD_SELECTORS.get(kind.key),
        }
        page = await request_json(
            self.api, "GET", kind.list_path(), query=query, timeout=self.settings.list_timeout
        )
        if not isinstance(page, dict):
            raise error_for_status(500, "list returned no object", what=f"list {kind.plural}")
        return page

    # --- watch -------------------------------------------------------------------------

    async def _watch(self, kind: ResourceKind, rv: str) -> tuple[str, bool]:
        """Watch from ``rv`` until the server ends the stream; returns the last resourceVersion
        and whether the watch was healthy (delivered something or lasted a while)."""
        s = self.settings
        server_timeout = s.watch_timeout + int(self._rng() * s.watch_timeout)
        query = {
            "watch": True,
            "resourceVersion": rv,
            "allowWatchBookmarks": True,
            "timeoutSeconds": server_timeout,
            "fieldSelector": FIELD_SELECTORS.get(kind.key),
        }
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=s.connect_timeout,
            sock_connect=s.connect_timeout,
            sock_read=min(server_timeout + s.read_grace, s.heartbeat_timeout),
        )
        started = time.monotonic()
        events = 0
        try:
            response = await open_stream(self.api, kind.list_path(), query=query, timeout=timeout)
        except Gone as e:
            raise _Relist() from e
        try:
            async with response:
                last_yield = time.monotonic()
                while True:
                    try:
                        line = await response.content.readline()
                    except (TimeoutError, aiohttp.ClientError, ValueError) as e:
                        raise translate(e, f"watch {kind.plural}") from e
                    if not line:
                        break  # the server ended the watch (timeoutSeconds) or the connection
                    rv = self._handle_line(kind, line, rv)
                    events += 1
                    # readline() returns buffered lines without suspending, so a burst of
                    # events would hold the loop; give other tasks (probes, binds) a turn.
                    if time.monotonic() - last_yield > _YIELD_EVERY_SECONDS:
                        await asyncio.sleep(0)
                        last_yield = time.monotonic()
        finally:
            self.resource_versions[kind.key] = rv
        healthy = events > 0 or time.monotonic() - started >= s.min_watch_seconds
        return rv, healthy

    def _handle_line(self, kind: ResourceKind, line: bytes, rv: str) -> str:
        try:
            event = json.loads(line)
            event_type = event["type"]
            obj = event["object"]
        except (ValueError, KeyError, TypeError) as e:
            raise error_for_status(
                502, f"undecodable watch event: {line[:200]!r}", what=f"watch {kind.plural}"
            ) from e
        if event_type == "ERROR":
            status = int(obj.get("code") or 500) if isinstance(obj, dict) else 500
            if status == 410:
                raise _Relist()
            raise error_for_status(status, obj, what=f"watch {kind.plural}")
        new_rv = str(((obj or {}).get("metadata") or {}).get("resourceVersion") or rv)
        if event_type == "BOOKMARK":
            return new_rv
        obj.setdefault("kind", kind.kind)
        obj.setdefault("apiVersion", kind.api_version)
        self.cache.apply(kind.key, event_type, obj)
        return new_rv
