"""One gang's commit as a transaction: record grants, assume, bind all at once, forget failures.

Order matters for restarts and for the next cycle:

1. The GPU device grant is written to each pod (annotation) *before* its bind, so whoever
   reads the bound pod later - a restarted scheduler included - knows its devices.
2. Every pod is *assumed* in the cache before its bind is sent, so the next snapshot already
   counts it as placed even if the watch event arrives late (no double placement).
3. Binds go out concurrently. A pod whose bind fails for good is *forgotten*, so its resources
   come back. If some members bound and others failed, the gang is partial; the staleness
   tracker evicts it if it stays partial past its grace period.

Leadership is checked right before the binds go out: a replica that lost the Lease while
solving binds nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from scheduler.cluster.pod import Pod
from scheduler.k8s.errors import KubeError
from scheduler.k8s.writer import BindOutcome, Writer
from scheduler.solver.placement import GangOutcome, PodAssignment

__all__ = ["Assumer", "GangCommit", "commit_gang"]

log = structlog.get_logger("scheduler.commit")


class Assumer(Protocol):
    """The part of the cache a commit needs."""

    def assume(
        self,
        pod_uid: str,
        node: str,
        gpu_grant: Mapping[int, int] | Iterable[tuple[int, int]] = (),
    ) -> None:
        """Treat the pod as bound to ``node`` (with its device grant) until the watch says so."""
        ...

    def forget(self, pod_uid: str) -> None:
        """Drop an assumption whose bind failed."""
        ...


@dataclass
class GangCommit:
    """What happened to one gang's binds."""

    gang: str
    bound: list[PodAssignment] = field(default_factory=list)
    failed: list[tuple[PodAssignment, str]] = field(default_factory=list)
    #: True when the binds were not attempted (lost leadership, or a grant write failed).
    skipped: bool = False

    @property
    def complete(self) -> bool:
        """Every assigned pod is bound."""
        return not self.failed and not self.skipped and bool(self.bound)

    @property
    def partial(self) -> bool:
        """Some members bound, some failed."""
        return bool(self.bound) and bool(self.failed)


async def _record_grants(
    writer: Writer, assignments: Sequence[PodAssignment], pods: Mapping[str, Pod]
) -> list[tuple[PodAssignment, str]]:
    """Write grant annotations; returns the assignments whose write failed (with why)."""

    async def one(a: PodAssignment) -> str:
        pod = pods.get(a.pod_key)
        if pod is None:
            return "pod is no longer in the snapshot"
        if not a.gpu_grant:
            return ""
        try:
            await writer.record_grant(pod.namespace, pod.name, dict(a.gpu_grant))
        except KubeError as e:
            return e.message
        return ""

    errors = await asyncio.gather(*(one(a) for a in assignments))
    return [(a, err) for a, err in zip(assignments, errors, strict=True) if err]


async def commit_gang(
    outcome: GangOutcome,
    pods: Mapping[str, Pod],
    writer: Writer,
    cache: Assumer,
    is_leader: Callable[[], bool],
    *,
    cycle: int = 0,
) -> GangCommit:
    """Bind every pod of a placed gang (see module docstring). Never raises for API errors."""
    result = GangCommit(outcome.gang)
    queue = outcome.queue or None
    assignments = list(outcome.pods)
    if not assignments:
        return result
    bad = await _record_grants(writer, assignments, pods)
    if bad:
        # Without the grant recorded a restart could double-book devices: bind nothing now
        # (nothing of this gang is assumed yet), the next cycle tries again.
        result.skipped = True
        result.failed = bad
        for a, err in bad:
            log.warning(
                "grant_write_failed",
                pod=a.pod_key,
                gang=a.gang,
                queue=queue,
                error=err,
                cycle=cycle,
            )
        return result
    if not is_leader():
        result.skipped = True
        log.info("commit_skipped_not_leader", gang=outcome.gang, cycle=cycle)
        return result
    for a in assignments:
        cache.assume(a.pod_uid, a.node, a.gpu_grant)

    async def bind(a: PodAssignment) -> BindOutcome:
        pod = pods[a.pod_key]
        return await writer.bind(pod.namespace, pod.name, pod.uid, a.node)

    outcomes = await asyncio.gather(*(bind(a) for a in assignments), return_exceptions=True)
    for a, out in zip(assignments, outcomes, strict=True):
        if isinstance(out, BindOutcome) and out.bound:
            result.bound.append(a)
            log.info(
                "bound",
                pod=a.pod_key,
                gang=a.gang,
                queue=queue,
                node=a.node,
                cycle=cycle,
                gpu_grant=dict(a.gpu_grant) or None,
            )
            continue
        error = out.error if isinstance(out, BindOutcome) else str(out)
        cache.forget(a.pod_uid)
        result.failed.append((a, error))
        log.warning(
            "bind_failed",
            pod=a.pod_key,
            gang=a.gang,
            queue=queue,
            node=a.node,
            error=error,
            cycle=cycle,
        )
    if result.partial:
        log.warning(
            "gang_partial",
            gang=outcome.gang,
            bound=len(result.bound),
            failed=len(result.failed),
            cycle=cycle,
        )
    return result
