"""Choosing devices for ResourceClaims on one node (pure: no I/O, no solver).

A :class:`DeviceCatalog` holds one cycle's devices: the current slices (newest pool
generation), which nodes reach each device, the DeviceClasses, and the selector results. The
set of devices an alternative of a request accepts (class selectors AND request selectors)
is computed once per distinct (class, selectors) over all devices and reused for every node
and every claim that asks the same thing; the CEL result per (expression, device) lives in a
:class:`DeviceMatcher` that can outlive the cycle. So the per-node work is set arithmetic
over the handful of devices on that node.

Per claim (:func:`allocate_claim`), requests are served in order. An ``exactly`` request has
one alternative, a ``firstAvailable`` request tries its alternatives in order and keeps the
first that leaves the rest of the claim satisfiable. ``ExactCount`` takes ``count`` devices;
``All`` takes every matching device the node reaches and fails if one of them is in use or a
pool is incomplete. ``matchAttribute`` constraints are met by trying the candidate devices
grouped by the attribute's value (a handful of groups per node), backtracking to the
previous request when a later one cannot fit (within a budget of tries per claim and node,
so a pathological claim fails with a reason instead of stalling the cycle). ``adminAccess``
devices may already be in use and do not count as used afterwards. Several claims of one
pod (:func:`allocate_pod_claims`) are allocated one after another, never sharing a device.

A failure is a value (:class:`AllocationFailure`) whose reason names the request and what is
missing, e.g. ``request gpu: 2 devices of class gpu.example.com wanted, 1 matches on node
n1``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from scheduler.cluster.dra import (
    ClaimAllocation,
    Device,
    DeviceClass,
    DeviceConstraint,
    DeviceId,
    DeviceRequest,
    DeviceResult,
    RequestAlternative,
    ResourceClaim,
    ResourceSlice,
    current_slices,
)
from scheduler.cluster.dracel import (
    AttributeValue,
    CompiledSelector,
    DeviceEnv,
    Evaluation,
    compile_selector,
)
from scheduler.cluster.selectors import NodeSelectorRequirement, NodeSelectorTerm

__all__ = [
    "AllocationFailure",
    "Candidate",
    "DeviceCatalog",
    "DeviceMatcher",
    "allocate_claim",
    "allocate_pod_claims",
    "allocated_devices",
    "node_name_selector",
]


@dataclass(frozen=True, slots=True)
class AllocationFailure:
    """Why a claim (or a pod's claims) cannot be allocated on a node."""

    reason: str


_PASS = Evaluation(True)
#: Backtracking budget per claim and node (requests x alternatives x attribute groups).
_MAX_STEPS = 2000


@dataclass(slots=True)
class _Entry:
    device: Device
    env: DeviceEnv
    results: dict[str, Evaluation] = field(default_factory=dict)


class DeviceMatcher:
    """Selector results per (device, expression), kept while the device is unchanged.
    Reuse one across cycles: a device's results are dropped only when its slice publishes
    it with other attributes or capacity."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[DeviceId, _Entry] = {}

    def evaluate(
        self, device_id: DeviceId, device: Device, selectors: Sequence[CompiledSelector]
    ) -> Evaluation:
        """Whether ``device`` (named ``device_id``) passes every selector: a match, or the
        first selector's failure."""
        entry = self._entries.get(device_id)
        if entry is None or (entry.device is not device and entry.device != device):
            env = DeviceEnv(
                device_id[0],
                dict(device.attributes),
                dict(device.capacity),
                allow_multiple_allocations=device.allow_multiple_allocations,
            )
            entry = _Entry(device, env)
            self._entries[device_id] = entry
        results = entry.results
        for selector in selectors:
            result = results.get(selector.expression)
            if result is None:
                result = entry.env.evaluate(selector)
                results[selector.expression] = result
            if not result.matched:
                return result
        return _PASS

    def __len__(self) -> int:
        return len(self._entries)

    def forget(self, keep: AbstractSet[DeviceId]) -> None:
        """Drop devices not in ``keep`` (slices deleted since)."""
        for key in [k for k in self._entries if k not in keep]:
            del self._entries[key]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A device in reach of a node, with the slice it comes from."""

    id: DeviceId
    device: Device
    slice: ResourceSlice


@dataclass(frozen=True, slots=True)
class _Matching:
    ids: frozenset[DeviceId]
    error: str | None  # the class is missing, or the first CEL error seen


def node_name_selector(node_name: str) -> tuple[NodeSelectorTerm, ...]:
    """A node selector that picks exactly ``node_name`` (``matchFields`` on metadata.name)."""
    return (NodeSelectorTerm((NodeSelectorRequirement("metadata.name", "In", (node_name,)),)),)


class DeviceCatalog:
    """One cycle's devices, the nodes that reach them, and the DeviceClasses."""

    def __init__(
        self,
        slices: Iterable[ResourceSlice],
        classes: Mapping[str, DeviceClass],
        matcher: DeviceMatcher | None = None,
    ) -> None:
        current, self.incomplete_pools = current_slices(slices)
        self.classes = classes
        self.matcher = matcher if matcher is not None else DeviceMatcher()
        self._local: dict[str, list[Candidate]] = {}
        self._shared: list[Candidate] = []
        self._all: list[Candidate] = []
        #: Node ("" for network-attached pools) -> why its devices that are never
        #: allocated are left out (see :attr:`Device.left_out`).
        self.left_out: dict[str, list[str]] = {}
        for s in current:
            for d in s.devices:
                if d.left_out:
                    self.left_out.setdefault(s.node_name or "", []).append(d.left_out)
                    continue
                cand = Candidate((s.driver, s.pool, d.name), d, s)
                self._all.append(cand)
                if s.node_name is not None:
                    self._local.setdefault(s.node_name, []).append(cand)
                else:
                    self._shared.append(cand)
        for cands in self._local.values():
            cands.sort(key=lambda c: c.id)
        self._node_of: dict[DeviceId, str] | None = None
        self._matching: dict[tuple[str, tuple[str, ...]], _Matching] = {}
        self._on_node: dict[tuple[str, tuple[str, ...], str], list[Candidate]] = {}

    def left_out_note(self, node_name: str) -> str:
        """`` (N left out here: why)`` when devices of ``node_name`` are never allocated
        (see :attr:`Device.left_out`), else empty: said wherever a node lacks devices."""
        left = self.left_out.get(node_name, [])
        return f" ({len(left)} left out here: {left[0]})" if left else ""

    @property
    def has_shared(self) -> bool:
        """True when some pool is network-attached (reached by a node selector or by all
        nodes) rather than published for one node."""
        return bool(self._shared)

    def local_count(self, node_name: str) -> int:
        """How many devices are published for ``node_name`` itself."""
        return len(self._local.get(node_name, ()))

    def node_of(self, device_id: DeviceId) -> str | None:
        """The node a node-local device belongs to (None for network-attached devices)."""
        if self._node_of is None:
            self._node_of = {c.id: n for n, cands in self._local.items() for c in cands}
        return self._node_of.get(device_id)

    def devices_for_node(self, node_name: str, labels: Mapping[str, str]) -> list[Candidate]:
        """The devices a pod on ``node_name`` can use: the node's own, then network-attached
        pools whose selector picks the node."""
        local = self._local.get(node_name, [])
        if not self._shared:
            return local
        return local + [c for c in self._shared if c.slice.reaches(node_name, labels)]

    def matching_on_node(
        self, alt: RequestAlternative, node_name: str, reach: Sequence[Candidate]
    ) -> list[Candidate]:
        """The devices in ``reach`` (those of ``node_name``) that ``alt`` accepts. Cached
        per (class, selectors, node) when every device is node-local, so the reach depends
        on the node's name alone; network-attached pools also depend on its labels."""
        if self._shared:
            ids = self.matching(alt).ids
            return [c for c in reach if c.id in ids]
        key = (alt.device_class, alt.selectors, node_name)
        found = self._on_node.get(key)
        if found is None:
            ids = self.matching(alt).ids
            found = [c for c in reach if c.id in ids]
            self._on_node[key] = found
        return found

    def matching(self, alt: RequestAlternative) -> _Matching:
        """The devices ``alt`` accepts (class selectors AND its own), cached per
        (class, selectors)."""
        key = (alt.device_class, alt.selectors)
        found = self._matching.get(key)
        if found is not None:
            return found
        cls = self.classes.get(alt.device_class)
        if cls is None:
            found = _Matching(frozenset(), f"device class {alt.device_class!r} does not exist")
        else:
            expressions = cls.selectors + alt.selectors
            bad = [
                f"{where}: {err}"
                for where, exprs in (
                    (f"class {cls.name}", cls.selectors),
                    ("selector", alt.selectors),
                )
                for e in exprs
                if (err := compile_selector(e).error)
            ]
            ids: set[DeviceId] = set()
            error = bad[0] if bad else None
            if not bad:
                compiled = [compile_selector(e) for e in expressions]
                for cand in self._all:
                    result = self.matcher.evaluate(cand.id, cand.device, compiled)
                    if result.matched:
                        ids.add(cand.id)
                    elif error is None and result.error is not None:
                        error = f"{cand.id[2]}: {result.error}"
            found = _Matching(frozenset(ids), error)
        self._matching[key] = found
        return found


def allocated_devices(claims: Iterable[ResourceClaim]) -> set[DeviceId]:
    """Devices held by the allocations of ``claims`` (admin-access results hold nothing)."""
    return {
        r.device_id
        for c in claims
        if c.allocation is not None
        for r in c.allocation.results
        if not r.admin_access
    }


# --- search ------------------------------------------------------------------------------


def _constraint_applies(c: DeviceConstraint, request: str, alt: RequestAlternative) -> bool:
    return not c.requests or request in c.requests or alt.name in c.requests


def _values(
    cand: Candidate, constraints: Sequence[DeviceConstraint]
) -> tuple[AttributeValue, ...] | None:
    out = []
    for c in constraints:
        v = cand.device.attribute(c.attribute, cand.id[0])
        if v is None:
            return None
        out.append(v)
    return tuple(out)


@dataclass(slots=True)
class _Search:
    catalog: DeviceCatalog
    claim: ResourceClaim
    node: str
    reach: list[Candidate]
    busy: AbstractSet[DeviceId]  # in use by other claims (and earlier claims of the pod)
    taken: set[DeviceId] = field(default_factory=set)  # chosen in this claim so far
    fixed: dict[int, AttributeValue] = field(default_factory=dict)  # constraint -> value
    results: list[tuple[DeviceResult, Candidate]] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    steps: int = 0

    def run(self, i: int) -> bool:
        if i == len(self.claim.requests):
            return True
        request = self.claim.requests[i]
        self.steps += 1
        if self.steps > _MAX_STEPS:  # a pathological claim must not stall the cycle
            return self._fail(request, f"gave up after {_MAX_STEPS} tries on node {self.node}")
        # any() stops at the first alternative that fits: firstAvailable's order.
        return any(self._try(i, request, alt) for alt in request.alternatives)

    def _fail(self, request: DeviceRequest, text: str) -> bool:
        self.reasons.append(
            f"request {request.name}: {text}{self.catalog.left_out_note(self.node)}"
        )
        return False

    def _try(self, i: int, request: DeviceRequest, alt: RequestAlternative) -> bool:
        match = self.catalog.matching(alt)
        label = alt.name if request.first_available else request.name
        noun = "device" if alt.count == 1 else "devices"
        suffix = f"; {match.error}" if match.error else ""
        on_node = self.catalog.matching_on_node(alt, self.node, self.reach)
        matching = [c for c in on_node if c.id not in self.taken] if self.taken else on_node
        free = matching if alt.admin_access else [c for c in matching if c.id not in self.busy]
        if alt.mode == "All":
            in_use = len(matching) - len(free)
            pools = {(c.id[0], c.id[1]) for c in matching}
            if not matching:
                return self._fail(
                    request,
                    f"allocationMode All: no device of class {alt.device_class} matches "
                    f"on node {self.node}{suffix}",
                )
            if in_use:
                return self._fail(
                    request, f"allocationMode All: {in_use} matching devices are in use"
                )
            if pools & self.catalog.incomplete_pools:
                return self._fail(request, "allocationMode All: a device pool is incomplete")
            if self.catalog.left_out.get(self.node) or self.catalog.left_out.get(""):
                # "All" must not quietly mean "all but the ones we cannot evaluate".
                return self._fail(request, "allocationMode All: some devices are left out")
            want = len(free)
        else:
            want = alt.count
            if len(free) < want:
                more = len(matching) - len(free)
                busy = f" ({more} more in use)" if more else ""
                verb = "matches" if len(free) == 1 else "match"
                return self._fail(
                    request,
                    f"{want} {noun} of class {alt.device_class} wanted, {len(free)} {verb} "
                    f"on node {self.node}{busy}{suffix}",
                )
        constraints = [
            (k, c)
            for k, c in enumerate(self.claim.constraints)
            if _constraint_applies(c, request.name, alt)
        ]
        groups: dict[tuple[AttributeValue, ...], list[Candidate]] = {}
        # Devices that later requests also accept go last, so taking the first ``want`` of
        # a group leaves them the devices only they can use.
        later = [
            self.catalog.matching(a).ids
            for r in self.claim.requests[i + 1 :]
            for a in r.alternatives
        ]
        if later:
            free = sorted(free, key=lambda c: sum(c.id in ids for ids in later))
        for cand in free:
            values = _values(cand, [c for _, c in constraints])
            if values is None:
                continue
            pairs = zip(constraints, values, strict=True)
            if any(k in self.fixed and self.fixed[k] != v for (k, _), v in pairs):
                continue
            groups.setdefault(values, []).append(cand)
        # Larger groups first: more room for the requests after this one.
        ordered = sorted(groups.items(), key=lambda kv: -len(kv[1]))
        if alt.mode == "All" and (len(ordered) != 1 or len(ordered[0][1]) != want):
            return self._fail(
                request, f"allocationMode All: the devices do not share {self._names(constraints)}"
            )
        if not any(len(g) >= want for _, g in ordered):
            return self._fail(
                request,
                f"{want} {noun} of class {alt.device_class} wanted, {len(free)} match on node "
                f"{self.node} but no {want} share {self._names(constraints)}",
            )
        for values, group in ordered:
            if len(group) < want:
                continue
            chosen = group[:want]
            newly = [k for k, _ in constraints if k not in self.fixed]
            for (k, _), v in zip(constraints, values, strict=True):
                self.fixed.setdefault(k, v)
            mark = len(self.results)
            for cand in chosen:
                self.taken.add(cand.id)
                result = DeviceResult(label, *cand.id, admin_access=alt.admin_access)
                self.results.append((result, cand))
            if self.run(i + 1):
                return True
            for cand in chosen:  # undo and try the next group
                self.taken.discard(cand.id)
            del self.results[mark:]
            for k in newly:
                del self.fixed[k]
        return False

    @staticmethod
    def _names(constraints: Sequence[tuple[int, DeviceConstraint]]) -> str:
        return ", ".join(c.attribute for _, c in constraints) or "nothing"


def _node_selector(node: str, chosen: Sequence[Candidate]) -> tuple[NodeSelectorTerm, ...] | None:
    if any(c.slice.node_name is not None for c in chosen):
        return node_name_selector(node)
    selectors = {c.slice.node_selector for c in chosen if c.slice.node_selector is not None}
    if not selectors:
        return None  # every device is reachable from every node
    if len(selectors) == 1:
        return next(iter(selectors))
    return node_name_selector(node)  # several pools: the node itself reaches them all


def allocate_claim(
    catalog: DeviceCatalog,
    claim: ResourceClaim,
    node_name: str,
    labels: Mapping[str, str],
    busy: AbstractSet[DeviceId],
) -> ClaimAllocation | AllocationFailure:
    """Devices for ``claim`` on ``node_name`` (with node ``labels``), avoiding ``busy``
    devices (held by other claims), or why not. The claim's current allocation is ignored:
    callers keep allocated claims as they are (see :func:`allocate_pod_claims`)."""
    if not claim.requests:
        return ClaimAllocation((), None)
    search = _Search(catalog, claim, node_name, catalog.devices_for_node(node_name, labels), busy)
    if not search.run(0):
        reasons = list(dict.fromkeys(search.reasons))  # backtracking repeats reasons
        return AllocationFailure(f"claim {claim.key}: " + "; ".join(reasons[:3]))
    chosen = [c for _, c in search.results]
    return ClaimAllocation(tuple(r for r, _ in search.results), _node_selector(node_name, chosen))


def allocate_pod_claims(
    catalog: DeviceCatalog,
    claims: Sequence[ResourceClaim],
    node_name: str,
    labels: Mapping[str, str],
    busy: AbstractSet[DeviceId],
) -> tuple[ClaimAllocation, ...] | AllocationFailure:
    """Allocations for all claims of one pod on ``node_name``, in order, no device used
    twice. A claim that is already allocated (shared with a running pod) keeps its
    allocation; the node must be one its node selector picks."""
    # ``busy`` is copied only when a claim took devices and another claim follows: this runs
    # for every (pod, candidate node) pair, and most pods have one claim.
    used = busy
    out: list[ClaimAllocation] = []
    for claim in claims:
        if claim.allocation is not None:
            sel = claim.allocation.node_selector
            with_name = {**labels, "metadata.name": node_name}
            if sel is not None and not any(t.matches(with_name) for t in sel):
                return AllocationFailure(
                    f"claim {claim.key}: allocated to devices node {node_name} cannot reach"
                )
            out.append(claim.allocation)
            continue
        result = allocate_claim(catalog, claim, node_name, labels, used)
        if isinstance(result, AllocationFailure):
            return result
        held = {r.device_id for r in result.results if not r.admin_access}
        if held:
            used = used | held
        out.append(result)
    return tuple(out)
