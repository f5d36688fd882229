"""ResourceClaims in the simulated cluster: made, allocated, reserved and freed the way
Kubernetes does it, so a cycle sees the devices of running pods as taken.

- A pod's ``spec.resourceClaims`` entries (:class:`ClaimRef`) name a claim of the scenario
  (``resourceClaimName``: shared by every pod naming it) or a ResourceClaimTemplate
  (``resourceClaimTemplateName``): when the pod arrives a claim ``<pod>-<entry>`` is made
  from the template for it alone, as kube-controller-manager's ResourceClaim controller does
  (it adds a random suffix; a simulation needs reproducible names).
- When a pod is bound, each :class:`~scheduler.solver.placement.ClaimGrant` of its
  assignment is written as the live commit writes it: ``status.allocation`` when the grant
  carries one, and the pod added to ``status.reservedFor``.
- When a pod ends (completes, fails, or leaves after an eviction), it leaves the
  ``reservedFor`` of its claims; a claim nobody reserves any more is deallocated (the
  controller does so for claims carrying the scheduler's delete-protection finalizer), and a
  claim made from a template for the pod is deleted with it.

The DRA types pull in the CEL library, so the backend imports this module only for
scenarios with devices or claims.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from scheduler.cluster.dra import (
    ConsumerRef,
    DeviceClass,
    DeviceId,
    DeviceRequest,
    RequestAlternative,
    ResourceClaim,
    ResourceSlice,
)
from scheduler.cluster.dra_alloc import allocated_devices
from scheduler.cluster.draview import DraView
from scheduler.cluster.pod import Pod
from scheduler.simulate.workload import ClaimRef
from scheduler.solver.placement import ClaimGrant, PodAssignment

__all__ = ["ClaimRef", "SimulatedClaims"]


def _consumer(pod: Pod) -> ConsumerRef:
    return ConsumerRef("pods", pod.name, pod.uid)


class SimulatedClaims:
    """The classes, slices and claims of a simulated cluster, and which pods use which
    claims (see the module docstring). ``templates``: ResourceClaimTemplates by
    ``namespace/name``, as claims whose name is the template's."""

    def __init__(
        self,
        view: DraView | None = None,
        templates: Iterable[ResourceClaim] = (),
    ) -> None:
        view = view or DraView()
        self.classes: tuple[DeviceClass, ...] = view.classes
        self.slices: tuple[ResourceSlice, ...] = view.slices
        #: Claims by ``namespace/name`` (allocation and reservedFor kept current).
        self.claims: dict[str, ResourceClaim] = {c.key: c for c in view.claims}
        self.templates: dict[str, ResourceClaim] = {t.key: t for t in templates}
        #: Pod uid -> its claim keys, in ``spec.resourceClaims`` order.
        self.pod_claims: dict[str, tuple[str, ...]] = {}
        #: Pod uid -> its entries (a replacement pod gets claims the same way).
        self.refs: dict[str, tuple[ClaimRef, ...]] = {}
        #: Claim key -> uid of the pod it was made for (claims from templates).
        self.owner: dict[str, str] = {}
        #: Devices a live snapshot saw reserved by commits in flight (kept: nothing here
        #: completes those commits).
        self.reserved: frozenset[DeviceId] = frozenset(view.reserved)

    def add_pod(self, pod: Pod, refs: Sequence[ClaimRef]) -> None:
        """A pod arrives: its template claims are made; a pod that comes bound (already
        running) reserves its claims at once. Raises ValueError for a claim or template
        that does not exist (the scenario checks this first)."""
        if not refs:
            return
        keys: list[str] = []
        for ref in refs:
            if not ref.template:
                key = f"{pod.namespace}/{ref.target}"
                if key not in self.claims:
                    raise ValueError(f"pod {pod.key}: ResourceClaim {key} does not exist")
                keys.append(key)
                continue
            template = self.templates.get(f"{pod.namespace}/{ref.target}")
            if template is None:
                raise ValueError(
                    f"pod {pod.key}: ResourceClaimTemplate {pod.namespace}/{ref.target} "
                    "does not exist"
                )
            name = f"{pod.name}-{ref.name}"
            while f"{pod.namespace}/{name}" in self.claims:  # as generateName avoids clashes
                name += "-x"
            claim = dataclasses.replace(
                template, name=name, uid=f"{pod.namespace}/{name}", allocation=None,
                reserved_for=(),
            )  # fmt: skip
            self.claims[claim.key] = claim
            self.owner[claim.key] = pod.uid
            keys.append(claim.key)
        self.pod_claims[pod.uid] = tuple(keys)
        self.refs[pod.uid] = tuple(refs)
        if pod.bound:
            for key in keys:
                self._reserve(key, pod)

    def use(self, pod: Pod, keys: Sequence[str]) -> None:
        """A pod of a live snapshot uses these existing claims (``namespace/name``; those
        that do not exist are left out): it is in their reservedFor once bound, and leaves
        it when it ends."""
        found = tuple(k for k in keys if k in self.claims)
        if not found:
            return
        self.pod_claims[pod.uid] = found
        self.refs[pod.uid] = tuple(ClaimRef(k.split("/", 1)[1], k.split("/", 1)[1]) for k in found)
        if pod.bound:
            for key in found:
                self._reserve(key, pod)

    def view(self, pending: Iterable[Pod]) -> DraView:
        """The DRA part of a snapshot with these ``pending`` pods."""
        pod_claims = {p.uid: self.pod_claims[p.uid] for p in pending if p.uid in self.pod_claims}
        claims = list(self.claims.values())
        return DraView.build(self.classes, self.slices, claims, pod_claims, self.reserved)

    def problem(self, assignments: Sequence[PodAssignment]) -> str:
        """Why the assignments' claim grants cannot be written now (empty: they can): a
        claim that does not exist, a claim allocated already to other devices, or a device
        another claim holds."""
        held = allocated_devices(self.claims.values())
        new: dict[str, frozenset[DeviceId]] = {}
        for a in assignments:
            for grant in a.claims:
                claim = self.claims.get(grant.claim)
                if claim is None and grant.extended and grant.allocation is not None:
                    # The claim for the pod's extended resources: made at bind (see bind).
                    namespace, name = grant.claim.split("/", 1)
                    claim = ResourceClaim(namespace, name)
                if claim is None:
                    return f"ResourceClaim {grant.claim} does not exist"
                if grant.allocation is None:
                    if claim.allocation is None and grant.claim not in new:
                        return f"ResourceClaim {grant.claim} is not allocated"
                    continue
                if claim.allocation is not None:
                    if claim.allocation != grant.allocation:
                        return f"ResourceClaim {grant.claim} is allocated already"
                    continue
                devices = frozenset(
                    r.device_id for r in grant.allocation.results if not r.admin_access
                )
                if grant.claim in new:
                    if new[grant.claim] != devices:
                        return f"ResourceClaim {grant.claim} gets two allocations"
                    continue
                taken = held | set().union(*new.values()) if new else held
                clash = devices & taken
                if clash:
                    return f"ResourceClaim {grant.claim}: device {sorted(clash)[0]} is in use"
                new[grant.claim] = devices
        return ""

    def bind(self, pod: Pod, grants: Sequence[ClaimGrant]) -> None:
        """The pod is bound (or held on its node): write each grant's allocation and
        reserve the claims for it."""
        for grant in grants:
            if grant.extended:
                grant = self._make_extended(pod, grant)
            claim = self.claims.get(grant.claim)
            if claim is None:
                continue
            if grant.allocation is not None and claim.allocation is None:
                self.claims[grant.claim] = dataclasses.replace(claim, allocation=grant.allocation)
            self._reserve(grant.claim, pod)

    def _make_extended(self, pod: Pod, grant: ClaimGrant) -> ClaimGrant:
        """Create the claim for the pod's extended resources backed by DRA (owned by the
        pod, deleted with it), as the scheduler's commit does; the grant under its name."""
        name = f"{pod.name}-extended-resources"
        while f"{pod.namespace}/{name}" in self.claims:  # as generateName avoids clashes
            name += "-x"
        requests = tuple(
            DeviceRequest(req, (RequestAlternative(req, cls, count=count),))
            for req, cls, count in grant.requests
        )
        claim = ResourceClaim(pod.namespace, name, f"{pod.namespace}/{name}", requests)
        self.claims[claim.key] = claim
        self.owner[claim.key] = pod.uid
        self.pod_claims[pod.uid] = (*self.pod_claims.get(pod.uid, ()), claim.key)
        return dataclasses.replace(grant, claim=claim.key, requests=(), mappings=())

    def release(self, pod: Pod) -> None:
        """The pod is gone: it leaves its claims' reservedFor; an unreserved claim is
        deallocated, and one made for this pod is deleted."""
        for key in self.pod_claims.pop(pod.uid, ()):
            claim = self.claims.get(key)
            if claim is None:
                continue
            rest = tuple(r for r in claim.reserved_for if r.uid != pod.uid)
            if self.owner.get(key) == pod.uid:
                del self.claims[key]
                del self.owner[key]
                continue
            allocation = claim.allocation if rest else None
            self.claims[key] = dataclasses.replace(claim, reserved_for=rest, allocation=allocation)
        self.refs.pop(pod.uid, None)

    def replaced(self, old: Pod, new: Pod) -> None:
        """The job made ``new`` in place of the evicted ``old``: it gets claims the same way."""
        refs = self.refs.get(old.uid)
        if refs:
            self.add_pod(new, refs)

    def _reserve(self, key: str, pod: Pod) -> None:
        claim = self.claims[key]
        if any(r.uid == pod.uid for r in claim.reserved_for):
            return
        self.claims[key] = dataclasses.replace(
            claim, reserved_for=(*claim.reserved_for, _consumer(pod))
        )
