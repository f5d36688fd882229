"""Writing the ResourceClaims of a gang before its pods are bound: kube-scheduler's DRA Reserve
and PreBind, for a whole gang.

1. **Reserve** (:func:`reserve_claims`, synchronous, right before the gang is assumed): the
   devices the cycle chose (:class:`~scheduler.solver.placement.ClaimGrant` with an
   ``allocation``) are held in the cache's
   :class:`~scheduler.cache.dra_reservations.DraReservations`, so the next cycle does not give
   them away while the write and its watch event are on their way. Devices already held for
   another claim: nothing of the gang is assumed, it fails this cycle.
2. **Write** (:func:`write_claims`, in the gang's bind task, before any bind): each claim the
   gang uses is read from the API server and written with its ``resourceVersion`` as the
   precondition - **one write per claim** carrying every member that uses it (claims are
   written concurrently, each claim once). A claim this cycle allocated first gets the
   finalizer ``resource.kubernetes.io/delete-protection`` (an update of the claim: as
   kube-scheduler does, so kube-controller-manager deallocates the claim once no pod uses it,
   and the claim is not deleted under a running pod), then its status: ``allocation`` (device
   results and the node selector) and ``reservedFor`` (``{resource: pods, name, uid}`` per
   member). A claim allocated before only gets the members added to ``reservedFor``.
   A 409 means the claim changed since it was read: it is read again and the write retried
   when it is still unallocated or allocated to the same devices (an earlier attempt's answer
   was lost) and the members still fit (``reservedFor`` holds at most
   :data:`RESERVED_FOR_MAX`); otherwise the gang fails this cycle. A claim another commit in
   flight is allocating (a gang of the same cycle) is waited for, briefly.
3. Only then are the pods bound (:func:`scheduler.commit.transaction.bind_gang`).

**Extended resources backed by DRA** (a grant with ``requests``, under a stand-in key,
:func:`scheduler.cluster.dra_extended.special_claim_key`): the claim is created as
kube-scheduler creates it (generated name ``<pod>-extended-resources-``, owned by the pod,
annotation ``resource.kubernetes.io/extended-resource-claim: "true"``, with the finalizer),
its allocation and reservation written, and the pod's
``status.extendedResourceClaimStatus`` set (claim name and request mappings); its reservation
moves to the real key (:meth:`DraReservations.rename
<scheduler.cache.dra_reservations.DraReservations.rename>`). Undone, it is deallocated and
deleted (the API server keeps the pod's status field once set; the next commit overwrites it).

**Undo** (:func:`undo_claims`): when the gang fails before or at its binds, every member that
is not bound is removed from ``reservedFor`` again; an allocation this commit set is cleared
when no consumer remains (and the finalizer it added removed), and its reservation released.
A member whose bind has no answer (*uncertain*) keeps its place. A 403 means the scheduler's
role may not write claims: pods with claims wait naming the permission
(:attr:`DraReservations.forbidden <scheduler.cache.dra_reservations.DraReservations.forbidden>`)
for :data:`FORBIDDEN_RETRY` seconds, then writing is tried again; everything else is scheduled
as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import weakref
from collections.abc import AsyncIterator, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from scheduler.cluster.dra import ClaimAllocation
from scheduler.cluster.dra_extended import EXTENDED_CLAIM_ANNOTATION
from scheduler.cluster.draspec import DraSpecError, node_selector_to_k8s, resource_claim_from_k8s
from scheduler.cluster.pod import Pod
from scheduler.k8s.errors import Conflict, Forbidden, Invalid, KubeError, TemporaryError
from scheduler.k8s.resources import POD, RESOURCE_CLAIM
from scheduler.k8s.writer import Writer
from scheduler.solver.placement import GangOutcome, PodAssignment

__all__ = [
    "FINALIZER",
    "FORBIDDEN",
    "FORBIDDEN_RETRY",
    "RESERVED_FOR_MAX",
    "ClaimReservations",
    "ClaimWrite",
    "allocation_to_k8s",
    "create_extended_claim",
    "extended_claim_manifest",
    "extended_claim_status",
    "gang_claims",
    "plan_claim_write",
    "release_claims",
    "reserve_claims",
    "undo_claims",
    "write_claims",
]

log = structlog.get_logger("scheduler.commit")

#: The finalizer kube-scheduler puts on a claim it allocates; kube-controller-manager's
#: ResourceClaim controller deallocates such a claim when no pod uses it, then removes it.
FINALIZER = "resource.kubernetes.io/delete-protection"
#: ``status.reservedFor`` holds at most this many consumers (the API's limit).
RESERVED_FOR_MAX = 256
#: Seconds pods with claims wait after a 403 before writing is tried again.
FORBIDDEN_RETRY = 60.0
#: Why they wait meanwhile.
FORBIDDEN = (
    "the scheduler may not write resourceclaims (grant create, update and delete on "
    "resourceclaims and update on resourceclaims/status and resourceclaims/binding in "
    "resource.k8s.io to the scheduler; see manifests/20-rbac.yaml)"
)
_ATTEMPTS = 4
#: Writes after a 409 before giving up: each 409 means another writer got in first (only
#: writers outside this process: its own writes of one claim take turns, see _claim_lock).
_CONFLICT_ATTEMPTS = 8
_RETRY_DELAY = 0.2
#: Per writer, a lock per claim (with how many writes use it): the gangs of one scheduler
#: that use one claim write it one after another instead of racing each other into 409s.
_LOCKS: weakref.WeakKeyDictionary[Writer, dict[str, tuple[asyncio.Lock, int]]] = (
    weakref.WeakKeyDictionary()
)
#: Looks at a claim that another commit in flight is allocating, before giving up.
_WAIT_ATTEMPTS = 10


class ClaimReservations(Protocol):
    """What the commit needs of the cache's in-flight device reservations
    (:class:`scheduler.cache.dra_reservations.DraReservations`)."""

    @property
    def forbidden(self) -> str | None:
        """Why claims cannot be written now (a 403 a moment ago), else None."""
        ...

    def reserve_all(self, items: Iterable[tuple[str, ClaimAllocation]]) -> str | None:
        """Hold every (claim, allocation), or none: why not."""
        ...

    def release(self, claim_key: str) -> None:
        """A commit that reserved the claim failed."""
        ...

    def allocation(self, claim_key: str) -> ClaimAllocation | None:
        """The allocation a commit in flight is writing for the claim, if any."""
        ...

    def rename(self, old_key: str, new_key: str) -> None:
        """The claim reserved as ``old_key`` was created as ``new_key``."""
        ...

    def forbid_writes(self, message: str) -> int:
        """Claims cannot be written (``message``); a token for :meth:`allow_writes`."""
        ...

    def allow_writes(self, token: int) -> None:
        """Try writing claims again (unless forbidden again since ``token``)."""
        ...


@dataclass
class ClaimWrite:
    """One claim of a gang: what to write, and (filled by :func:`write_claims`) what was
    written, which :func:`undo_claims` takes back."""

    key: str
    #: The devices this cycle chose, or None when the claim was allocated before.
    allocation: ClaimAllocation | None
    #: (pod name, pod uid) of the members that use the claim, in gang order.
    consumers: tuple[tuple[str, str], ...]
    #: The status write succeeded (or an earlier attempt had done it).
    written: bool = False
    #: This commit added :data:`FINALIZER`.
    finalizer_added: bool = False
    #: Why the write failed, if it did.
    problem: str | None = None
    #: The allocation is gone again (cleared by the undo): the reservation was released.
    released: bool = field(default=False, repr=False)
    #: For the claim of a pod's extended resources, which the commit creates (``key`` is
    #: then a stand-in): its requests as (request name, DeviceClass, count) ...
    requests: tuple[tuple[str, str, int], ...] = ()
    #: ... and the pod status' request mappings as (container, resource, request name).
    mappings: tuple[tuple[str, str, str], ...] = ()
    #: The name the API server generated for the created claim.
    created: str = ""
    #: The pod's ``status.extendedResourceClaimStatus`` names the created claim.
    pod_status_written: bool = False

    @property
    def extended(self) -> bool:
        """True for the claim of a pod's extended resources (created by the commit)."""
        return bool(self.requests)

    @property
    def namespace(self) -> str:
        """The claim's namespace."""
        return self.key.partition("/")[0]

    @property
    def name(self) -> str:
        """The claim's name (the generated one once an extended claim is created)."""
        return self.created or self.key.partition("/")[2]

    @property
    def reservation_key(self) -> str:
        """The key its devices are reserved under (the real one once created)."""
        return f"{self.namespace}/{self.created}" if self.created else self.key


