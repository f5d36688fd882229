"""Taking back: evicting the victims of a placement, one victim gang as a unit.

A victim gang goes whole (``shrink`` lists only the pods beyond ``minMember``), so the pods of
one victim gang are evicted in order - the first alone, the rest in small batches - and the
first refusal (a PodDisruptionBudget) or error stops the rest of that gang where it still can:
pods already evicted are gone, the others keep running (the staleness tracker takes a gang
left partial down after its grace period), and the caller drops every plan that counted on
this gang, so the next cycle re-plans with what is there. Different victim gangs are evicted
concurrently.

Before a pod's eviction is sent it is marked in the cache (``Cache.evicted``), so a cycle that
runs while evictions are in flight already sees it going and does not pick it again; a pod
whose eviction did not happen is unmarked.

Each evicted pod gets ``DisruptionTarget=True`` (written by the writer first) and an Event whose
reason names the action - ``Preempted``, ``Reclaimed``, ``Consolidated``, ``Shrunk`` - and whose
message (from the plan) says who took its place and why.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from scheduler.k8s.resources import PODGROUP
from scheduler.k8s.writer import EvictOutcome, ObjectRef, Writer
from scheduler.metrics import SchedulerMetrics
from scheduler.solver.placement import EvictAction, Eviction

__all__ = [
    "EVENT_REASONS",
    "EvictionMarks",
    "VictimGang",
    "evict_gang",
    "eviction_message",
    "group_by_victim_gang",
]

log = structlog.get_logger("scheduler.commit.evict")

#: The Event reason a victim gets, per action.
EVENT_REASONS: dict[EvictAction, str] = {
    "preempt": "Preempted",
    "reclaim": "Reclaimed",
    "consolidate": "Consolidated",
    "shrink": "Shrunk",
}

_VERBS: dict[EvictAction, str] = {
    "preempt": "preempted",
    "reclaim": "reclaimed",
    "consolidate": "moved (consolidation)",
    "shrink": "removed from its elastic gang",
}


class EvictionMarks(Protocol):
    """The part of the cache evictions update (see :class:`scheduler.cache.Cache`)."""

    def evicted(self, pod_uid: str) -> None:
        """Show the pod as terminating until the watch does."""
        ...

    def unevict(self, pod_uid: str) -> None:
        """Its eviction did not happen after all."""
        ...

    def pod_gone(self, uid: str, namespace: str, name: str) -> None:
        """The API server has no such pod."""
        ...


def eviction_message(e: Eviction) -> str:
    """The victim's Event message: the plan's own sentence, else a plain one."""
    return e.message or f"{_VERBS[e.action]} by the scheduler to make room for {e.for_gang}"


@dataclass
class VictimGang:
    """How the eviction of one victim gang went."""

    gang: str
    queue: str
    #: Evicted now, or already gone.
    done: list[Eviction] = field(default_factory=list)
    #: Refused by a PodDisruptionBudget, with the API's words.
    refused: list[tuple[Eviction, str]] = field(default_factory=list)
    #: Other failures (API errors, lost leadership).
    failed: list[tuple[Eviction, str]] = field(default_factory=list)
    #: Not tried: an earlier pod of the gang was refused or failed.
    skipped: list[Eviction] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every pod of the gang is evicted or gone."""
        return not (self.refused or self.failed or self.skipped)

    @property
    def not_done(self) -> set[str]:
        """Uids of the pods still running because of this gang's refusal or failure."""
        return {e.pod_uid for e, _ in self.refused + self.failed} | {
            e.pod_uid for e in self.skipped
        }

    @property
    def problem(self) -> str:
        """Why the gang was not evicted whole (empty when it was)."""
        if self.refused:
            e, why = self.refused[0]
            return f"eviction of {e.pod_key} ({self.gang}) {why}"
        if self.failed:
            e, why = self.failed[0]
            return f"eviction of {e.pod_key} ({self.gang}) failed: {why}"
        return ""


