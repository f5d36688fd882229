"""The live backend of :func:`scheduler.cycle.run_cycle`: the cache in, the API server out.

``snapshot`` first reads back the assumed pods the watch has not confirmed for a while (a
slow or dead watch never makes a bound pod look pending; see :mod:`scheduler.cache.store`).

``commit`` does, in this order: check leadership; *assume* every member of every placed gang
(synchronously, so the next snapshot counts them); start each gang's binds as a background
task (binding streams, as kube-scheduler's binding cycle runs apart from its scheduling cycle,
so a cycle is never as long as its slowest bind and a backlog of thousands of pods does not
hold the next cycle); evict gangs left partial past their grace period; then start publishing
what users see (conditions, Events, PodGroup and Queue status, problems) in the background.
Bind results reach the metrics as each gang's binds finish, and users (Events, conditions)
with the next cycle's status pass.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog

from scheduler.cache.problems import Problem
from scheduler.cluster.gang import Gang
from scheduler.cluster.snapshot import Snapshot
from scheduler.commit.staleness import StaleGang, StalenessTracker
from scheduler.commit.status import StatusPublisher, pod_ref
from scheduler.commit.transaction import Assumer, GangCommit, assume_gang, bind_gang
from scheduler.cycle import CommitResult
from scheduler.fairness import FairShareReport
from scheduler.k8s.errors import KubeError
from scheduler.k8s.writer import Writer
from scheduler.metrics import SchedulerMetrics
from scheduler.solver.placement import GangOutcome, Placement, PodAssignment

__all__ = ["LiveBackend", "LiveCache"]

log = structlog.get_logger("scheduler.commit")


class LiveCache(Assumer, Protocol):
    """What the live backend needs from :class:`scheduler.cache.Cache`."""

    def snapshot(self, now: float | None = None) -> Snapshot:
        """An immutable view with assumed pods counted as bound."""
        ...

    def problems(self) -> list[Problem]:
        """Objects skipped and why."""
        ...

    def due_checks(self, now: float | None = None) -> list[tuple[str, str, str]]:
        """Assumed pods to read back now: (uid, namespace, name)."""
        ...

    def pod_gone(self, uid: str, namespace: str, name: str) -> None:
        """A read-back found no such pod."""
        ...


class LiveBackend:
    """Implements :class:`scheduler.cycle.Backend` on the cache and the API server."""

    def __init__(
        self,
        cache: LiveCache,
        writer: Writer,
        *,
        is_leader: Callable[[], bool] = lambda: True,
        metrics: SchedulerMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        grace: Callable[[Gang], float] | None = None,
    ) -> None:
        self.cache = cache
        self.writer = writer
        self.is_leader = is_leader
        self.metrics = metrics
        self.clock = clock
        self.grace = grace
        self.staleness = StalenessTracker()
        self.status = StatusPublisher(writer)
        self.cycle = 0
        self._led = True
        self._status_task: asyncio.Task[None] | None = None
        self._unpublished: dict[str, GangCommit] = {}
        #: Scheduled Events being sent for gangs whose binds finished.
        self._telling: set[asyncio.Task[None]] = set()
        #: Gangs whose binds are in flight (background tasks), by gang key.
        self._binding: dict[str, asyncio.Task[GangCommit]] = {}
        self._last: tuple[Snapshot, Placement, FairShareReport, int] | None = None

    @property
    def binds_in_flight(self) -> int:
        """Gangs whose binds have not finished yet."""
        return len(self._binding)

    async def snapshot(self) -> Snapshot:
        """The cache's snapshot, after reading back assumptions that are due (see above)."""
        self.cycle += 1
        due = self.cache.due_checks()
        if due:
            await self._read_back(due)
        return self.cache.snapshot()

    async def _read_back(self, due: Sequence[tuple[str, str, str]]) -> None:
        async def one(uid: str, namespace: str, name: str) -> None:
            try:
                pod = await self.writer.get_pod(namespace, name)
            except KubeError as e:
                log.warning("read_back_failed", pod=f"{namespace}/{name}", error=e.message)
                return
            if pod is None or (pod.get("metadata") or {}).get("uid") != uid:
                self.cache.pod_gone(uid, namespace, name)
            else:
                self.cache.observe_pod(pod)

        log.info("assumed_pods_read_back", count=len(due))
        if self.metrics is not None:
            self.metrics.read_backs.inc(len(due))
        await asyncio.gather(*(one(*d) for d in due))

    async def commit(
        self, snapshot: Snapshot, placement: Placement, report: FairShareReport
    ) -> CommitResult:
        """Bind, evict stale gangs, publish status (see module docstring)."""
        cycle = self.cycle
        if not self.is_leader():
            log.info("not_leader_skip_commit", cycle=cycle)
            self._led = False
            return CommitResult()
        if not self._led:
            # Another replica may have written status and timed gangs meanwhile: start fresh.
            self.status = StatusPublisher(self.writer)
            self.staleness = StalenessTracker()
            self._led = True
        pods = {p.key: p for p in snapshot.pods}
        placed = [o for o in placement.outcomes.values() if o.placed and o.pods]
        # Extra pods of gangs already satisfied may come as assignments without an outcome.
        covered = {a.pod_key for o in placed for a in o.pods}
        extras: dict[str, list[PodAssignment]] = {}
        for a in placement.assignments:
            if a.pod_key not in covered:
                extras.setdefault(a.gang, []).append(a)
        queue_of = {g.key: g.queue for g in snapshot.gangs}
        placed += [
            GangOutcome(g, queue_of.get(g, ""), True, tuple(items)) for g, items in extras.items()
        ]
        dispatched = 0
        skipped: list[GangCommit] = []
        for o in placed:
            if o.gang in self._binding:
                # Extra members of a gang whose earlier binds are still going out: the next
                # cycle places them again once those have settled.
                continue
            commit = assume_gang(o, pods, self.cache, self.is_leader, cycle=cycle)
            if commit is not None:
                skipped.append(commit)
                continue
            dispatched += len(o.pods)
            task = asyncio.create_task(
                bind_gang(o, pods, self.writer, self.cache, cycle=cycle), name=f"bind-{o.gang}"
            )
            self._binding[o.gang] = task
            task.add_done_callback(functools.partial(self._bound, o.gang))
        if not self.is_leader():
            return CommitResult(dispatched_pods=dispatched)
        stale = self.staleness.update(
            snapshot,
            self.clock(),
            placed=[o.gang for o in placed if o.gang in self._binding],
            grace=self.grace,
        )
        if stale:
            await self._evict(stale, cycle)
        self._unpublished.update({c.gang: c for c in skipped if c.failed})
        self._last = (snapshot, placement, report, cycle)
        self._start_publish()
        return CommitResult(
            failed_gangs=tuple(c.gang for c in skipped if c.failed),
            failed_pods=sum(len(c.failed) for c in skipped),
            dispatched_pods=dispatched,
        )

    def _bound(self, gang: str, task: asyncio.Task[GangCommit]) -> None:
        """A gang's binds finished: count them and queue them for the status publisher."""
        if self._binding.get(gang) is task:
            del self._binding[gang]
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            log.error("bind_task_failed", gang=gang, error=repr(error))
            return
        commit = task.result()
        if self.metrics is not None:
            self.metrics.binds.inc(len(commit.bound))
            self.metrics.bind_failures.inc(len(commit.failed))
        if commit.bound:
            # Scheduled Events go out as the binds land (the Event limiter bounds them).
            told = asyncio.create_task(self.status.scheduled(commit.bound), name=f"told-{gang}")
            self._telling.add(told)
            told.add_done_callback(self._telling.discard)
        if commit.failed:
            # Why they wait is told by the next cycle's status pass: running that whole pass
            # per finished gang would redo it thousands of times while a backlog binds.
            self._unpublished[gang] = GangCommit(gang, failed=commit.failed)

    def _start_publish(self) -> None:
        """Publish the newest cycle's view with every bind result not told yet, unless a
        publish is running (the next one reports the newest state)."""
        if self._last is None:
            return
        if self._status_task is not None and not self._status_task.done():
            return
        snapshot, placement, report, cycle = self._last
        commits_to_tell, self._unpublished = self._unpublished, {}
        self._status_task = asyncio.create_task(
            self._publish(snapshot, placement, commits_to_tell, report, cycle),
            name=f"status-{cycle}",
        )

    async def _publish(
        self,
        snapshot: Snapshot,
        placement: Placement,
        commits: dict[str, GangCommit],
        report: FairShareReport,
        cycle: int,
    ) -> None:
        """Status writes of one cycle, in the background so the next cycle's binds never wait
        for them. While one runs, later cycles skip theirs (the next one reports the newest
        state) but keep their bind results, so no Scheduled Event is lost."""
        if not self.is_leader():
            return
        try:
            await self.status.publish(
                snapshot, placement.outcomes, commits, report, self.cache.problems(), cycle
            )
        except Exception:
            log.exception("status_publish_failed", cycle=cycle)

    async def flush(self) -> None:
        """Wait for the binds and status writes in flight (tests, clean shutdown)."""
        while self._binding:
            await asyncio.gather(*list(self._binding.values()), return_exceptions=True)
        if self._telling:
            await asyncio.gather(*list(self._telling), return_exceptions=True)
        if self._status_task is not None:
            await asyncio.gather(self._status_task, return_exceptions=True)
        if self._unpublished:
            self._start_publish()
            if self._status_task is not None:
                await asyncio.gather(self._status_task, return_exceptions=True)

    async def _evict(self, stale: Sequence[StaleGang], cycle: int) -> None:
        for s in stale:
            log.warning(
                "gang_stale_evicting",
                gang=s.gang.key,
                queue=s.gang.queue,
                bound=len(s.bound),
                min_member=s.gang.min_member,
                cycle=cycle,
            )
            results = await asyncio.gather(
                *(self.writer.evict(p.namespace, p.name, p.uid) for p in s.bound)
            )
            for pod, ok in zip(s.bound, results, strict=True):
                if ok and self.metrics is not None:
                    self.metrics.evictions.labels(reason="stale_gang").inc()
                if ok:
                    await self.writer.event(pod_ref(pod), "Evicted", s.message, warning=True)