def allocation_to_k8s(allocation: ClaimAllocation) -> dict[str, Any]:
    """``status.allocation`` in the API's form."""
    results = []
    for r in allocation.results:
        entry: dict[str, Any] = {
            "request": r.request,
            "driver": r.driver,
            "pool": r.pool,
            "device": r.device,
        }
        if r.admin_access:
            entry["adminAccess"] = True
        results.append(entry)
    out: dict[str, Any] = {"devices": {"results": results}}
    if allocation.node_selector is not None:
        out["nodeSelector"] = node_selector_to_k8s(allocation.node_selector)
    return out


def _same_devices(a: ClaimAllocation, b: ClaimAllocation) -> bool:
    return {(r.request, r.device_id) for r in a.results} == {
        (r.request, r.device_id) for r in b.results
    }


def _name_of(a: PodAssignment, pods: Mapping[str, Pod]) -> tuple[str, str]:
    pod = pods.get(a.pod_key)
    return (pod.name if pod is not None else a.pod_key.partition("/")[2], a.pod_uid)


def gang_claims(outcome: GangOutcome, pods: Mapping[str, Pod]) -> list[ClaimWrite] | str:
    """The claims the gang's members use, one :class:`ClaimWrite` per claim (sorted by key),
    or why they cannot be written (two different allocations for one claim)."""
    found: dict[str, ClaimWrite] = {}
    for a in outcome.pods:
        consumer = _name_of(a, pods)
        for grant in a.claims:
            write = found.get(grant.claim)
            if write is None:
                found[grant.claim] = ClaimWrite(
                    grant.claim,
                    grant.allocation,
                    (consumer,),
                    requests=grant.requests,
                    mappings=grant.mappings,
                )
                continue
            if grant.requests:
                return f"ResourceClaim {grant.claim} is made for one pod only"
            if grant.allocation is not None:
                if write.allocation is None:
                    write.allocation = grant.allocation
                elif not _same_devices(write.allocation, grant.allocation):
                    return f"ResourceClaim {grant.claim} was given two different allocations"
            if consumer not in write.consumers:
                write.consumers = (*write.consumers, consumer)
    return [found[k] for k in sorted(found)]


