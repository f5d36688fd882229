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

Taking back: a placement with evictions names, in ``waits_for``, the gangs that must wait for
their victims. Those gangs are *nominated* instead of bound (held on their nodes in the cache,
see :mod:`scheduler.commit.nominations`), the victims are evicted in the background, one victim
gang as a unit (:mod:`scheduler.commit.evict`), and each later commit first settles the
nominations: a gang whose victims are all gone is bound through the same path as any other
(assume, then bind with the uid precondition); one whose victims are not gone in time, or one
of whose victim gangs could not be evicted whole (a PodDisruptionBudget refused), is dropped
and pending again, so the next cycle re-plans. A replica that is not the leader drops its
nominations (it may not bind them) and evicts nothing.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import structlog

from scheduler.cache.problems import Problem
from scheduler.cluster.gang import Gang
from scheduler.cluster.pod import Pod
from scheduler.cluster.snapshot import Snapshot
from scheduler.commit.evict import EvictionMarks, evict_gang, group_by_victim_gang
from scheduler.commit.gpusharing import GpuSharing
from scheduler.commit.nominations import DEFAULT_NOMINATION_TIMEOUT, NominatedGang, Nominations
from scheduler.commit.staleness import StaleGang, StalenessTracker
from scheduler.commit.status import StatusPublisher, pod_ref
from scheduler.commit.transaction import Assumer, GangCommit, assume_gang, bind_gang
from scheduler.cycle import CommitResult
from scheduler.fairness import FairShareReport
from scheduler.k8s.errors import KubeError, NotFound
from scheduler.k8s.resources import PODGROUP
from scheduler.k8s.writer import ObjectRef, Writer
from scheduler.metrics import SchedulerMetrics
from scheduler.solver.placement import Eviction, GangOutcome, Placement, PodAssignment

__all__ = ["LiveBackend", "LiveCache"]

log = structlog.get_logger("scheduler.commit")

#: Longest stretch the commit assumes and dispatches gangs without letting binds run.
_YIELD_EVERY_SECONDS = 0.02


