"""Devices during one cycle's placement: which a placed pod's ResourceClaims take, and
whether a pod's claims can be allocated on a node given what is taken so far.

A :class:`DraState` belongs to a :class:`~scheduler.solver.state.ClusterState` (its ``dra``)
and follows it: :meth:`~DraState.take` when a pod is applied, :meth:`~DraState.give_back`
when it is released. Devices start taken when a claim allocated before the cycle holds them,
or a commit still in flight reserved them (:attr:`DraView.busy`).

The allocation itself is :func:`scheduler.cluster.dra_alloc.allocate_pod_claims`. A claim
allocated earlier in the same cycle (another pod of the gang, or of another gang, shares it)
is treated as allocated: the next pod must go where those devices are reachable, and its
:class:`~scheduler.solver.placement.ClaimGrant` carries the same allocation, so the commit
writes it once and adds each pod to ``reservedFor``. A claim allocated before the cycle gets
a grant without an allocation.

Results are cached per (pod, node) until a device is taken or given back, because the
greedy asks the same pair while it ranks nodes and again when it builds the assignment.

Pods with claims are placed by the greedy pass only (the CP-SAT stages count pods per node
class and cannot see devices; :func:`scheduler.solver.solve.solve` keeps such gangs as the
greedy placed them and leaves them out of taking back).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from scheduler.cluster.dra import ClaimAllocation, DeviceClass, DeviceId, ResourceClaim
from scheduler.cluster.dra_alloc import (
    AllocationFailure,
    DeviceCatalog,
    DeviceMatcher,
    allocate_pod_claims,
)
from scheduler.cluster.dra_extended import (
    SpecialClaim,
    backed_on_node,
    classes_by_resource,
    special_claim,
)
from scheduler.cluster.draview import DraView
from scheduler.cluster.node import Node
from scheduler.cluster.pod import Pod
from scheduler.solver.placement import ClaimGrant

__all__ = ["CANNOT_ALLOCATE", "SHARED_MATCHER", "UNKNOWN_CLAIMS", "DraState", "needs_devices"]

#: Selector results per device, kept across cycles (a device's results are recomputed only
#: when its slice publishes it differently): without it every cycle evaluates every
#: selector on every device, most of a cycle's time with thousands of devices. Solves run
#: one at a time (a worker thread), so one matcher serves them all.
SHARED_MATCHER = DeviceMatcher()
#: Devices remembered before the shared matcher starts over.
MATCHER_LIMIT = 200_000

#: The filter's reason on one node, worded as kube-scheduler's DynamicResources plugin words
#: it (so a tally over nodes reads ``3 cannot allocate all claims``); the detail of the
#: first refusal is kept in :attr:`DraState.last_detail`.
CANNOT_ALLOCATE = "cannot allocate all claims"
#: The cycle has no claims for a pod that uses some (a snapshot built without them).
UNKNOWN_CLAIMS = "its ResourceClaims are not known to this cycle"


def needs_devices(pod: Pod) -> bool:
    """True for an unbound pod that uses ResourceClaims (see also
    :meth:`DraState.serves`: extended resources backed by DRA)."""
    return pod.resource_claims > 0 and pod.node_name is None


def _held(allocation: ClaimAllocation) -> frozenset[DeviceId]:
    """Devices an allocation takes (admin access takes none)."""
    return frozenset(r.device_id for r in allocation.results if not r.admin_access)


class DraState:
    """Devices taken during one cycle (see the module docstring)."""

    def __init__(self, view: DraView | None, matcher: DeviceMatcher | None = None) -> None:
        self.view = view if view is not None else DraView()
        self._matcher = matcher if matcher is not None else SHARED_MATCHER
        #: Devices nobody else may get now.
        self.busy: set[DeviceId] = set(self.view.busy)
        #: Node -> node-local devices not taken (filled per node on first use, then kept
        #: up to date as devices are taken and given back).
        self._free_local: dict[str, int] = {}
        #: Node -> its devices taken when the counts started (built on first use).
        self._busy_by_node: dict[str, int] | None = None
        self._served: dict[str, DeviceClass] | None = None
        self._specials: dict[tuple[str, tuple[str, ...]], SpecialClaim | None] = {}
        #: Claim key -> (allocation made this cycle, uids of the placed pods that use it).
        self.allocated: dict[str, tuple[ClaimAllocation, set[str]]] = {}
        #: The detailed reason of the latest refusal (which request, what is missing).
        self.last_detail = ""
        self._catalog: DeviceCatalog | None = None
        self._version = 0
        self._cache: dict[tuple[str, str], tuple[int, tuple[ClaimGrant, ...] | str]] = {}

    @property
    def catalog(self) -> DeviceCatalog:
        """The cycle's devices and classes (built on first use)."""
        if self._catalog is None:
            if len(self._matcher) > MATCHER_LIMIT:
                self._matcher.forget(frozenset())  # devices churned away: start over
            self._catalog = self.view.catalog(self._matcher)
        return self._catalog

    def _fewest(self, claims: Sequence[ResourceClaim]) -> int:
        """The fewest devices ``claims`` (of one pod, on one node) take: those not
        allocated yet, requests whose alternatives all say how many (0 when none)."""
        found = 0
        for c in claims:
            if c.allocation is not None or c.key in self.allocated:
                continue
            for r in c.requests:
                sizes = [
                    a.count if a.mode == "ExactCount" else 1
                    for a in r.alternatives
                    if not a.admin_access
                ]
                found += min(sizes) if sizes and len(sizes) == len(r.alternatives) else 0
        return found

    def _free_on(self, node: str) -> int:
        """Node-local devices of ``node`` not taken now."""
        if self._busy_by_node is None:
            # One pass over what is taken, counted per node (not one pass per node asked).
            catalog = self.catalog
            counts: dict[str, int] = {}
            for d in self.busy:
                owner = catalog.node_of(d)
                if owner is not None:
                    counts[owner] = counts.get(owner, 0) + 1
            self._busy_by_node = counts
        free = self._free_local.get(node)
        if free is None:
            free = self.catalog.local_count(node) - self._busy_by_node.get(node, 0)
            self._free_local[node] = free
        return free

    def _moved(self, devices: frozenset[DeviceId], sign: int) -> None:
        """Keep the counts of the nodes whose devices were taken (-1) or freed (+1)."""
        if self._busy_by_node is None:
            return  # not counted yet: the first count sees ``busy`` as it is then
        catalog = self.catalog
        for d in devices:
            node = catalog.node_of(d)
            if node is None:
                continue
            self._busy_by_node[node] = self._busy_by_node.get(node, 0) - sign
            if node in self._free_local:
                self._free_local[node] += sign

    # --- extended resources backed by DRA (scheduler.cluster.dra_extended) -----------------

    @property
    def served(self) -> dict[str, DeviceClass]:
        """Extended resource name -> the DeviceClass that serves it."""
        if self._served is None:
            self._served = classes_by_resource(self.view.classes)
        return self._served

    def serves(self, pod: Pod) -> bool:
        """True when a class serves an extended resource the pod asks for."""
        if not pod.extended_containers or not self.view.classes:
            return False
        served = self.served
        return any(n > 0 and r in served for c in pod.extended_containers for r, n in c.requests)

    def backed(self, pod: Pod, node: Node) -> tuple[str, ...]:
        """The pod's extended resources that ``node`` gives through DRA (sorted)."""
        if not self.serves(pod):
            return ()
        requested = {r for c in pod.extended_containers for r, n in c.requests if n > 0}
        return backed_on_node(requested, node.allocatable, self.served)

    def special_for(self, pod: Pod, node: Node) -> SpecialClaim | None:
        """The claim the scheduler would create for the pod's extended resources that
        ``node`` gives through DRA; None when there are none."""
        backed = self.backed(pod, node)
        if not backed:
            return None
        key = (pod.uid, backed)
        if key not in self._specials:
            self._specials[key] = special_claim(
                pod.namespace, pod.name, pod.extended_containers, backed, self.served
            )
        return self._specials[key]

    def claims_for(self, pod: Pod, node: Node) -> tuple[ResourceClaim, ...] | None:
        """The pod's claims on ``node``: its own (``spec.resourceClaims`` order), then the
        claim for its extended resources backed by DRA there; None when the cycle does not
        know its own."""
        own: tuple[ResourceClaim, ...] = ()
        if pod.resource_claims:
            found = self.claims_of(pod)
            if found is None:
                return None
            own = found
        special = self.special_for(pod, node)
        return own if special is None else (*own, special.claim)

    def claims_of(self, pod: Pod) -> tuple[ResourceClaim, ...] | None:
        """The pod's claims in ``spec.resourceClaims`` order; None when the cycle does not
        know them (then the pod cannot be placed)."""
        keys = self.view.claim_keys_by_pod.get(pod.uid)
        if keys is None:
            return None
        by_key = self.view.claim_by_key
        if any(k not in by_key for k in keys):
            return None
        return tuple(by_key[k] for k in keys)

    def grants(self, pod: Pod, node: Node) -> tuple[ClaimGrant, ...] | str:
        """What the pod's claims get on ``node`` with the devices taken now, or why not
        (:data:`CANNOT_ALLOCATE`/:data:`UNKNOWN_CLAIMS`; the detail in
        :attr:`last_detail`)."""
        key = (pod.uid, node.name)
        hit = self._cache.get(key)
        if hit is not None and hit[0] == self._version:
            if isinstance(hit[1], str):
                self.last_detail = hit[1]
                return CANNOT_ALLOCATE if hit[1] != UNKNOWN_CLAIMS else UNKNOWN_CLAIMS
            return hit[1]
        result = self._allocate(pod, node)
        self._cache[key] = (self._version, result)
        if isinstance(result, str):
            self.last_detail = result
            return CANNOT_ALLOCATE if result != UNKNOWN_CLAIMS else UNKNOWN_CLAIMS
        return result

    def _allocate(self, pod: Pod, node: Node) -> tuple[ClaimGrant, ...] | str:
        claims = self.claims_for(pod, node)
        if claims is None:
            return UNKNOWN_CLAIMS
        if not claims:
            return ()
        if not self.catalog.has_shared:
            # Every device is some node's own: too few free there is a quick no (most nodes,
            # once the cluster fills, for a pod whose gang tries them one by one).
            needed = self._fewest(claims)
            if needed and self._free_on(node.name) < needed:
                free = max(0, self._free_on(node.name))
                return (
                    f"node {node.name} has {free} free device{'' if free == 1 else 's'}; "
                    f"its ResourceClaims take at least {needed}"
                    f"{self.catalog.left_out_note(node.name)}"
                )
        # Claims allocated earlier this cycle are allocated as far as this pod goes.
        effective = [
            dataclasses.replace(c, allocation=self.allocated[c.key][0])
            if c.allocation is None and c.key in self.allocated
            else c
            for c in claims
        ]
        result = allocate_pod_claims(self.catalog, effective, node.name, node.label_map, self.busy)
        if isinstance(result, AllocationFailure):
            return result.reason
        special = self.special_for(pod, node)
        grants = [
            ClaimGrant(c.key, None if c.allocation is not None else alloc)
            for c, alloc in zip(claims, result, strict=True)
        ]
        if special is not None:
            # The claim the commit creates: what it asks, and which container uses what.
            grants[-1] = ClaimGrant(
                special.claim.key,
                grants[-1].allocation,
                tuple(
                    (r.name, r.alternatives[0].device_class, r.alternatives[0].count)
                    for r in special.claim.requests
                ),
                tuple((m.container, m.resource, m.request) for m in special.mappings),
            )
        return tuple(grants)

    def check(self, pod: Pod, node_of: Callable[[str], Node]) -> Callable[[str], str | None]:
        """A node check for the greedy: None when the pod's claims can be allocated on the
        named node now, else the reason (:meth:`grants`)."""

        def accept(name: str) -> str | None:
            found = self.grants(pod, node_of(name))
            return found if isinstance(found, str) else None

        return accept

    def take(self, pod: Pod, node: Node, grants: Sequence[ClaimGrant]) -> None:
        """The ``pod`` placed on ``node`` holds what ``grants`` allocate. Raises ValueError
        (nothing taken) when the pod's claims are not all granted, a device is taken
        already, or a claim was allocated differently earlier this cycle."""
        claims = self.claims_for(pod, node)
        if claims is None:
            raise ValueError(f"pod {pod.key}: {UNKNOWN_CLAIMS}")
        if [g.claim for g in grants] != [c.key for c in claims]:
            raise ValueError(f"pod {pod.key}: its ResourceClaims are not all allocated")
        new: dict[str, ClaimAllocation] = {}
        for claim, grant in zip(claims, grants, strict=True):
            if grant.allocation is None:
                if claim.allocation is None and claim.key not in self.allocated:
                    raise ValueError(f"pod {pod.key}: claim {claim.key} is not allocated")
                continue
            known = self.allocated.get(claim.key)
            if known is not None:
                if known[0] != grant.allocation:
                    raise ValueError(
                        f"pod {pod.key}: claim {claim.key} was allocated other devices this cycle"
                    )
                continue
            if claim.allocation is not None:
                raise ValueError(f"pod {pod.key}: claim {claim.key} is allocated already")
            taken = _held(grant.allocation)
            clash = taken & self.busy or any(taken & _held(a) for a in new.values())
            if clash:
                raise ValueError(f"pod {pod.key}: claim {claim.key} gets a device in use")
            new[claim.key] = grant.allocation
        for claim in claims:
            if claim.key in new:
                self.allocated[claim.key] = (new[claim.key], {pod.uid})
                taken_now = _held(new[claim.key])
                self.busy |= taken_now
                self._moved(taken_now, -1)
            elif claim.key in self.allocated:
                self.allocated[claim.key][1].add(pod.uid)
        self._version += 1

    def give_back(self, pod: Pod, grants: Sequence[ClaimGrant]) -> None:
        """The pod is released: claims it alone used this cycle free their devices."""
        for grant in grants:
            known = self.allocated.get(grant.claim)
            if known is None:
                continue
            known[1].discard(pod.uid)
            if not known[1]:
                del self.allocated[grant.claim]
                freed = _held(known[0])
                self.busy -= freed
                self._moved(freed, +1)
        self._version += 1