def _grants(outcome: GangOutcome) -> list[tuple[str, ClaimAllocation]]:
    return [
        (g.claim, g.allocation) for a in outcome.pods for g in a.claims if g.allocation is not None
    ]


def reserve_claims(
    outcome: GangOutcome, reservations: ClaimReservations, *, cycle: int = 0
) -> list[tuple[PodAssignment, str]]:
    """Hold the devices chosen for the gang's claims (see the module docstring); the failed
    assignments with why (every member: none is bound) when they cannot be held, else an
    empty list."""
    grants = _grants(outcome)
    if not any(a.claims for a in outcome.pods):
        return []
    if reservations.forbidden is not None:
        # Writing would be refused again: the gang waits until writing is tried again.
        return [(a, reservations.forbidden) for a in outcome.pods]
    if not grants:
        return []
    # One hold per claim, however many members carry its allocation.
    unique = dict(grants)
    why = reservations.reserve_all(unique.items())
    if why is None:
        log.info(
            "claims_reserved",
            gang=outcome.gang,
            claims={k: [r.device for r in v.results] for k, v in sorted(unique.items())},
            cycle=cycle,
        )
        return []
    log.info("claims_not_reserved", gang=outcome.gang, reason=why, cycle=cycle)
    return [(a, why) for a in outcome.pods]


