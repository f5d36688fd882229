"""The DRA part of a snapshot: what one cycle knows about devices and claims.

A :class:`DraView` holds source facts only - the DeviceClasses, the ResourceSlices, the
ResourceClaims, which claims each pending pod uses, and the devices reserved by commits still
in flight - so a saved snapshot replays the same device decisions. What is free is derived:
:attr:`DraView.busy` (devices held by claim allocations plus the reserved ones) and
:meth:`DraView.catalog`.

It lives apart from :mod:`scheduler.cluster.snapshot` because the DRA types pull in the CEL
library; a snapshot without devices never imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from scheduler.cluster.dra import DeviceClass, DeviceId, ResourceClaim, ResourceSlice
from scheduler.cluster.dra_alloc import DeviceCatalog, DeviceMatcher, allocated_devices

__all__ = ["DraView"]


@dataclass(frozen=True)
class DraView:
    """Devices and claims of one cycle (every field sorted, so equal views encode equally)."""

    classes: tuple[DeviceClass, ...] = ()
    #: Every slice seen (all generations; :meth:`catalog` keeps the newest of each pool).
    slices: tuple[ResourceSlice, ...] = ()
    #: Every claim the scheduler may need: those of pending pods and those holding devices.
    claims: tuple[ResourceClaim, ...] = ()
    #: Pending pod uid -> ``namespace/name`` of its claims, in ``spec.resourceClaims`` order
    #: (only pods whose claims are all usable; the others wait with a reason).
    pod_claims: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: Devices chosen by commits whose claim status the watch does not show yet.
    reserved: tuple[DeviceId, ...] = ()

    @classmethod
    def build(
        cls,
        classes: tuple[DeviceClass, ...] | list[DeviceClass] = (),
        slices: tuple[ResourceSlice, ...] | list[ResourceSlice] = (),
        claims: tuple[ResourceClaim, ...] | list[ResourceClaim] = (),
        pod_claims: dict[str, tuple[str, ...]] | None = None,
        reserved: frozenset[DeviceId] | set[DeviceId] = frozenset(),
    ) -> DraView:
        """A view with every field in a canonical order."""
        return cls(
            classes=tuple(sorted(classes, key=lambda c: c.name)),
            slices=tuple(sorted(slices, key=lambda s: s.name)),
            claims=tuple(sorted(claims, key=lambda c: c.key)),
            pod_claims=tuple(sorted((pod_claims or {}).items())),
            reserved=tuple(sorted(reserved)),
        )

    @property
    def empty(self) -> bool:
        """True when there is nothing about devices (the snapshot leaves the part out)."""
        return not (self.classes or self.slices or self.claims or self.pod_claims or self.reserved)

    @cached_property
    def class_by_name(self) -> dict[str, DeviceClass]:
        """DeviceClasses by name."""
        return {c.name: c for c in self.classes}

    @cached_property
    def claim_by_key(self) -> dict[str, ResourceClaim]:
        """Claims by ``namespace/name``."""
        return {c.key: c for c in self.claims}

    @cached_property
    def claim_keys_by_pod(self) -> dict[str, tuple[str, ...]]:
        """Pending pod uid -> its claim keys."""
        return dict(self.pod_claims)

    def claims_of(self, pod_uid: str) -> tuple[ResourceClaim, ...]:
        """The claims of a pending pod (empty when it has none or one is not in the view)."""
        keys = self.claim_keys_by_pod.get(pod_uid, ())
        found = tuple(self.claim_by_key[k] for k in keys if k in self.claim_by_key)
        return found if len(found) == len(keys) else ()

    @cached_property
    def busy(self) -> frozenset[DeviceId]:
        """Devices nobody else may get: held by claim allocations, or reserved."""
        return frozenset(allocated_devices(self.claims)) | frozenset(self.reserved)

    def catalog(self, matcher: DeviceMatcher | None = None) -> DeviceCatalog:
        """The devices and classes, for allocation (``matcher``: selector results to reuse,
        e.g. the cache's, which outlives the cycle)."""
        return DeviceCatalog(self.slices, self.class_by_name, matcher)
