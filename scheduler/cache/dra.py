"""Dynamic Resource Allocation objects as the cache holds them, and which claims a pod uses.

:class:`DraIndex` is given the raw DeviceClasses, ResourceSlices and ResourceClaims by key
(:meth:`~DraIndex.upsert`, :meth:`~DraIndex.delete`) and keeps them parsed
(:mod:`scheduler.cluster.draspec`). An object is parsed again only when it changed (its
``metadata.resourceVersion``, or its content when it has none): a cluster publishes thousands
of slices and most cycles see none of them change. An object that cannot be parsed is left
out and its problem kept (:attr:`~DraIndex.problems`: field and message) so the store can put
it on an Event; the scheduler keeps running.

A pod's claims (:meth:`~DraIndex.verdict`) are its ``spec.resourceClaims`` entries: a
``resourceClaimName`` names the claim directly; a ``resourceClaimTemplateName`` entry uses the
claim the ResourceClaim controller created for the pod and named in
``status.resourceClaimStatuses`` (an entry there without a claim name means none was needed, as
in Kubernetes). The verdict is the claims, or why the pod waits: the claim is not created yet,
missing, unusable (naming the bad field), being deleted, made for another pod, or the DRA API
cannot be read.

The :class:`~scheduler.cluster.dra_alloc.DeviceMatcher` (CEL results per device) lives as long
as the index, and forgets the devices of slices that are deleted or republished without them,
so selector results are computed once per device, not once per cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from scheduler.cluster.dra import (
    DeviceClass,
    DeviceId,
    ResourceClaim,
    ResourceSlice,
    current_slices,
)
from scheduler.cluster.dra_alloc import DeviceCatalog, DeviceMatcher, allocated_devices
from scheduler.cluster.draspec import (
    DraSpecError,
    device_class_from_k8s,
    resource_claim_from_k8s,
    resource_slice_from_k8s,
)
from scheduler.cluster.draview import DraView

__all__ = [
    "DEVICE_CLASS",
    "DRA_KINDS",
    "RESOURCE_CLAIM",
    "RESOURCE_SLICE",
    "ClaimsReady",
    "ClaimsWait",
    "DraIndex",
    "DraKind",
    "DraProblem",
    "DraVerdict",
    "pod_claim_refs",
]

DraKind = Literal["DeviceClass", "ResourceSlice", "ResourceClaim"]
DEVICE_CLASS: DraKind = "DeviceClass"
RESOURCE_SLICE: DraKind = "ResourceSlice"
RESOURCE_CLAIM: DraKind = "ResourceClaim"
#: The kinds the index holds, in the order their absence is reported.
DRA_KINDS: tuple[DraKind, ...] = (DEVICE_CLASS, RESOURCE_SLICE, RESOURCE_CLAIM)


@dataclass(frozen=True, slots=True)
class DraProblem:
    """Why an object was left out: ``field`` is the path of the bad field."""

    kind: DraKind
    key: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind} {self.key}: {self.field}: {self.message}"


@dataclass(frozen=True, slots=True)
class ClaimsReady:
    """The pod's claims, in the order of ``spec.resourceClaims`` (empty: it uses none)."""

    claims: tuple[ResourceClaim, ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        """``namespace/name`` of each claim."""
        return tuple(c.key for c in self.claims)


@dataclass(frozen=True, slots=True)
class ClaimsWait:
    """The pod cannot be placed yet: ``reason`` says why and what to do; ``field`` is the
    pod field concerned (e.g. ``spec.resourceClaims[1]``)."""

    reason: str
    field: str = "spec.resourceClaims"


DraVerdict = ClaimsReady | ClaimsWait


@dataclass(frozen=True, slots=True)
class _ClaimFacts:
    """What the pod verdict needs of a claim besides its parsed form."""

    deleting: bool
    owners: frozenset[str]  # uids of the claim's owner references


def _version(obj: Mapping[str, Any]) -> object:
    """What tells two versions of an object apart cheaply: the resourceVersion, else the
    object itself (scenario and test objects have none)."""
    meta = obj.get("metadata")
    rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    return rv if isinstance(rv, str) and rv else obj


def _claim_facts(obj: Mapping[str, Any]) -> _ClaimFacts:
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    refs = meta.get("ownerReferences")
    owners = frozenset(
        str(r["uid"])
        for r in (refs if isinstance(refs, list) else ())
        if isinstance(r, Mapping) and isinstance(r.get("uid"), str)
    )
    return _ClaimFacts(bool(meta.get("deletionTimestamp")), owners)


def _name(raw: Any) -> str | None:
    return raw if isinstance(raw, str) and raw else None


def pod_claim_refs(pod: Mapping[str, Any]) -> list[tuple[str, str, bool]] | ClaimsWait:
    """``(claim key, pod field, from a template)`` for each claim ``pod`` uses, or why the
    claims cannot be known yet. Accepts any input: malformed parts make the pod wait naming
    the field, never raise."""
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    namespace = _name(meta.get("namespace")) or "default"
    spec = pod.get("spec")
    entries = spec.get("resourceClaims") if isinstance(spec, Mapping) else None
    if entries is None:
        return []
    if not isinstance(entries, list):
        return ClaimsWait("spec.resourceClaims must be a list", "spec.resourceClaims")
    status = pod.get("status")
    statuses = status.get("resourceClaimStatuses") if isinstance(status, Mapping) else None
    generated: dict[str, str | None] = {}
    for s in statuses if isinstance(statuses, list) else ():
        if isinstance(s, Mapping) and _name(s.get("name")):
            generated[str(s["name"])] = _name(s.get("resourceClaimName"))
    out: list[tuple[str, str, bool]] = []
    for i, entry in enumerate(entries):
        path = f"spec.resourceClaims[{i}]"
        if not isinstance(entry, Mapping) or not _name(entry.get("name")):
            return ClaimsWait(f"{path}.name is required", f"{path}.name")
        direct = _name(entry.get("resourceClaimName"))
        template = _name(entry.get("resourceClaimTemplateName"))
        if (direct is None) == (template is None):
            return ClaimsWait(
                f"{path} needs exactly one of resourceClaimName and resourceClaimTemplateName",
                path,
            )
        if direct is not None:
            out.append((f"{namespace}/{direct}", path, False))
            continue
        name = str(entry["name"])
        if name not in generated:
            return ClaimsWait(
                f"the claim for {path} (template {template}) is not created yet: the "
                "ResourceClaim controller of kube-controller-manager makes it",
                path,
            )
        claim_name = generated[name]
        if claim_name is not None:  # None: Kubernetes decided no claim is needed
            out.append((f"{namespace}/{claim_name}", path, True))
    return out


class DraIndex:
    """Parsed DRA objects by key, their parse problems, the pods' claim verdicts, and the
    devices the claims hold. ``matcher`` keeps selector results across cycles (one is made
    when not given). ``on_problem`` is called once per new or different problem (a fixed
    object just drops its problem from :attr:`problems`).

    Pods are tracked like :class:`~scheduler.cache.volumes.VolumeIndex` tracks them:
    :meth:`pod_changed` / :meth:`pod_removed` keep :attr:`verdicts` for the pending pods that
    use claims, and a claim event (or a kind going absent) re-judges the pods that use it;
    the methods return True when a verdict changed (the store then wakes the cycle loop)."""

    def __init__(
        self,
        *,
        matcher: DeviceMatcher | None = None,
        on_problem: Callable[[DraProblem], None] = lambda problem: None,
    ) -> None:
        #: DeviceClasses by name.
        self.classes: dict[str, DeviceClass] = {}
        #: ResourceSlices by name (every generation; the catalog keeps the newest).
        self.slices: dict[str, ResourceSlice] = {}
        #: ResourceClaims by ``namespace/name``.
        self.claims: dict[str, ResourceClaim] = {}
        #: Objects left out, by (kind, key).
        self.problems: dict[tuple[DraKind, str], DraProblem] = {}
        #: Kinds whose objects cannot be read (API missing or forbidden).
        self.absent: set[DraKind] = set()
        self.matcher = matcher if matcher is not None else DeviceMatcher()
        self._on_problem = on_problem
        self._versions: dict[tuple[DraKind, str], object] = {}
        self._claim_facts: dict[str, _ClaimFacts] = {}
        self._catalog: DeviceCatalog | None = None
        self._in_use: frozenset[DeviceId] | None = None
        #: The verdict of every tracked pod (uid), replaced only when it changes.
        self.verdicts: dict[str, DraVerdict] = {}
        self._pods: dict[str, Mapping[str, Any]] = {}
        #: ``namespace/claim`` -> uids of the tracked pods that use it.
        self._users: dict[str, set[str]] = {}
        self._pod_keys: dict[str, frozenset[str]] = {}

    # --- objects -------------------------------------------------------------------------

    def upsert(self, kind: DraKind, key: str, obj: Mapping[str, Any]) -> bool:
        """The object ``key`` of ``kind`` was added or changed; True when what the index
        holds for it changed or a tracked pod's verdict did (an unchanged resourceVersion is
        not parsed again). Any claim change may free or take devices, so it counts."""
        version = _version(obj)
        ref = (kind, key)
        if ref in self._versions and self._versions[ref] == version:
            return False
        self._versions[ref] = version
        try:
            if kind == DEVICE_CLASS:
                parsed: DeviceClass | ResourceSlice | ResourceClaim = device_class_from_k8s(obj)
            elif kind == RESOURCE_SLICE:
                parsed = resource_slice_from_k8s(obj)
            else:
                parsed = resource_claim_from_k8s(obj)
        except DraSpecError as e:
            problem = DraProblem(kind, key, e.field, e.message)
            known = self.problems.get(ref)
            self.problems[ref] = problem
            self._drop(kind, key)
            if known != problem:
                self._on_problem(problem)
            if kind == RESOURCE_CLAIM:
                self._claim_event(key)
            return True
        self.problems.pop(ref, None)
        if isinstance(parsed, DeviceClass):
            changed = self.classes.get(key) != parsed
            self.classes[key] = parsed
            if changed:
                self._catalog = None
        elif isinstance(parsed, ResourceSlice):
            old = self.slices.get(key)
            changed = old != parsed
            self.slices[key] = parsed
            if changed:
                self._slices_changed(old)
        else:
            facts = _claim_facts(obj)
            changed = self.claims.get(key) != parsed or self._claim_facts.get(key) != facts
            self.claims[key] = parsed
            self._claim_facts[key] = facts
            if changed:
                self._in_use = None
        if kind == RESOURCE_CLAIM:
            return self._claim_event(key) or changed
        return changed

    def delete(self, kind: DraKind, key: str) -> bool:
        """The object ``key`` of ``kind`` is gone; True when the index held something for it
        (or a tracked pod's verdict changed)."""
        self._versions.pop((kind, key), None)
        had_problem = self.problems.pop((kind, key), None) is not None
        dropped = self._drop(kind, key) or had_problem
        if kind == RESOURCE_CLAIM:
            return self._claim_event(key) or dropped
        return dropped

    def _drop(self, kind: DraKind, key: str) -> bool:
        if kind == DEVICE_CLASS:
            if self.classes.pop(key, None) is None:
                return False
            self._catalog = None
        elif kind == RESOURCE_SLICE:
            old = self.slices.pop(key, None)
            if old is None:
                return False
            self._slices_changed(old)
        else:
            self._claim_facts.pop(key, None)
            if self.claims.pop(key, None) is None:
                return False
            self._in_use = None
        return True

    def _slices_changed(self, old: ResourceSlice | None) -> None:
        self._catalog = None
        if old is None or not old.devices:
            return
        # Selector results of devices no slice publishes any more are dead weight.
        keep = {(s.driver, s.pool, d.name) for s in self.slices.values() for d in s.devices}
        self.matcher.forget(keep)

    def set_absent(self, kinds: set[DraKind]) -> bool:
        """The kinds that cannot be read now; True when that changed (every pod with claims
        is judged again)."""
        kinds = set(kinds) & set(DRA_KINDS)
        if kinds == self.absent:
            return False
        self.absent = kinds
        self._judge_all(list(self._pods))
        return True

    # --- derived views -------------------------------------------------------------------

    def catalog(self) -> DeviceCatalog:
        """This cycle's devices (newest pool generations) and classes, sharing
        :attr:`matcher`; rebuilt only after a slice or class changed."""
        if self._catalog is None:
            self._catalog = DeviceCatalog(self.slices.values(), dict(self.classes), self.matcher)
        return self._catalog

    def current_slices(self) -> list[ResourceSlice]:
        """The slices of each pool's newest generation."""
        return current_slices(self.slices.values())[0]

    def devices_in_use(self) -> frozenset[DeviceId]:
        """Devices held by the allocations of all claims (admin access holds none)."""
        if self._in_use is None:
            self._in_use = frozenset(allocated_devices(self.claims.values()))
        return self._in_use

    def view(self, pending: Iterable[str], reserved: Iterable[DeviceId] = ()) -> DraView:
        """The snapshot's DRA part: every class and slice, the claims that hold devices or
        that the ``pending`` pod uids (tracked ones with usable claims) use, and the devices
        ``reserved`` by commits in flight."""
        # A pod whose claims are all usable is listed even with none (every template entry
        # said no claim was needed): the solver tells "no claims" from "claims unknown".
        pod_claims = {
            uid: self.claim_keys(uid)
            for uid in pending
            if isinstance(self.verdicts.get(uid), ClaimsReady)
        }
        wanted = {k for keys in pod_claims.values() for k in keys}
        claims = [c for k, c in self.claims.items() if k in wanted or c.allocation is not None]
        return DraView.build(
            list(self.classes.values()),
            list(self.slices.values()),
            claims,
            pod_claims,
            frozenset(reserved),
        )

    # --- pods ----------------------------------------------------------------------------

    def verdict(self, pod: Mapping[str, Any]) -> DraVerdict:
        """The claims ``pod`` (its API object) uses, or why it waits."""
        return self._verdict(pod, pod_claim_refs(pod))

    def _verdict(
        self, pod: Mapping[str, Any], refs: list[tuple[str, str, bool]] | ClaimsWait
    ) -> DraVerdict:
        if isinstance(refs, ClaimsWait):
            return refs
        if not refs:
            return ClaimsReady()
        if self.absent:
            kinds = ", ".join(k for k in DRA_KINDS if k in self.absent)
            return ClaimsWait(
                f"the DRA API (resource.k8s.io/v1 {kinds}) cannot be read: enable it on the "
                "API server and grant the scheduler get/list/watch on it"
            )
        meta = pod.get("metadata")
        uid = meta.get("uid") if isinstance(meta, Mapping) else None
        claims: list[ResourceClaim] = []
        for key, path, from_template in refs:
            problem = self.problems.get((RESOURCE_CLAIM, key))
            if problem is not None:
                return ClaimsWait(
                    f"ResourceClaim {key} ({path}) cannot be used: {problem.field}: "
                    f"{problem.message}",
                    path,
                )
            claim = self.claims.get(key)
            if claim is None:
                return ClaimsWait(f"ResourceClaim {key} ({path}) does not exist; create it", path)
            facts = self._claim_facts.get(key)
            if facts is not None and facts.deleting:
                return ClaimsWait(f"ResourceClaim {key} ({path}) is being deleted", path)
            # A template's claim is owned by the pod it was made for (Kubernetes checks too).
            owners = facts.owners if facts is not None and from_template else frozenset()
            if owners and isinstance(uid, str) and uid and uid not in owners:
                return ClaimsWait(f"ResourceClaim {key} ({path}) was made for another pod", path)
            claims.append(claim)
        return ClaimsReady(tuple(claims))

    # --- tracked pods --------------------------------------------------------------------

    def pod_changed(self, uid: str, pod: Mapping[str, Any]) -> bool:
        """A pending pod's new API object: tracked while it has ``spec.resourceClaims``;
        True when its verdict changed."""
        spec = pod.get("spec")
        if not isinstance(spec, Mapping) or not spec.get("resourceClaims"):
            return self.pod_removed(uid)
        self._pods[uid] = pod
        return self._judge(uid)

    def pod_removed(self, uid: str) -> bool:
        """The pod is gone, bound, or no longer uses claims; True when it was tracked."""
        pod = self._pods.pop(uid, None)
        self.verdicts.pop(uid, None)
        self._set_keys(uid, frozenset())
        return pod is not None

    def claim_keys(self, uid: str) -> tuple[str, ...]:
        """The claims of a tracked pod whose claims are all usable (else empty)."""
        verdict = self.verdicts.get(uid)
        return verdict.keys if isinstance(verdict, ClaimsReady) else ()

    def _judge(self, uid: str) -> bool:
        pod = self._pods[uid]
        refs = pod_claim_refs(pod)
        verdict = self._verdict(pod, refs)
        keys = frozenset(k for k, _, _ in refs) if isinstance(refs, list) else frozenset[str]()
        self._set_keys(uid, keys)
        if self.verdicts.get(uid) == verdict:
            return False
        self.verdicts[uid] = verdict
        return True

    def _set_keys(self, uid: str, keys: frozenset[str]) -> None:
        before = self._pod_keys.get(uid, frozenset())
        if before == keys:
            return
        for key in before - keys:
            users = self._users.get(key)
            if users is not None:
                users.discard(uid)
                if not users:
                    del self._users[key]
        for key in keys - before:
            self._users.setdefault(key, set()).add(uid)
        if keys:
            self._pod_keys[uid] = keys
        else:
            self._pod_keys.pop(uid, None)

    def _judge_all(self, uids: list[str]) -> bool:
        changed = False
        for uid in uids:
            if uid in self._pods:
                changed = self._judge(uid) or changed
        return changed

    def _claim_event(self, key: str) -> bool:
        users = self._users.get(key)
        return self._judge_all(list(users)) if users else False