def release_claims(outcome: GangOutcome, reservations: ClaimReservations) -> None:
    """Give back what :func:`reserve_claims` held for the gang (nothing was written)."""
    for key in dict(_grants(outcome)):
        reservations.release(key)


# --- planning a write (pure) ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    """What to write to a claim as read: its new ``status``, and whether the finalizer must
    be added first. ``status`` None: the claim already says everything (nothing to write)."""

    status: dict[str, Any] | None
    add_finalizer: bool = False


@dataclass(frozen=True, slots=True)
class NotYet:
    """The claim is not allocated yet, but a commit in flight is allocating it: look again."""

    reason: str


def _finalizers(obj: Mapping[str, Any]) -> list[str]:
    meta = obj.get("metadata")
    raw = meta.get("finalizers") if isinstance(meta, Mapping) else None
    return [f for f in raw if isinstance(f, str)] if isinstance(raw, list) else []


def _reserved_raw(obj: Mapping[str, Any]) -> list[Any]:
    status = obj.get("status")
    raw = status.get("reservedFor") if isinstance(status, Mapping) else None
    return list(raw) if isinstance(raw, list) else []


def plan_claim_write(
    obj: Mapping[str, Any], write: ClaimWrite, *, in_flight: bool = False
) -> ClaimPlan | NotYet | str:
    """What to write to the claim ``obj`` (as just read) for ``write``, :class:`NotYet`, or
    why it cannot be written (the gang fails this cycle). ``in_flight``: another commit holds
    a reservation for this claim (it is allocating it)."""
    key = write.key
    try:
        claim = resource_claim_from_k8s(obj)
    except DraSpecError as e:
        return f"ResourceClaim {key} cannot be used: {e}"
    meta = obj.get("metadata")
    if isinstance(meta, Mapping) and meta.get("deletionTimestamp"):
        return f"ResourceClaim {key} is being deleted"
    current = claim.allocation
    allocation: ClaimAllocation | None = None
    if current is None:
        if write.allocation is None:
            if in_flight:
                return NotYet(f"ResourceClaim {key} is not allocated yet")
            return (
                f"ResourceClaim {key} is not allocated (the devices chosen for it were not written)"
            )
        allocation = write.allocation
    elif write.allocation is not None and not _same_devices(current, write.allocation):
        held = ", ".join(sorted(r.device for r in current.results))
        return (
            f"ResourceClaim {key} was allocated other devices ({held}) since the cycle chose "
            "devices for it"
        )
    reserved = _reserved_raw(obj)
    present = {r.get("uid") for r in reserved if isinstance(r, Mapping)}
    added = [
        {"resource": "pods", "name": name, "uid": uid}
        for name, uid in write.consumers
        if uid not in present
    ]
    if len(reserved) + len(added) > RESERVED_FOR_MAX:
        return (
            f"ResourceClaim {key} is reserved for {len(reserved)} consumers; {len(added)} more "
            f"would pass the limit of {RESERVED_FOR_MAX}"
        )
    add_finalizer = write.allocation is not None and FINALIZER not in _finalizers(obj)
    if allocation is None and not added:
        return ClaimPlan(None, add_finalizer)
    raw_status = obj.get("status")
    status = dict(raw_status) if isinstance(raw_status, Mapping) else {}
    if allocation is not None:
        status["allocation"] = allocation_to_k8s(allocation)
    status["reservedFor"] = [*reserved, *added]
    return ClaimPlan(status, add_finalizer)


# --- writing -------------------------------------------------------------------------------


async def write_claims(
    outcome: GangOutcome,
    pods: Mapping[str, Pod],
    writer: Writer,
    reservations: ClaimReservations,
    *,
    cycle: int = 0,
) -> tuple[list[ClaimWrite], str | None]:
    """Write every claim the gang uses (see the module docstring): the writes (for
    :func:`undo_claims`) and None when all succeeded, else why not. On failure the caller
    undoes the writes for every member. Never raises for API errors."""
    writes = gang_claims(outcome, pods)
    if isinstance(writes, str):
        return [], writes
    if not writes:
        return [], None
    problems = await asyncio.gather(*(_write(writer, reservations, w) for w in writes))
    problem = next((p for p in problems if p), None)
    summary = {w.key: len(w.consumers) for w in writes}
    if problem is None:
        log.info("claims_written", gang=outcome.gang, claims=summary, cycle=cycle)
    else:
        log.warning(
            "claims_not_written", gang=outcome.gang, claims=summary, error=problem, cycle=cycle
        )
    return writes, problem


@contextlib.asynccontextmanager
async def _claim_lock(writer: Writer, key: str) -> AsyncIterator[None]:
    """Hold this process's lock on claim ``key`` (the table keeps only claims in use)."""
    locks = _LOCKS.setdefault(writer, {})
    lock, users = locks.get(key, (asyncio.Lock(), 0))
    locks[key] = (lock, users + 1)
    try:
        async with lock:
            yield
    finally:
        lock, users = locks[key]
        if users <= 1:
            del locks[key]
        else:
            locks[key] = (lock, users - 1)


