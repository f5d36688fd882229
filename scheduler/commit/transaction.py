"""One gang's commit as a transaction: assume every member, bind them all, settle each outcome.

Order matters for restarts and for the next cycle:

1. Every pod is *assumed* in the cache (with its GPU grant) before its bind is sent, so the
   next snapshot already counts it as placed even if the watch event arrives late.
2. Binds go out concurrently, each carrying the pod's GPU grant in the Binding's metadata
   (the API server writes node and grant onto the pod in one write; see
   :mod:`scheduler.k8s.writer`), so a restarted scheduler reads exact device accounting from
   the bound pods alone and no grant is ever written without its bind.
3. Each outcome is settled in the cache: a bind that succeeded stays assumed until the watch
   (or a read-back) shows the pod bound; a bind whose answer was lost stays assumed as
   *uncertain* until a read-back proves where the pod is; only a bind refused for good is
   *forgotten*, giving its resources back. If some members bound and others were refused, the
   gang is partial; the staleness tracker evicts it if it stays partial past its grace period.

Leadership is checked before anything is assumed, and the writer checks it again right before
every request goes out: a replica that lost the Lease sends nothing more.

Volumes (:mod:`scheduler.commit.volumebind`): members with unbound WaitForFirstConsumer claims
get their volumes reserved right before they are assumed (none left on a member's node: nothing
of the gang is assumed), and the volumes are bound to the claims before any member's bind is
sent (that failing: every member is forgotten, none is bound).

ResourceClaims (:mod:`scheduler.commit.dra`): the devices chosen for the gang's claims are
reserved in the cache right before the members are assumed (devices held for another claim:
nothing of the gang is assumed), and each claim's status (allocation, reservedFor) is written
before any member's bind is sent, after the GPU-sharing holds and before the volumes (a
volume bound to a node cannot be undone, a claim can). A claim that cannot be written fails
the gang: what was written is undone and every member forgotten. Members whose bind is
refused leave ``reservedFor`` again (an allocation nobody else uses is cleared).

:func:`assume_gang` is synchronous and :func:`bind_gang` does the I/O, so the live backend can
assume in the cycle and let the binds stream in the background while the next cycle runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from scheduler.cluster.pod import Pod
from scheduler.commit.gpusharing import GpuSharing
from scheduler.commit.volumebind import VolumeReservations, bind_volumes, reserve_volumes
from scheduler.k8s.writer import BindOutcome, Writer
from scheduler.solver.placement import GangOutcome, PodAssignment

if TYPE_CHECKING:
    # The DRA modules load the CEL library (~0.25 s): imported only by gangs with claims.
    from scheduler.commit.dra import ClaimReservations, ClaimWrite

__all__ = ["Assumer", "GangCommit", "assume_gang", "bind_gang", "commit_gang"]

log = structlog.get_logger("scheduler.commit")


class Assumer(Protocol):
    """The part of the cache a commit needs (see :class:`scheduler.cache.Cache`)."""

    def assume(
        self,
        pod_uid: str,
        node: str,
        gpu_grant: Mapping[int, int] | Iterable[tuple[int, int]] = (),
    ) -> None:
        """Treat the pod as bound to ``node`` (with its device grant) until proven otherwise."""
        ...

    def bind_finished(self, pod_uid: str, *, uncertain: bool = False) -> None:
        """The bind request ended: succeeded, or (``uncertain``) without a usable answer."""
        ...

    def forget(self, pod_uid: str) -> None:
        """Drop an assumption whose bind was refused for good."""
        ...

    def observe_pod(self, obj: Mapping[str, Any]) -> None:
        """A pod as just read from the API server (newer than the watch may be)."""
        ...

    @property
    def volumes(self) -> VolumeReservations:
        """Volumes chosen for the claims of pods being committed."""
        ...

    @property
    def dra_reservations(self) -> ClaimReservations:
        """Devices chosen for the ResourceClaims of pods being committed
        (:class:`scheduler.cache.dra_reservations.DraReservations`)."""
        ...


def claim_reservations(cache: Assumer) -> ClaimReservations:
    """The cache's in-flight device reservations (read only for gangs that use claims)."""
    return cache.dra_reservations


def _uses_claims(outcome: GangOutcome) -> bool:
    return any(a.claims for a in outcome.pods)


@dataclass
class GangCommit:
    """What happened to one gang's binds."""

    gang: str
    bound: list[PodAssignment] = field(default_factory=list)
    failed: list[tuple[PodAssignment, str]] = field(default_factory=list)
    #: Binds whose answer was lost: the pods stay assumed until a read-back settles them.
    uncertain: list[tuple[PodAssignment, str]] = field(default_factory=list)
    #: True when the binds were not attempted (lost leadership, or a pod left the snapshot).
    skipped: bool = False

    @property
    def complete(self) -> bool:
        """Every assigned pod is bound."""
        return not self.failed and not self.uncertain and not self.skipped and bool(self.bound)

    @property
    def partial(self) -> bool:
        """Some members bound, some failed."""
        return bool(self.bound) and bool(self.failed)


