"""Devices chosen by commits in flight, until the watch shows their claims allocated.

A cycle chooses devices for a ResourceClaim; the commit writes ``status.allocation`` in the
gang's bind task, and the watch shows the allocated claim some time later. Until then the
claim looks unallocated to the cache, so without this record the next cycle would give the
same devices to another claim. Like an assumed pod, a reservation lives from the commit's
assume step until the watch confirms it (:meth:`DraReservations.settle`) or the commit fails
(:meth:`DraReservations.release`).

A claim is reserved once per commit that chose devices for it, counted: two gangs of one
cycle that share a claim never both choose (the solver gives the second the first one's
allocation), but a claim whose write failed may be chosen again while an older commit still
holds it, and then only the same devices are accepted. A device is never reserved for two
claims: :meth:`DraReservations.reserve` refuses, naming both.

The record also carries whether claims may be written at all: after a 403 the commit calls
:meth:`DraReservations.forbid_writes`, pods with claims wait naming the permission
(:attr:`DraReservations.forbidden`), and the write is tried again after a while
(:meth:`DraReservations.allow_writes`).

A reservation that is neither settled nor released within ``ttl`` seconds is dropped (a claim
deleted before the watch showed it allocated, a lost settle), so devices are never hidden for
good; :meth:`DraReservations.expire` is called by :meth:`DraReservations.devices`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    # Types only: the DRA domain loads the CEL library, which this record does not need.
    from scheduler.cluster.dra import ClaimAllocation, DeviceId

__all__ = ["DEFAULT_TTL", "DraReservations"]

log = structlog.get_logger("scheduler.cache")

#: Seconds a reservation lives without being settled or released.
DEFAULT_TTL = 120.0


@dataclass(slots=True)
class _Held:
    allocation: ClaimAllocation
    devices: frozenset[DeviceId]
    count: int
    since: float


def _held_devices(allocation: ClaimAllocation) -> frozenset[DeviceId]:
    """Devices an allocation takes (admin-access results take none, as in Kubernetes)."""
    return frozenset(r.device_id for r in allocation.results if not r.admin_access)


def _same_devices(a: ClaimAllocation, b: ClaimAllocation) -> bool:
    return {(r.request, r.device_id) for r in a.results} == {
        (r.request, r.device_id) for r in b.results
    }


class DraReservations:
    """Claims whose devices were chosen by a commit the watch does not show yet (see the
    module docstring). ``clock`` is injectable for tests."""

    def __init__(
        self, *, ttl: float = DEFAULT_TTL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl = ttl
        self._clock = clock
        self._held: dict[str, _Held] = {}
        #: Which claim holds each reserved device.
        self._owner: dict[DeviceId, str] = {}
        self._devices: frozenset[DeviceId] | None = frozenset()
        #: Why claims cannot be written now (a 403), else None.
        self.forbidden: str | None = None
        self._forbid_token = 0

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, claim_key: object) -> bool:
        return claim_key in self._held

    # --- reserving -----------------------------------------------------------------------

    def check(self, claim_key: str, allocation: ClaimAllocation) -> str | None:
        """Why ``allocation`` cannot be reserved for ``claim_key`` now, or None."""
        held = self._held.get(claim_key)
        if held is not None and not _same_devices(held.allocation, allocation):
            return (
                f"ResourceClaim {claim_key} is being allocated other devices by a commit in flight"
            )
        for device in sorted(_held_devices(allocation)):
            owner = self._owner.get(device)
            if owner is not None and owner != claim_key:
                return (
                    f"device {'/'.join(device)} is being allocated to ResourceClaim {owner} "
                    f"by a commit in flight, so ResourceClaim {claim_key} cannot have it"
                )
        return None

    def reserve(self, claim_key: str, allocation: ClaimAllocation) -> str | None:
        """Hold ``allocation``'s devices for ``claim_key``; None when done, else why not (the
        devices or the claim are held otherwise, nothing changes)."""
        return self.reserve_all([(claim_key, allocation)])

    def reserve_all(self, items: Iterable[tuple[str, ClaimAllocation]]) -> str | None:
        """Reserve every (claim key, allocation), or none of them: why not (see
        :meth:`check`; also two different allocations for one claim in ``items``)."""
        wanted = list(items)
        seen: dict[str, ClaimAllocation] = {}
        taken: dict[DeviceId, str] = {}
        for key, allocation in wanted:
            why = self.check(key, allocation)
            if why is not None:
                return why
            other = seen.setdefault(key, allocation)
            if not _same_devices(other, allocation):
                return f"ResourceClaim {key} was given two different allocations"
            for device in _held_devices(allocation):
                if taken.setdefault(device, key) != key:
                    return (
                        f"device {'/'.join(device)} was chosen for both ResourceClaim "
                        f"{taken[device]} and ResourceClaim {key}"
                    )
        now = self._clock()
        for key, allocation in wanted:
            held = self._held.get(key)
            if held is None:
                devices = _held_devices(allocation)
                self._held[key] = _Held(allocation, devices, 1, now)
                for device in devices:
                    self._owner[device] = key
                self._devices = None
            else:
                held.count += 1
                held.since = now
        return None

    def release(self, claim_key: str) -> None:
        """One commit that reserved ``claim_key`` failed: its hold ends (the devices are free
        again once no other commit holds the claim)."""
        held = self._held.get(claim_key)
        if held is None:
            return
        held.count -= 1
        if held.count <= 0:
            self._drop(claim_key)

    def settle(self, claim_key: str) -> None:
        """The watch shows ``claim_key`` allocated (or gone): its devices are counted from
        the claim itself now, whoever held it."""
        if claim_key in self._held:
            self._drop(claim_key)

    def rename(self, old_key: str, new_key: str) -> None:
        """The claim reserved as ``old_key`` was created as ``new_key`` (the claim for a pod's
        extended resources is reserved under a stand-in key before its name is generated), so
        :meth:`settle` finds it when the watch shows it."""
        held = self._held.pop(old_key, None)
        if held is None or old_key == new_key:
            if held is not None:
                self._held[old_key] = held
            return
        self._held[new_key] = held
        for device in held.devices:
            if self._owner.get(device) == old_key:
                self._owner[device] = new_key

    def _drop(self, claim_key: str) -> None:
        held = self._held.pop(claim_key)
        for device in held.devices:
            if self._owner.get(device) == claim_key:
                del self._owner[device]
        self._devices = None

    # --- reading -------------------------------------------------------------------------

    def allocation(self, claim_key: str) -> ClaimAllocation | None:
        """The allocation a commit in flight is writing for ``claim_key``, if any."""
        held = self._held.get(claim_key)
        return held.allocation if held is not None else None

    def devices(self) -> frozenset[DeviceId]:
        """Every device reserved now (expired reservations dropped first)."""
        self.expire()
        if self._devices is None:
            self._devices = frozenset(self._owner)
        return self._devices

    def expire(self) -> list[str]:
        """Drop reservations older than :attr:`ttl`; the claims dropped."""
        cutoff = self._clock() - self.ttl
        old = [key for key, held in self._held.items() if held.since < cutoff]
        for key in old:
            log.warning("dra_reservation_expired", claim=key, ttl=self.ttl)
            self._drop(key)
        return old

    # --- permission ----------------------------------------------------------------------

    def forbid_writes(self, message: str) -> int:
        """Claims cannot be written (``message`` says why and what to grant); a token for
        :meth:`allow_writes`."""
        self._forbid_token += 1
        self.forbidden = message
        return self._forbid_token

    def allow_writes(self, token: int) -> None:
        """Try writing claims again, unless they were forbidden again since ``token``."""
        if token == self._forbid_token:
            self.forbidden = None