async def _write(writer: Writer, reservations: ClaimReservations, w: ClaimWrite) -> str | None:
    """Write one claim (retrying after a 409); None when it says what ``w`` wants."""
    if w.extended:
        w.problem = await create_extended_claim(writer, reservations, w)
        return w.problem
    reason = ""
    for _ in range(_WAIT_ATTEMPTS):
        async with _claim_lock(writer, w.key):
            outcome = await _write_once(writer, reservations, w)
        if not isinstance(outcome, NotYet):
            w.problem = outcome
            return outcome
        # Another gang of ours is allocating the claim: give it the lock and look again.
        reason = outcome.reason
        await asyncio.sleep(_RETRY_DELAY)
    w.problem = f"{reason} (a gang committed at the same time allocates it)"
    return w.problem


async def _write_once(
    writer: Writer, reservations: ClaimReservations, w: ClaimWrite
) -> str | NotYet | None:
    """One turn at writing the claim under its lock: None when written, :class:`NotYet`,
    or why it cannot be."""
    what = f"ResourceClaim {w.key} could not be written"
    error = ""
    attempt = 0
    conflicts = 0
    while attempt < _ATTEMPTS and conflicts < _CONFLICT_ATTEMPTS:
        try:
            obj = await writer.get_object(RESOURCE_CLAIM, w.namespace, w.name)
        except TemporaryError as e:
            error = e.message
            attempt += 1
            await asyncio.sleep(_RETRY_DELAY * 2**attempt)
            continue
        except KubeError as e:
            return f"{what}: {e.message}"
        if obj is None:
            return f"ResourceClaim {w.key} does not exist any more"
        in_flight = w.allocation is None and reservations.allocation(w.key) is not None
        plan = plan_claim_write(obj, w, in_flight=in_flight)
        if isinstance(plan, str):
            return plan
        if isinstance(plan, NotYet):
            return plan
        try:
            if plan.add_finalizer:
                meta = dict(obj.get("metadata") or {})
                meta["finalizers"] = [*_finalizers(obj), FINALIZER]
                obj = await writer.update_object(
                    RESOURCE_CLAIM, w.namespace, w.name, {**obj, "metadata": meta}
                )
                w.finalizer_added = True
            if plan.status is not None:
                await writer.update_object(
                    RESOURCE_CLAIM,
                    w.namespace,
                    w.name,
                    {**obj, "status": plan.status},
                    subresource="status",
                )
        except Conflict as e:
            # Changed since read (another scheduler, the claim controller, a lost answer of
            # ours): read again and judge anew, after a short random pause so that writers
            # that collided do not collide again.
            error = e.message
            conflicts += 1
            log.info("claim_conflict", claim=w.key, attempt=conflicts, error=e.message)
            await asyncio.sleep(_RETRY_DELAY * random.random())
            continue
        except (Forbidden, Invalid) as e:
            if not _forbidden(e):
                return f"{what}: {e.message}"
            token = reservations.forbid_writes(FORBIDDEN)
            asyncio.get_running_loop().call_later(FORBIDDEN_RETRY, reservations.allow_writes, token)
            log.error("claim_write_forbidden", claim=w.key, error=e.message)
            return f"{what}: {FORBIDDEN}"
        except TemporaryError as e:
            error = e.message
            attempt += 1
            await asyncio.sleep(min(e.retry_after or _RETRY_DELAY * 2**attempt, 5.0))
            continue
        except KubeError as e:  # not the leader any more, invalid, gone, ...
            return f"{what}: {e.message}"
        w.written = True
        log.info(
            "claim_written",
            claim=w.key,
            allocated=w.allocation is not None,
            pods=[name for name, _ in w.consumers],
        )
        return None
    return f"{what}: {error or 'it kept changing'}"


