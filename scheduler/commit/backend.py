"""The live backend of :func:`scheduler.cycle.run_cycle`: the cache in, the API server out.

``commit`` does, in this order: check leadership; bind every placed gang (each a transaction,
gangs concurrently); evict gangs left partial past their grace period; then start publishing
what users see (conditions, Events, PodGroup and Queue status, problems) in the background, so
status writes for a large backlog never delay the binds of the next cycle.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog

from scheduler.cache.problems import Problem
from scheduler.cluster.gang import Gang
from scheduler.cluster.snapshot import Snapshot
from scheduler.commit.staleness import StaleGang, StalenessTracker
from scheduler.commit.status import StatusPublisher, pod_ref
from scheduler.commit.transaction import Assumer, GangCommit, commit_gang
from scheduler.cycle import CommitResult
from scheduler.fairness import FairShareReport
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

    async def snapshot(self) -> Snapshot:
        """The cache's snapshot (built on the loop; the cache keeps it cheap)."""
        self.cycle += 1
        return self.cache.snapshot()

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
        commits: list[GangCommit] = list(
            await asyncio.gather(
                *(
                    commit_gang(o, pods, self.writer, self.cache, self.is_leader, cycle=cycle)
                    for o in placed
                )
            )
        )
        done = {c.gang: c for c in commits}
        bound = sum(len(c.bound) for c in commits)
        failed = sum(len(c.failed) for c in commits)
        if self.metrics is not None:
            self.metrics.binds.inc(bound)
            self.metrics.bind_failures.inc(failed)
        if not self.is_leader():
            return self._result(commits)
        stale = self.staleness.update(
            snapshot, self.clock(), placed=[c.gang for c in commits if c.complete], grace=self.grace
        )
        if stale:
            await self._evict(stale, cycle)
        self._unpublished.update({k: v for k, v in done.items() if v.bound or v.failed})
        if self._status_task is None or self._status_task.done():
            commits_to_tell, self._unpublished = self._unpublished, {}
            self._status_task = asyncio.create_task(
                self._publish(snapshot, placement, commits_to_tell, report, cycle),
                name=f"status-{cycle}",
            )
        return self._result(commits)

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
        """Wait for the status writes in flight (tests, clean shutdown)."""
        if self._status_task is not None:
            await asyncio.gather(self._status_task, return_exceptions=True)

    @staticmethod
    def _result(commits: Sequence[GangCommit]) -> CommitResult:
        return CommitResult(
            bound_gangs=tuple(c.gang for c in commits if c.complete),
            failed_gangs=tuple(c.gang for c in commits if c.failed),
            bound_pods=sum(len(c.bound) for c in commits),
            failed_pods=sum(len(c.failed) for c in commits),
        )

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