def assume_gang(
    outcome: GangOutcome,
    pods: Mapping[str, Pod],
    cache: Assumer,
    is_leader: Callable[[], bool],
    *,
    cycle: int = 0,
) -> GangCommit | None:
    """Assume every member of a placed gang; None when that was done, else a skipped commit.

    Nothing is assumed unless every member is still in the snapshot and we lead, so a gang is
    never half assumed.
    """
    result = GangCommit(outcome.gang)
    missing = [a for a in outcome.pods if a.pod_key not in pods]
    if missing:
        result.skipped = True
        result.failed = [(a, "pod is no longer in the snapshot") for a in missing]
        return result
    if not is_leader():
        result.skipped = True
        log.info("commit_skipped_not_leader", gang=outcome.gang, cycle=cycle)
        return result
    claims = claim_reservations(cache) if _uses_claims(outcome) else None
    if claims is not None:
        from scheduler.commit.dra import release_claims, reserve_claims

        refused = reserve_claims(outcome, claims, cycle=cycle)
        if refused:
            result.skipped = True
            result.failed = refused
            return result
    refused = reserve_volumes(outcome, cache.volumes, cycle=cycle)
    if refused:
        if claims is not None:
            release_claims(outcome, claims)
        result.skipped = True
        result.failed = refused
        return result
    for a in outcome.pods:
        cache.assume(a.pod_uid, a.node, a.gpu_grant)
    return None


async def bind_gang(
    outcome: GangOutcome,
    pods: Mapping[str, Pod],
    writer: Writer,
    cache: Assumer,
    *,
    cycle: int = 0,
    sharing: GpuSharing | None = None,
) -> GangCommit:
    """Bind every member assumed by :func:`assume_gang` and settle each outcome in the cache.

    With ``sharing``, the devices of GPU-sharing members are held (reservation pods) before
    any bind, and each bound sharer's device ConfigMap is written.
    Never raises for API errors.
    """
    result = GangCommit(outcome.gang)
    queue = outcome.queue or None
    assignments: Sequence[PodAssignment] = list(outcome.pods)
    claims = claim_reservations(cache) if _uses_claims(outcome) else None
    # Devices first: a reservation pod left by a failed gang is collected, while a volume
    # bound to a node is not undone.
    if sharing is not None:
        problem = await sharing.hold(assignments, pods)
        if problem is not None:
            log.warning("gpu_reservation_refused", gang=outcome.gang, error=problem, cycle=cycle)
            if claims is not None:
                from scheduler.commit.dra import release_claims

                release_claims(outcome, claims)
            for a in assignments:
                cache.forget(a.pod_uid)
            result.skipped = True
            result.failed = [(a, problem) for a in assignments]
            return result
    writes: list[ClaimWrite] = []
    every = {a.pod_uid for a in assignments}
    problem = None
    if claims is not None:
        from scheduler.commit.dra import write_claims

        writes, problem = await write_claims(outcome, pods, writer, claims, cycle=cycle)
        if problem is not None:
            await _undo_all(outcome, writes, every, writer, claims, cycle)
    if problem is None:
        problem = await bind_volumes(outcome, writer, cache.volumes, cycle=cycle)
        if problem is not None and claims is not None:
            await _undo_all(outcome, writes, every, writer, claims, cycle)
    if problem is not None:
        for a in assignments:
            cache.forget(a.pod_uid)
        result.skipped = True
        result.failed = [(a, problem) for a in assignments]
        return result

    async def bind(a: PodAssignment) -> BindOutcome:
        pod = pods[a.pod_key]
        return await writer.bind(
            pod.namespace, pod.name, pod.uid, a.node, dict(a.gpu_grant) or None
        )

    outcomes = await asyncio.gather(*(bind(a) for a in assignments), return_exceptions=True)
    for a, out in zip(assignments, outcomes, strict=True):
        if isinstance(out, BindOutcome) and out.observed is not None:
            cache.observe_pod(out.observed)
        if isinstance(out, BindOutcome) and out.bound:
            cache.bind_finished(a.pod_uid)
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
        error = out.error if isinstance(out, BindOutcome) else repr(out)
        if isinstance(out, BindOutcome) and out.uncertain:
            # The pod may be bound: keep counting it where we sent it until a read-back
            # shows where it is, so its devices cannot be granted to anyone else meanwhile.
            cache.bind_finished(a.pod_uid, uncertain=True)
            result.uncertain.append((a, error))
            log.warning(
                "bind_uncertain", pod=a.pod_key, gang=a.gang, node=a.node, error=error, cycle=cycle
            )
            continue
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
    if claims is not None and result.failed:
        # Members refused for good leave their claims; uncertain ones may be bound and keep
        # them. An allocation that only they used is cleared again.
        from scheduler.commit.dra import undo_claims

        refused = {a.pod_uid for a, _ in result.failed}
        await undo_claims(writes, refused, writer, claims, cycle=cycle)
    if sharing is not None and result.bound:
        await asyncio.gather(*(sharing.fill(a, pods[a.pod_key]) for a in result.bound))
    if result.partial:
        log.warning(
            "gang_partial",
            gang=outcome.gang,
            bound=len(result.bound),
            failed=len(result.failed),
            cycle=cycle,
        )
    return result


async def _undo_all(
    outcome: GangOutcome,
    writes: Sequence[ClaimWrite],
    uids: set[str],
    writer: Writer,
    claims: ClaimReservations,
    cycle: int,
) -> None:
    """Nothing of the gang is bound: take back every claim write, and every hold."""
    from scheduler.commit.dra import release_claims, undo_claims

    if writes:
        await undo_claims(writes, uids, writer, claims, cycle=cycle)
    else:
        release_claims(outcome, claims)


async def commit_gang(
    outcome: GangOutcome,
    pods: Mapping[str, Pod],
    writer: Writer,
    cache: Assumer,
    is_leader: Callable[[], bool],
    *,
    cycle: int = 0,
) -> GangCommit:
    """Assume and bind one placed gang, waiting for every bind (see module docstring)."""
    if not outcome.pods:
        return GangCommit(outcome.gang)
    skipped = assume_gang(outcome, pods, cache, is_leader, cycle=cycle)
    if skipped is not None:
        return skipped
    return await bind_gang(outcome, pods, writer, cache, cycle=cycle)
