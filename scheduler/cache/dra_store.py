"""The cache's DRA part: what :class:`~scheduler.cache.store.Cache` does with DeviceClasses,
ResourceSlices, ResourceClaims and the claims of pending pods.

It owns the :class:`~scheduler.cache.dra.DraIndex` (made on first use: it loads the CEL
library, which most clusters never need), turns the index's parse problems into
:class:`~scheduler.cache.problems.Problem`\\ s (a Warning Event naming the field; the object is
left out), keeps the devices of commits in flight
(:class:`~scheduler.cache.dra_reservations.DraReservations`) until a claim's watch event
settles them, and gives the snapshot its :class:`~scheduler.cluster.draview.DraView`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from scheduler.cache.problems import Problem
from scheduler.cluster.dracodes import CLAIM_NOT_READY
from scheduler.cluster.pod import Pod
from scheduler.k8s.resources import KINDS

if TYPE_CHECKING:
    from scheduler.cache.dra import DraIndex, DraKind, DraProblem
    from scheduler.cache.dra_reservations import DraReservations
    from scheduler.cluster.dra import DeviceId
    from scheduler.cluster.draview import DraView

__all__ = ["DRA_KIND_NAMES", "StoreDra"]

#: The DRA kinds (``resource.k8s.io/v1``) the store hands to its :class:`DraIndex`.
DRA_KIND_NAMES: frozenset[str] = frozenset({"DeviceClass", "ResourceSlice", "ResourceClaim"})


class StoreDra:
    """DRA objects and claim verdicts of one cache (see the module docstring)."""

    def __init__(self) -> None:
        self._index: DraIndex | None = None
        #: DRA kinds whose API is missing (as the watcher found).
        self._absent: frozenset[str] = frozenset()
        #: Parse problems of DRA objects, as Events (by (kind, key)).
        self._problems: dict[tuple[str, str], Problem] = {}
        #: Devices chosen by commits whose claims the watch does not show allocated yet.
        self._reservations: DraReservations | None = None

    @property
    def index(self) -> DraIndex:
        """The DRA objects and the claim verdicts of pending pods; made on first use."""
        if self._index is None:
            from scheduler.cache.dra import DraIndex

            self._index = DraIndex()
            self._index.set_absent(cast("set[DraKind]", set(self._absent)))
        return self._index

    def set_absent(self, absent: frozenset[str] | set[str]) -> None:
        """The DRA kinds whose API is missing now (pods with claims wait naming them)."""
        self._absent = frozenset(absent) & DRA_KIND_NAMES
        if self._index is not None:
            self._index.set_absent(cast("set[DraKind]", set(self._absent)))

    def upsert(self, kind: str, key: str, obj: Mapping[str, Any]) -> bool:
        """A DRA object arrived or changed; True when devices or verdicts changed."""
        changed = self.index.upsert(cast("DraKind", kind), key, obj)
        self._note_problem(kind, key, obj)
        if kind == "ResourceClaim" and self._reservations is not None:
            claim = self.index.claims.get(key)
            if claim is not None and claim.allocation is not None:
                self._reservations.settle(key)  # the claim itself holds the devices now
        return changed

    def delete(self, kind: str, key: str) -> bool:
        """A DRA object is gone; True when devices or verdicts changed."""
        self._problems.pop((kind, key), None)
        changed = self._index is not None and self._index.delete(cast("DraKind", kind), key)
        if kind == "ResourceClaim" and self._reservations is not None:
            self._reservations.settle(key)
        return changed

    def pod_removed(self, uid: str) -> bool:
        """A pod is gone or no longer waits on claims; True when its verdict went."""
        return self._index is not None and self._index.pod_removed(uid)

    def track_claims(self, uid: str, pod: Pod | None, obj: Mapping[str, Any]) -> bool:
        """Keep the verdict of a pending pod of ours that uses ResourceClaims; True when it
        changed."""
        if pod is not None and pod.resource_claims and pod.managed and pod.node_name is None:
            return self.index.pod_changed(uid, obj)
        return self.pod_removed(uid)

    def _note_problem(self, kind: str, key: str, obj: Mapping[str, Any]) -> None:
        found: DraProblem | None = self.index.problems.get((cast("DraKind", kind), key))
        if found is None:
            self._problems.pop((kind, key), None)
            return
        meta = obj.get("metadata") or {}
        rk = KINDS.get(kind)
        self._problems[(kind, key)] = Problem(
            kind=kind,
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            field=found.field,
            message=found.message,
            uid=str(meta.get("uid") or ""),
            api_version=rk.api_version if rk is not None else "resource.k8s.io/v1",
        )

    def problems(self) -> list[Problem]:
        """Parse problems of DRA objects, in (kind, key) order."""
        return [self._problems[k] for k in sorted(self._problems)]

    def claims_waits(self) -> dict[str, tuple[str, str]]:
        """Pod uid -> (code, message) for the pending pods whose ResourceClaims hold them
        back (:class:`~scheduler.cache.dra.ClaimsWait`)."""
        if self._index is None:
            return {}
        from scheduler.cache.dra import ClaimsWait

        return {
            uid: (CLAIM_NOT_READY, v.reason)
            for uid, v in self._index.verdicts.items()
            if isinstance(v, ClaimsWait)
        }

    def view(self, pods: tuple[Pod, ...]) -> tuple[tuple[Pod, ...], DraView | None]:
        """The snapshot's DRA part (None when there is nothing about devices), and the pods
        with the GPU-class devices of their claims counted (:mod:`scheduler.cache.dra_usage`)."""
        if self._index is None:
            return pods, None
        view = self._index.view(self._index.verdicts, self.reserved_devices())
        if view.empty:
            return pods, None
        from scheduler.cache.dra_usage import with_claim_gpus

        return with_claim_gpus(pods, view), view

    @property
    def reservations(self) -> DraReservations:
        """Devices chosen by commits whose claims the watch does not show allocated yet
        (made on first use)."""
        if self._reservations is None:
            from scheduler.cache.dra_reservations import DraReservations

            self._reservations = DraReservations()
        return self._reservations

    def reserved_devices(self) -> frozenset[DeviceId]:
        """Devices chosen by commits whose claim status the watch does not show yet."""
        if self._reservations is None:
            return frozenset()
        return self._reservations.devices()