# --- undo ----------------------------------------------------------------------------------


async def undo_claims(
    writes: Sequence[ClaimWrite],
    failed: Collection[str],
    writer: Writer,
    reservations: ClaimReservations,
    *,
    cycle: int = 0,
) -> None:
    """Take back what :func:`write_claims` wrote for the members ``failed`` (pod uids that
    are not bound): they leave ``reservedFor``; an allocation of this commit is cleared when
    no consumer remains, and its reservation released. Best effort: never raises; a claim
    left behind is cleaned up by kube-controller-manager or reused by the next placement."""
    if not failed:
        return
    gone = set(failed)
    touched = [w for w in writes if any(uid in gone for _, uid in w.consumers)]
    results = await asyncio.gather(*(_undo(writer, w, gone) for w in touched))
    for w, cleared in zip(touched, results, strict=True):
        # Only a hold this commit made is released, and only once the devices are free again
        # (a claim still allocated is counted from its status once the watch shows it).
        if w.allocation is not None and cleared and not w.released:
            reservations.release(w.reservation_key)
            w.released = True
    log.info(
        "claims_undone",
        claims=[w.key for w in touched],
        deallocated=[w.key for w, cleared in zip(touched, results, strict=True) if cleared],
        cycle=cycle,
    )


async def _undo(writer: Writer, w: ClaimWrite, failed: set[str]) -> bool:
    """Undo one claim; True when it is (now) not allocated by this commit's devices."""
    if w.extended and not w.created:
        return True  # never created: nothing to take back
    async with _claim_lock(writer, w.key):
        cleared = await _undo_once(writer, w, failed)
    if w.extended and cleared:
        await _remove_extended(writer, w)
    return cleared