def group_by_victim_gang(evictions: Iterable[Eviction]) -> dict[str, list[Eviction]]:
    """Evictions by victim gang, each pod once, in plan order."""
    groups: dict[str, list[Eviction]] = {}
    seen: set[str] = set()
    for e in evictions:
        if e.pod_uid in seen:
            continue
        seen.add(e.pod_uid)
        groups.setdefault(e.gang, []).append(e)
    return groups


async def evict_gang(
    evictions: Sequence[Eviction],
    writer: Writer,
    cache: EvictionMarks,
    *,
    metrics: SchedulerMetrics | None = None,
    cycle: int = 0,
    batch: int = 4,
    podgroup_event: bool = True,
) -> VictimGang:
    """Evict the pods of one victim gang (see the module docstring); never raises for API
    errors. ``podgroup_event``: also tell the victim's PodGroup (not for implicit gangs)."""
    first = evictions[0]
    result = VictimGang(first.gang, first.queue)
    for e in evictions:
        cache.evicted(e.pod_uid)
    size = 1
    i = 0
    while i < len(evictions):
        window = evictions[i : i + size]
        i += len(window)
        size = max(1, batch)
        outcomes = await asyncio.gather(*(_evict_one(e, writer) for e in window))
        for e, out in zip(window, outcomes, strict=True):
            _settle(e, out, result, cache, metrics, cycle)
        if result.refused or result.failed:
            result.skipped = list(evictions[i:])
            for e in result.skipped:
                cache.unevict(e.pod_uid)
            break
    tells = [_tell(writer, e) for e in result.done]
    if podgroup_event and result.done:
        tells.append(_tell_podgroup(writer, result))
    if tells:
        await asyncio.gather(*tells)
    if not result.complete:
        log.warning(
            "victim_gang_not_evicted_whole",
            gang=result.gang,
            queue=result.queue,
            evicted=len(result.done),
            refused=len(result.refused),
            failed=len(result.failed),
            skipped=len(result.skipped),
            reason=result.problem,
            cycle=cycle,
        )
    return result


async def _evict_one(e: Eviction, writer: Writer) -> EvictOutcome:
    namespace, _, name = e.pod_key.partition("/")
    return await writer.evict(namespace, name, e.pod_uid, message=eviction_message(e))


def _settle(
    e: Eviction,
    out: EvictOutcome,
    result: VictimGang,
    cache: EvictionMarks,
    metrics: SchedulerMetrics | None,
    cycle: int,
) -> None:
    fields = {
        "pod": e.pod_key,
        "gang": e.gang,
        "queue": e.queue,
        "node": e.node,
        "action": e.action,
        "for_gang": e.for_gang,
        "cycle": cycle,
    }
    if out.status == "evicted":
        result.done.append(e)
        if metrics is not None:
            metrics.evictions.labels(action=e.action, queue=e.queue).inc()
        log.info("evicted", **fields)
        return
    if out.status == "gone":
        result.done.append(e)
        namespace, _, name = e.pod_key.partition("/")
        cache.pod_gone(e.pod_uid, namespace, name)
        log.info("eviction_target_gone", **fields)
        return
    cache.unevict(e.pod_uid)
    if out.status == "refused":
        result.refused.append((e, out.message))
        reason = "pdb"
    else:
        result.failed.append((e, out.message))
        reason = "not_leader" if out.status == "not_leader" else "error"
    if metrics is not None:
        metrics.eviction_failures.labels(reason=reason).inc()
    log.warning("eviction_not_done", outcome=out.status, error=out.message, **fields)


async def _tell(writer: Writer, e: Eviction) -> None:
    namespace, _, name = e.pod_key.partition("/")
    ref = ObjectRef("Pod", "v1", name, namespace, e.pod_uid)
    await writer.event(ref, EVENT_REASONS[e.action], eviction_message(e))


async def _tell_podgroup(writer: Writer, result: VictimGang) -> None:
    namespace, _, name = result.gang.partition("/")
    first = result.done[0]
    count = len(result.done)
    message = (
        f"{count} pod{'s' if count != 1 else ''} {_VERBS[first.action]} for "
        f"{first.for_gang}: {eviction_message(first)}"
    )
    ref = ObjectRef(PODGROUP.kind, PODGROUP.api_version, name, namespace)
    await writer.event(ref, EVENT_REASONS[first.action], message)