class LiveCache(Assumer, EvictionMarks, Protocol):
    """What the live backend needs from :class:`scheduler.cache.Cache`."""

    def nominate(
        self,
        pod_uid: str,
        node: str,
        gpu_grant: Mapping[int, int] | Iterable[tuple[int, int]] = (),
    ) -> None:
        """Hold ``node`` for a pending pod until it is bound or the nomination dropped."""
        ...

    def unnominate(self, pod_uid: str, *, wake: bool = True) -> None:
        """Drop a nomination."""
        ...

    def nominated(self) -> dict[str, str]:
        """Nominated pods: uid -> node."""
        ...

    def gone(self, pod_uid: str) -> bool:
        """No such pod, or it finished."""
        ...

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

    def note_moved(self, gangs: Iterable[str]) -> None:
        """Consolidation evicted ``gangs``: admit them first until they run again."""
        ...

    def restored(self, gang: str) -> None:
        """A moved gang is being bound again."""
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
        nomination_timeout: float = DEFAULT_NOMINATION_TIMEOUT,
        yield_every: float = _YIELD_EVERY_SECONDS,
        sharing: GpuSharing | None = None,
    ) -> None:
        self.cache = cache
        #: Reservation pods and device ConfigMaps for GPU-sharing pods (None: sharing off).
        self.sharing = sharing
        #: Longest stretch a commit assumes and dispatches gangs without letting binds run.
        self.yield_every = yield_every
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
        self._telling: set[asyncio.Task[Any]] = set()
        #: Pod key -> the last status.nominatedNodeName write for it (they run in order).
        self._nominated_writes: dict[str, asyncio.Task[None]] = {}
        #: Gangs whose binds are in flight (background tasks), by gang key.
        self._binding: dict[str, asyncio.Task[GangCommit]] = {}
        self._last: tuple[Snapshot, Placement, FairShareReport, int] | None = None
        #: Gangs held on their nodes until their victims are gone.
        self.nominations = Nominations(nomination_timeout)
        #: Evictions being sent (one task per cycle that evicts).
        self._evicting: set[asyncio.Task[None]] = set()

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
            self._drop_all("this replica is not the leader", cycle)
            return CommitResult()
        if not self._led:
            # Another replica may have written status and timed gangs meanwhile: start fresh.
            self.status = StatusPublisher(self.writer)
            self.staleness = StalenessTracker()
            self._led = True
        if self.sharing is not None:
            self.sharing.note_cycle(snapshot, placement)
        pods = {p.key: p for p in snapshot.pods}
        dispatched = self._settle_nominations(pods, cycle)
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
        leaving = {e.pod_uid for e in placement.evictions}
        skipped: list[GangCommit] = []
        last_yield = time.perf_counter()
        for o in placed:
            if time.perf_counter() - last_yield > self.yield_every:
                # A cycle that placed thousands of gangs would hold the loop for a second
                # assuming them all before the first bind goes out; let the binds already
                # dispatched start meanwhile. Every gang is still assumed before commit
                # returns, so the next snapshot counts them all.
                await asyncio.sleep(0)
                last_yield = time.perf_counter()
            if o.gang in self._binding or o.gang in self.nominations:
                # Extra members of a gang whose earlier binds are still going out: the next
                # cycle places them again once those have settled.
                continue
            if any(a.pod_uid in leaving for a in o.pods):
                # An evicted pod is deleted; its controller makes a new one to place.
                log.warning("placement_of_evicted_pod_skipped", gang=o.gang, cycle=cycle)
                continue
            victims = placement.waits_for.get(o.gang)
            commit = (
                self._nominate(o, victims, snapshot, placement, pods, cycle)
                if victims
                else assume_gang(o, pods, self.cache, self.is_leader, cycle=cycle)
            )
            if commit is not None:
                skipped.append(commit)
            elif not victims:
                dispatched += self._dispatch(o, pods, cycle)
        if not self.is_leader():
            return CommitResult(dispatched_pods=dispatched)
        if placement.evictions:
            self._start_evictions(placement, snapshot, cycle)
        stale = self.staleness.update(
            snapshot,
            self.clock(),
            placed=[
                o.gang for o in placed if o.gang in self._binding or o.gang in self.nominations
            ],
            grace=self.grace,
        )
        if stale:
            await self._evict(stale, cycle)
        self._observe_nominations()
        self._unpublished.update({c.gang: c for c in skipped if c.failed})
        self._last = (snapshot, placement, report, cycle)
        if not placement.deferred:
            # A cycle that left gangs for the next one has no outcome for them: the next
            # cycle (right after) publishes, with this one's bind results.
            self._start_publish()
        return CommitResult(
            failed_gangs=tuple(c.gang for c in skipped if c.failed),
            failed_pods=sum(len(c.failed) for c in skipped),
            dispatched_pods=dispatched,
        )

    def _dispatch(self, o: GangOutcome, pods: Mapping[str, Pod], cycle: int) -> int:
        """Start binding an assumed gang in the background; the number of pods."""
        self.cache.restored(o.gang)
        task = asyncio.create_task(
            bind_gang(o, pods, self.writer, self.cache, cycle=cycle, sharing=self.sharing),
            name=f"bind-{o.gang}",
        )
        self._binding[o.gang] = task
        task.add_done_callback(functools.partial(self._bound, o.gang))
        return len(o.pods)

    # --- nominations ---------------------------------------------------------------------

    def _nominate(
        self,
        o: GangOutcome,
        victims: Sequence[str],
        snapshot: Snapshot,
        placement: Placement,
        pods: Mapping[str, Pod],
        cycle: int,
    ) -> GangCommit | None:
        """Hold a gang that waits for evictions on its nodes; None when done, else why not
        (as :func:`assume_gang` answers)."""
        missing = [a for a in o.pods if a.pod_key not in pods]
        if missing:
            return GangCommit(
                o.gang, failed=[(a, "pod is no longer in the snapshot") for a in missing],
                skipped=True,
            )  # fmt: skip
        if not self.is_leader():
            return GangCommit(o.gang, skipped=True)
        where = {e.pod_uid: (e.gang, e.node) for e in placement.evictions}
        if any(uid not in where for uid in victims):
            # Waits for pods evicted earlier: name them from the snapshot.
            by_uid = snapshot.pod_by_uid
            for uid in victims:
                p = by_uid.get(uid)
                if uid not in where and p is not None:
                    where[uid] = (p.gang, p.node_name or "")
        gang = snapshot.gang_by_key.get(o.gang)
        for a in o.pods:
            self.cache.nominate(a.pod_uid, a.node, a.gpu_grant)
        nominated = self.nominations.add(
            o, victims, self.clock(), where, implicit=gang is None or gang.implicit
        )
        message = nominated.waiting_message(self.cache.gone)
        log.info(
            "nominated",
            gang=o.gang,
            queue=o.queue,
            node=",".join(nominated.nodes),
            pods=len(o.pods),
            victims=len(nominated.victims),
            cycle=cycle,
        )
        self._tell_preemptor(nominated, "WaitingForEvictions", message)
        self._mark_nominated(o.pods, held=True)
        return None

    def _mark_nominated(self, pods: Sequence[PodAssignment], *, held: bool) -> None:
        """Show (or clear) each held pod's node in its ``status.nominatedNodeName``, in the
        background; a pod gone meanwhile needs nothing."""
        for a in pods:
            # One write at a time per pod, in order: a clear never lands before its set.
            before = self._nominated_writes.get(a.pod_key)
            task = asyncio.create_task(
                self._write_nominated(before, a.pod_key, a.node if held else None),
                name=f"nominated-{a.pod_key}",
            )
            self._nominated_writes[a.pod_key] = task
            self._telling.add(task)
            task.add_done_callback(functools.partial(self._nominated_written, a.pod_key))

    def _nominated_written(self, key: str, task: asyncio.Task[None]) -> None:
        self._telling.discard(task)
        if self._nominated_writes.get(key) is task:
            del self._nominated_writes[key]

    async def _write_nominated(
        self, before: asyncio.Task[None] | None, key: str, node: str | None
    ) -> None:
        if before is not None:
            await asyncio.gather(before, return_exceptions=True)
        namespace, _, name = key.partition("/")
        try:
            await self.writer.set_nominated_node(namespace, name, node)
        except NotFound:
            pass  # the pod is gone: nothing to show
        except KubeError as e:
            log.warning("nominated_node_not_written", pod=key, error=e.message)

    def _settle_nominations(self, pods: Mapping[str, Pod], cycle: int) -> int:
        """Bind the nominated gangs whose victims are gone, drop the ones that waited too
        long; the number of pods whose binds were started."""
        if not len(self.nominations):
            return 0
        ready, expired = self.nominations.review(self.cache.gone, self.clock())
        for nominated, why in expired:
            self._drop(nominated.gang, why, cycle, failure="timeout")
        dispatched = 0
        for nominated in ready:
            self.nominations.pop(nominated.gang)
            lost = [
                a
                for a in nominated.outcome.pods
                if (p := pods.get(a.pod_key)) is None or p.uid != a.pod_uid or not p.nominated
            ]
            for uid in nominated.pod_uids:
                self.cache.unnominate(uid, wake=bool(lost))
            if lost:
                # A pod was deleted, recreated or bound meanwhile: place the gang again.
                self._mark_nominated(nominated.outcome.pods, held=False)
                log.warning(
                    "nomination_lost",
                    gang=nominated.gang,
                    queue=nominated.queue,
                    pods=[a.pod_key for a in lost],
                    cycle=cycle,
                )
                continue
            commit = assume_gang(nominated.outcome, pods, self.cache, self.is_leader, cycle=cycle)
            if commit is not None:
                self._unpublished[commit.gang] = commit
                continue
            log.info(
                "nominated_gang_binding",
                gang=nominated.gang,
                queue=nominated.queue,
                node=",".join(nominated.nodes),
                waited=round(self.clock() - nominated.since, 2),
                cycle=cycle,
            )
            dispatched += self._dispatch(nominated.outcome, pods, cycle)
        self._observe_nominations()
        return dispatched

    def _drop(
        self,
        gang: str,
        why: str,
        cycle: int,
        *,
        failure: str | None = None,
        tell: bool = True,
    ) -> None:
        """Give up a nomination: its pods are pending again and the next cycle re-plans."""
        nominated = self.nominations.pop(gang)
        if nominated is None:
            return
        for uid in nominated.pod_uids:
            self.cache.unnominate(uid)
        if failure is not None and self.metrics is not None:
            self.metrics.eviction_failures.labels(reason=failure).inc()
        log.warning(
            "nomination_dropped",
            gang=gang,
            queue=nominated.queue,
            node=",".join(nominated.nodes),
            reason=why,
            cycle=cycle,
        )
        self._observe_nominations()
        self._mark_nominated(nominated.outcome.pods, held=False)
        if tell:
            message = (
                f"gave up the place held on {', '.join(nominated.nodes)}: {why}; "
                "the gang will be placed again"
            )
            self._tell_preemptor(nominated, "NominationDropped", message, warning=True)

    def _drop_all(self, why: str, cycle: int) -> None:
        for nominated in self.nominations:
            self._drop(nominated.gang, why, cycle, tell=False)

    def _tell_preemptor(
        self,
        nominated: NominatedGang,
        reason: str,
        message: str,
        *,
        warning: bool = False,
    ) -> None:
        """An Event on the waiting gang: on its PodGroup, or on its pod for a lone pod."""
        refs: list[ObjectRef] = []
        if not nominated.implicit:
            namespace, _, name = nominated.gang.partition("/")
            refs.append(ObjectRef(PODGROUP.kind, PODGROUP.api_version, name, namespace))
        else:
            for a in nominated.outcome.pods:
                namespace, _, name = a.pod_key.partition("/")
                refs.append(ObjectRef("Pod", "v1", name, namespace, a.pod_uid))
        for ref in refs:
            task = asyncio.create_task(
                self.writer.event(ref, reason, message, warning=warning),
                name=f"tell-{nominated.gang}",
            )
            self._telling.add(task)
            task.add_done_callback(self._telling.discard)

    def _observe_nominations(self) -> None:
        if self.metrics is not None:
            self.metrics.nominated_pods.set(len(self.cache.nominated()))

    # --- evictions -----------------------------------------------------------------------

    def _start_evictions(self, placement: Placement, snapshot: Snapshot, cycle: int) -> None:
        """Evict the placement's victims in the background, each victim gang as a unit.

        Evictions for a gang that should wait for them but could not be nominated (a pod of
        it went away) are not sent: they would free room for nobody.
        """
        wanted = [
            e
            for e in placement.evictions
            if e.for_gang not in placement.waits_for or e.for_gang in self.nominations
        ]
        if len(wanted) < len(placement.evictions):
            log.warning(
                "evictions_skipped_preemptor_not_nominated",
                count=len(placement.evictions) - len(wanted),
                gangs=sorted(
                    {e.for_gang for e in placement.evictions} - {e.for_gang for e in wanted}
                ),
                cycle=cycle,
            )
        groups = group_by_victim_gang(wanted)
        if not groups:
            return
        implicit = {
            key for key in groups if (g := snapshot.gang_by_key.get(key)) is None or g.implicit
        }
        takers = {
            e.for_gang: g.queue
            for e in wanted
            if (g := snapshot.gang_by_key.get(e.for_gang)) is not None
        }
        task = asyncio.create_task(
            self._run_evictions(groups, implicit, cycle, takers), name=f"evict-{cycle}"
        )
        self._evicting.add(task)
        task.add_done_callback(self._evictions_done)

    async def _run_evictions(
        self,
        groups: Mapping[str, list[Eviction]],
        implicit: set[str],
        cycle: int,
        takers: Mapping[str, str],
    ) -> None:
        async def one(key: str, victims: list[Eviction]) -> None:
            result = await evict_gang(
                victims,
                self.writer,
                self.cache,
                metrics=self.metrics,
                cycle=cycle,
                podgroup_event=key not in implicit,
            )
            if result.done:  # told on both queues' status
                self.status.evicted(result.done, takers.get(result.done[0].for_gang))
                # A moved gang restarts into the room planned for it: nobody may take it first.
                self.cache.note_moved({e.gang for e in result.done if e.action == "consolidate"})
            if not result.complete:
                for nominated in self.nominations.waiting_on(result.not_done):
                    self._drop(nominated.gang, result.problem, cycle)

        await asyncio.gather(*(one(key, victims) for key, victims in groups.items()))

    def _evictions_done(self, task: asyncio.Task[None]) -> None:
        self._evicting.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("eviction_task_failed", error=repr(task.exception()))

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
                snapshot,
                placement.outcomes,
                commits,
                report,
                self.cache.problems(),
                cycle,
                waiting=self.nominations.messages(self.cache.gone),
            )
        except Exception:
            log.exception("status_publish_failed", cycle=cycle)

    async def flush(self) -> None:
        """Wait for the binds, evictions and status writes in flight (tests, clean
        shutdown)."""
        while self._binding or self._evicting:
            await asyncio.gather(
                *list(self._binding.values()), *list(self._evicting), return_exceptions=True
            )
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
                *(
                    self.writer.evict(p.namespace, p.name, p.uid, condition_reason=None)
                    for p in s.bound
                )
            )
            for pod, outcome in zip(s.bound, results, strict=True):
                if outcome.status == "evicted" and self.metrics is not None:
                    self.metrics.evictions.labels(action="stale_gang", queue=s.gang.queue).inc()
                if outcome:
                    await self.writer.event(pod_ref(pod), "Evicted", s.message, warning=True)
                else:
                    log.warning(
                        "stale_gang_eviction_not_done",
                        pod=pod.key,
                        gang=s.gang.key,
                        outcome=outcome.status,
                        error=outcome.message,
                        cycle=cycle,
                    )