async def _undo_once(writer: Writer, w: ClaimWrite, failed: set[str]) -> bool:
    for _ in range(_CONFLICT_ATTEMPTS):
        try:
            obj = await writer.get_object(RESOURCE_CLAIM, w.namespace, w.name)
        except KubeError as e:
            log.warning("claim_undo_failed", claim=w.key, error=e.message)
            return False
        if obj is None:
            return True
        try:
            current = resource_claim_from_k8s(obj).allocation
        except DraSpecError:
            current = None
        reserved = _reserved_raw(obj)
        keep = [r for r in reserved if not (isinstance(r, Mapping) and r.get("uid") in failed)]
        ours = (
            w.allocation is not None
            and current is not None
            and _same_devices(current, w.allocation)
        )
        clear = ours and not keep
        if current is None or (w.allocation is not None and not ours):
            return True  # nothing of ours holds devices
        if len(keep) == len(reserved) and not clear:
            return False
        raw_status = obj.get("status")
        status = dict(raw_status) if isinstance(raw_status, Mapping) else {}
        status["reservedFor"] = keep
        if clear:
            status.pop("allocation", None)
        try:
            obj = await writer.update_object(
                RESOURCE_CLAIM, w.namespace, w.name, {**obj, "status": status}, subresource="status"
            )
        except Conflict:
            continue
        except KubeError as e:
            log.warning("claim_undo_failed", claim=w.key, error=e.message)
            return False
        if clear and w.finalizer_added:
            await _drop_finalizer(writer, w, obj)
        return clear
    log.warning("claim_undo_failed", claim=w.key, error="it kept changing")
    return False


async def _drop_finalizer(writer: Writer, w: ClaimWrite, obj: Mapping[str, Any]) -> None:
    """Remove the finalizer this commit added to a claim it deallocated again (what
    kube-controller-manager would do, without waiting for it)."""
    for _ in range(_ATTEMPTS):
        if FINALIZER not in _finalizers(obj):
            return
        status = obj.get("status")
        if isinstance(status, Mapping) and (status.get("allocation") or status.get("reservedFor")):
            return  # someone uses the claim again: the finalizer protects them now
        meta = dict(obj.get("metadata") or {})
        meta["finalizers"] = [f for f in _finalizers(obj) if f != FINALIZER]
        try:
            await writer.update_object(
                RESOURCE_CLAIM, w.namespace, w.name, {**obj, "metadata": meta}
            )
            return
        except Conflict:
            pass  # changed since read: read it again below and retry once
        except KubeError as e:
            log.warning("claim_finalizer_not_removed", claim=w.key, error=e.message)
            return
        try:
            again = await writer.get_object(RESOURCE_CLAIM, w.namespace, w.name)
        except KubeError as e:
            log.warning("claim_finalizer_not_removed", claim=w.key, error=e.message)
            return
        if again is None:
            return
        obj = again


# --- the claim of a pod's extended resources ----------------------------------------------


def extended_claim_manifest(
    pod_name: str, pod_uid: str, requests: Sequence[tuple[str, str, int]]
) -> dict[str, Any]:
    """The ResourceClaim for a pod's extended resources backed by DRA, as kube-scheduler makes
    it: a generated name ``<pod>-extended-resources-``, owned by the pod (deleted with it),
    marked with the annotation ``resource.kubernetes.io/extended-resource-claim``, and with
    :data:`FINALIZER` (it is allocated right away)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "generateName": f"{pod_name}-extended-resources-",
            "annotations": {EXTENDED_CLAIM_ANNOTATION: "true"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod_name,
                    "uid": pod_uid,
                    "controller": True,
                }
            ],
            "finalizers": [FINALIZER],
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": name,
                        "exactly": {
                            "deviceClassName": device_class,
                            "allocationMode": "ExactCount",
                            "count": count,
                        },
                    }
                    for name, device_class, count in requests
                ]
            }
        },
    }


def extended_claim_status(
    claim_name: str, mappings: Sequence[tuple[str, str, str]]
) -> dict[str, Any]:
    """The pod's ``status.extendedResourceClaimStatus`` naming its claim."""
    return {
        "resourceClaimName": claim_name,
        "requestMappings": [
            {"containerName": c, "resourceName": r, "requestName": q} for c, r, q in mappings
        ],
    }


