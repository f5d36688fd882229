"""Binding the PersistentVolumes chosen for a gang's WaitForFirstConsumer claims before its pods
are bound: kube-scheduler's VolumeBinding Reserve and PreBind, for pre-created volumes.

1. **Reserve** (:func:`reserve_volumes`, synchronous, right before the gang is assumed): each
   pod's unbound claims get a volume on the pod's node from the cache
   (:meth:`scheduler.cache.volumes.VolumeIndex.reserve`: deterministic, never one volume for two
   claims, of this gang or of another gang of the cycle). When a pod has none left there,
   nothing of the gang is assumed: it fails this cycle and a later one places it again.
2. **Write** (:func:`bind_volumes`, in the gang's bind task): each volume's ``spec.claimRef``
   is set to its claim (apiVersion, kind, namespace, name, uid), with
   ``pv.kubernetes.io/bound-by-controller``, as kube-scheduler's update writes it; the
   volume's resourceVersion when it was chosen is the precondition (optimistic concurrency).
   A 409 means the volume changed since: if it now names our claim, an earlier attempt (or
   another gang sharing the claim) wrote it; otherwise it was taken.
3. **Wait** until the PV controller (kube-controller-manager) has completed each binding - the
   claim's ``spec.volumeName`` and ``pv.kubernetes.io/bind-completed`` - as kube-scheduler's
   PreBind waits, at most ``timeout`` seconds (:data:`DEFAULT_BIND_TIMEOUT`; kube-scheduler
   waits up to 600). The claim is read from the cache (the watch) and every
   :data:`READ_BACK` seconds from the API server, so a slow watch does not hold the bind. The
   wait runs in the gang's own bind task: other gangs keep binding meanwhile.
4. Only then are the pods bound (:func:`scheduler.commit.transaction.bind_gang`), so a pod never
   reaches its node with a claim that is not bound yet.

On any failure nothing of the gang is bound (all or nothing): the pods' assumptions are
forgotten, the reservations released, and a later cycle places the gang again. Volume writes
that did succeed are not undone (kube-scheduler does not undo them either): the PV controller
completes those bindings, and the next placement follows the claims, now bound. A 403 means the
scheduler's role lacks ``patch`` on persistentvolumes: pods with such claims wait naming the
permission for :data:`FORBIDDEN_RETRY` seconds, then binding is tried again; everything else
is scheduled as usual.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import structlog

from scheduler.cluster.volumeobjects import VolumeBinding, VolumeFacts, claim_binding
from scheduler.k8s.errors import Conflict, Forbidden, KubeError, TemporaryError
from scheduler.k8s.resources import PERSISTENT_VOLUME, PERSISTENT_VOLUME_CLAIM
from scheduler.k8s.writer import Writer
from scheduler.solver.placement import GangOutcome, PodAssignment

__all__ = [
    "DEFAULT_BIND_TIMEOUT",
    "FORBIDDEN",
    "FORBIDDEN_RETRY",
    "VolumeReservations",
    "bind_volumes",
    "reserve_volumes",
]

log = structlog.get_logger("scheduler.commit")

#: Seconds to wait for the PV controller to complete the bindings of a gang's claims.
DEFAULT_BIND_TIMEOUT = 60.0
#: Seconds between looks at the cache while waiting, and between reads from the API server.
POLL = 0.1
READ_BACK = 2.0
#: Seconds pods with unbound WaitForFirstConsumer claims wait after a 403 before trying again.
FORBIDDEN_RETRY = 60.0
#: Why they wait meanwhile.
FORBIDDEN = (
    "the scheduler may not patch persistentvolumes (grant patch on persistentvolumes to the "
    "scheduler; see manifests/20-rbac.yaml)"
)
_WRITE_ATTEMPTS = 3
_RETRY_DELAY = 0.2


class VolumeReservations(Protocol):
    """What the commit needs of the cache's volumes (:class:`scheduler.cache.volumes.
    VolumeIndex`)."""

    def reserve_gang(self, members: Sequence[tuple[str, str]]) -> tuple[str, str] | None:
        """Choose and reserve volumes for the unbound claims of every (pod uid, node), or
        none: (pod uid, why) of a member with none left."""
        ...

    def reserved(self, pod_uid: str) -> tuple[VolumeBinding, ...]:
        """The volumes reserved for the pod's claims."""
        ...

    def release(self, pod_uid: str, *, undo: bool = False) -> None:
        """The pod's commit failed: free its volumes (``undo``: reserved a moment ago by the
        same commit)."""
        ...

    def done(self, pod_uid: str) -> None:
        """The pod's claims are bound to its volumes."""
        ...

    def claim(self, key: str) -> Mapping[str, Any] | None:
        """The claim ``namespace/name`` as the watch last showed it."""
        ...

    def forbid_writes(self, message: str) -> int:
        """Volumes cannot be bound (``message``); a token for :meth:`allow_writes`."""
        ...

    def allow_writes(self, token: int) -> None:
        """Try binding volumes again (unless forbidden again since ``token``)."""
        ...


def reserve_volumes(
    outcome: GangOutcome, volumes: VolumeReservations, *, cycle: int = 0
) -> list[tuple[PodAssignment, str]]:
    """Reserve volumes for every member of a placed gang on its node (see the module
    docstring); the failed assignments with why (every member: none is bound) when a member
    has none left, else an empty list."""
    failed = volumes.reserve_gang([(a.pod_uid, a.node) for a in outcome.pods])
    if failed is None:
        for a in outcome.pods:
            chosen = volumes.reserved(a.pod_uid)
            if chosen:
                log.info(
                    "volumes_reserved",
                    gang=outcome.gang,
                    pod=a.pod_key,
                    node=a.node,
                    volumes={b.claim_key: b.volume for b in chosen},
                    cycle=cycle,
                )
        return []
    uid, why = failed
    pod = next(a for a in outcome.pods if a.pod_uid == uid)
    log.info(
        "volumes_not_reserved",
        gang=outcome.gang,
        pod=pod.pod_key,
        node=pod.node,
        reason=why,
        cycle=cycle,
    )
    return [(a, why if a is pod else f"pod {pod.pod_key}: {why}") for a in outcome.pods]


async def bind_volumes(
    outcome: GangOutcome,
    writer: Writer,
    volumes: VolumeReservations,
    *,
    cycle: int = 0,
    timeout: float | None = None,
) -> str | None:
    """Write the bindings of the volumes reserved for the gang's members and wait for the PV
    controller to complete them; None when done (or there were none), else why not (the
    reservations are then released; the caller forgets the pods). ``timeout``: seconds to
    wait for the PV controller (default :data:`DEFAULT_BIND_TIMEOUT`). Never raises for API
    errors."""
    holders = [a.pod_uid for a in outcome.pods if volumes.reserved(a.pod_uid)]
    if not holders:
        return None
    loop = asyncio.get_running_loop()
    started = loop.time()
    chosen: dict[str, VolumeBinding] = {}
    for uid in holders:
        for b in volumes.reserved(uid):
            chosen.setdefault(b.claim_key, b)
    writes = [b for b in chosen.values() if not b.prebound]
    problems = await asyncio.gather(*(_write(writer, volumes, b) for b in writes))
    problem = next((p for p in problems if p), None)
    if problem is None:
        wait = DEFAULT_BIND_TIMEOUT if timeout is None else timeout
        problem = await _wait_bound(writer, volumes, list(chosen.values()), wait)
    for uid in holders:
        if problem is None:
            volumes.done(uid)
        else:
            volumes.release(uid)
    summary = {key: b.volume for key, b in chosen.items()}
    if problem is not None:
        log.warning(
            "volumes_not_bound", gang=outcome.gang, volumes=summary, error=problem, cycle=cycle
        )
    else:
        log.info(
            "volumes_bound",
            gang=outcome.gang,
            volumes=summary,
            seconds=round(loop.time() - started, 3),
            cycle=cycle,
        )
    return problem


async def _write(writer: Writer, volumes: VolumeReservations, b: VolumeBinding) -> str | None:
    """Set the volume's claimRef to the claim; None when it names the claim now."""
    what = f"persistentvolume {b.volume} could not be bound to persistentvolumeclaim {b.claim_key}"
    error = ""
    for attempt in range(_WRITE_ATTEMPTS):
        try:
            await writer.patch_persistent_volume(b.volume, b.patch())
        except Conflict as e:
            return await _after_conflict(writer, b, e)
        except Forbidden as e:
            token = volumes.forbid_writes(FORBIDDEN)
            asyncio.get_running_loop().call_later(FORBIDDEN_RETRY, volumes.allow_writes, token)
            log.error("volume_write_forbidden", volume=b.volume, error=e.message)
            return f"{what}: {FORBIDDEN}"
        except TemporaryError as e:
            error = e.message
            if attempt < _WRITE_ATTEMPTS - 1:
                await asyncio.sleep(min(e.retry_after or _RETRY_DELAY * 2**attempt, 5.0))
            continue
        except KubeError as e:  # not the leader any more, volume deleted, invalid, ...
            return f"{what}: {e.message}"
        log.info("volume_claimed", volume=b.volume, claim=b.claim_key)
        return None
    # An attempt may have been written all the same: the PV controller then binds the claim
    # to this volume, and the next placement follows it.
    return f"{what}: {error}"


async def _after_conflict(writer: Writer, b: VolumeBinding, conflict: KubeError) -> str | None:
    """After a 409: None when the volume names our claim after all, else why not."""
    try:
        pv = await writer.get_object(PERSISTENT_VOLUME, None, b.volume)
    except KubeError as e:
        return (
            f"persistentvolume {b.volume} changed since it was chosen for persistentvolumeclaim "
            f"{b.claim_key} ({conflict.message}); then {e.message}"
        )
    if pv is None:
        return f"persistentvolume {b.volume} was deleted"
    facts = VolumeFacts.of(b.volume, pv)
    if facts.names(b.namespace, b.claim, b.claim_uid):
        log.info("volume_claimed_already", volume=b.volume, claim=b.claim_key)
        return None
    ref = facts.claim_ref
    if ref is not None:
        return (
            f"persistentvolume {b.volume} was taken by persistentvolumeclaim {ref[0]}/{ref[1]} "
            f"before persistentvolumeclaim {b.claim_key} could get it ({conflict.message})"
        )
    return (
        f"persistentvolume {b.volume} changed since it was chosen for persistentvolumeclaim "
        f"{b.claim_key} ({conflict.message})"
    )


async def _wait_bound(
    writer: Writer,
    volumes: VolumeReservations,
    bindings: Sequence[VolumeBinding],
    timeout: float,
) -> str | None:
    """Wait until every claim is bound to its volume by the PV controller; why not."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    read_at = loop.time() + READ_BACK
    waiting = {b.claim_key: b for b in bindings}
    while True:
        for key, b in list(waiting.items()):
            bound, why = claim_binding(volumes.claim(key), key, b.volume)
            if why:
                return why
            if bound:
                del waiting[key]
        now = loop.time()
        if waiting and now >= read_at:
            # The watch may be slow: ask the API server.
            read_at = now + READ_BACK
            for key, b in list(waiting.items()):
                try:
                    pvc = await writer.get_object(PERSISTENT_VOLUME_CLAIM, b.namespace, b.claim)
                except KubeError as e:
                    log.debug("claim_read_back_failed", claim=key, error=e.message)
                    continue
                bound, why = claim_binding(pvc, key, b.volume)
                if why:
                    return why
                if bound:
                    del waiting[key]
        if not waiting:
            return None
        if not writer.may_write():
            return "this replica is not the leader any more"
        if loop.time() >= deadline:
            pending = ", ".join(
                f"persistentvolumeclaim {key} to persistentvolume {b.volume}"
                for key, b in sorted(waiting.items())
            )
            return f"the PV controller did not complete binding {pending} within {timeout:g}s"
        await asyncio.sleep(POLL)