async def create_extended_claim(
    writer: Writer, reservations: ClaimReservations, w: ClaimWrite
) -> str | None:
    """Create the claim of a pod's extended resources, write its allocation and reservation,
    then name it in the pod's status; None when all three are done, else why not (what was
    done stays recorded in ``w`` for :func:`undo_claims`)."""
    pod_name, pod_uid = w.consumers[0]
    namespace = w.namespace
    what = (
        f"the ResourceClaim for the extended resources of pod {namespace}/{pod_name} could "
        "not be written"
    )
    if w.allocation is None:
        return f"{what}: no devices were chosen for it"
    try:
        obj = await writer.create_object(
            RESOURCE_CLAIM, namespace, extended_claim_manifest(pod_name, pod_uid, w.requests)
        )
    except KubeError as e:
        return _refused(reservations, w, what, e)
    name = obj.get("metadata", {}).get("name")
    if not isinstance(name, str) or not name:
        return f"{what}: the API server answered without a name"
    w.created = name
    w.finalizer_added = True
    reservations.rename(w.key, w.reservation_key)
    status = {
        "allocation": allocation_to_k8s(w.allocation),
        "reservedFor": [{"resource": "pods", "name": pod_name, "uid": pod_uid}],
    }
    try:
        # Made a moment ago and ours alone: a 409 is unlikely and is not retried.
        await writer.update_object(
            RESOURCE_CLAIM, namespace, name, {**obj, "status": status}, subresource="status"
        )
        w.written = True
        problem = await _name_in_pod_status(writer, w, pod_name, pod_uid)
    except KubeError as e:
        return _refused(reservations, w, what, e)
    if problem is not None:
        return f"{what}: {problem}"
    log.info("extended_claim_created", claim=f"{namespace}/{name}", pod=pod_name)
    return None


def _forbidden(e: KubeError) -> bool:
    """A 403, or the 422 with which the API server refuses an allocation or reservedFor
    written without ``update`` on the ``resourceclaims/binding`` permission check."""
    if isinstance(e, Forbidden):
        return True
    return isinstance(e, Invalid) and "resourceclaims/binding" in e.message


def _refused(reservations: ClaimReservations, w: ClaimWrite, what: str, e: KubeError) -> str:
    if _forbidden(e):
        token = reservations.forbid_writes(FORBIDDEN)
        asyncio.get_running_loop().call_later(FORBIDDEN_RETRY, reservations.allow_writes, token)
        log.error("claim_write_forbidden", claim=w.reservation_key, error=e.message)
        return f"{what}: {FORBIDDEN}"
    return f"{what}: {e.message}"


async def _name_in_pod_status(
    writer: Writer, w: ClaimWrite, pod_name: str, pod_uid: str
) -> str | None:
    """Set the pod's ``status.extendedResourceClaimStatus`` to the created claim; why not."""
    error = ""
    for _ in range(_ATTEMPTS):
        pod = await writer.get_pod(w.namespace, pod_name)
        if pod is None or pod.get("metadata", {}).get("uid") != pod_uid:
            return f"pod {w.namespace}/{pod_name} is gone"
        status = dict(pod.get("status") or {})
        status["extendedResourceClaimStatus"] = extended_claim_status(w.created, w.mappings)
        try:
            await writer.update_object(
                POD, w.namespace, pod_name, {**pod, "status": status}, subresource="status"
            )
        except Conflict as e:
            error = e.message
            continue
        w.pod_status_written = True
        return None
    return error or "the pod kept changing"


async def _remove_extended(writer: Writer, w: ClaimWrite) -> None:
    """The created claim is deallocated: delete it, as kube-scheduler does. The pod's status
    may still name it (the API server keeps that field once set); the next commit of the pod
    names its new claim there."""
    try:
        await writer.delete_object(RESOURCE_CLAIM, w.namespace, w.created)
    except KubeError as e:
        log.warning("extended_claim_not_deleted", claim=w.reservation_key, error=e.message)
