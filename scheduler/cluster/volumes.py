"""Where a pod's PersistentVolumeClaims let it run, or why it waits for them.

kube-scheduler's VolumeBinding and VolumeZone rules, as far as the scheduler keeps them:

- a volume ``persistentVolumeClaim.claimName: data`` needs the claim ``data`` of the pod's
  namespace; a generic ephemeral volume ``v`` (``ephemeral``) needs the claim ``<pod>-v``, which
  the ephemeral volume controller creates for the pod (owned by it);
- a claim is *bound* when ``spec.volumeName`` is set and the PV controller marked the binding
  complete (annotation ``pv.kubernetes.io/bind-completed``), as kube-scheduler reads it;
- a bound claim's PersistentVolume restricts nodes by its ``spec.nodeAffinity.required``
  (terms ORed) and by its zone and region labels (``topology.kubernetes.io/zone`` and
  ``region``, and the deprecated ``failure-domain.beta.kubernetes.io`` ones; several zones are
  joined by ``__``). Nodes without any zone or region label accept such a PV (VolumeZone's rule
  for single-zone clusters). These restrictions are ANDed with the pod's own required node
  affinity (:func:`and_terms`), so every stage that checks node affinity keeps them;
- an unbound claim of a ``WaitForFirstConsumer`` StorageClass is bound by this scheduler to a
  pre-created PersistentVolume (kube-scheduler's VolumeBinding for static volumes): its
  *candidates* are the volumes that could bind it (:func:`volume_fits`); the pod may go only
  where some candidate of each such claim may be used - the candidates' restrictions ORed
  (:func:`or_terms`) and ANDed like a bound volume's. When the pod is committed,
  :func:`choose_volumes` picks one candidate per claim on the chosen node, and
  :mod:`scheduler.commit.volumebind` writes the binding. Nothing is provisioned: a claim without
  candidates waits (naming the provisioner when its class has a dynamic one);
- a pod waits, with a reason naming the claim, when a claim is missing, being deleted, an
  ephemeral claim is not the pod's own, a claim is not bound (``Immediate`` binding, no class,
  an unknown class, or bound by name but not complete yet: the PV controller binds those), its
  PersistentVolume does not exist, or an unbound ``WaitForFirstConsumer`` claim has no
  candidate.

Not honoured yet: per-node volume limits (CSI attach limits, ``CSINode``), ``ReadWriteOncePod``
claims used by another pod, dynamic provisioning, and volumes that are not claims (they place
no restriction here).

Everything accepts malformed input: what cannot be read makes the pod wait, never raises.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, NamedTuple

from scheduler.cluster.pod import Pod
from scheduler.cluster.podspec import PodSpecError, node_selector_terms
from scheduler.cluster.quantity import QuantityError, parse_quantity
from scheduler.cluster.selectors import (
    LabelSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    affinity_matches,
)

__all__ = [
    "BIND_COMPLETED",
    "BOUND_BY_CONTROLLER",
    "MAX_TERMS",
    "NO_PROVISIONER",
    "NO_VERDICT",
    "VOLUME_NOT_BOUND",
    "VOLUME_NOT_FOUND",
    "PodClaim",
    "VolumeBinding",
    "VolumeCatalog",
    "VolumeFacts",
    "VolumeVerdict",
    "and_terms",
    "choose_volumes",
    "claim_binding",
    "claim_class",
    "or_terms",
    "pod_claims",
    "volume_fits",
    "volume_verdict",
    "with_volumes",
]

#: The claim (or its PersistentVolume) does not exist, is being deleted, or is not the pod's.
VOLUME_NOT_FOUND = "VolumeNotFound"
#: The claim waits to be bound (by the PV controller, or by this scheduler to a volume).
VOLUME_NOT_BOUND = "VolumeNotBound"
#: Same code as :data:`scheduler.fairness.findings.UNSUPPORTED_FIELD` (cluster/ imports no
#: fairness/).
_UNSUPPORTED_FIELD = "UnsupportedField"
#: Most alternatives (node selector terms) a pod's affinity ANDed with its volumes' may have.
MAX_TERMS = 64
#: The provisioner of StorageClasses for pre-created (local) volumes only.
NO_PROVISIONER = "kubernetes.io/no-provisioner"

#: Set by the PV controller on a claim once its binding is complete.
BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
#: Set on a volume bound by a controller (kube-scheduler sets it with the claimRef).
BOUND_BY_CONTROLLER = "pv.kubernetes.io/bound-by-controller"
_CLASS_ANNOTATION = "volume.beta.kubernetes.io/storage-class"
_ZONE = "topology.kubernetes.io/zone"
_REGION = "topology.kubernetes.io/region"
_BETA_ZONE = "failure-domain.beta.kubernetes.io/zone"
_BETA_REGION = "failure-domain.beta.kubernetes.io/region"
#: VolumeZone's labels; a deprecated one may be matched by the node's GA label.
_TOPOLOGY_LABELS = {_BETA_ZONE: _ZONE, _BETA_REGION: _REGION, _ZONE: _ZONE, _REGION: _REGION}
_PV_TERMS = "spec.nodeAffinity.required.nodeSelectorTerms"
_RBAC_HINT = "grant get, list and watch on them to the scheduler; see manifests/20-rbac.yaml"
_NODE_NAME = "metadata.name"


class PodClaim(NamedTuple):
    """A PersistentVolumeClaim a pod's volume needs."""

    #: The claim's name, in the pod's namespace.
    name: str
    #: The pod's volume that uses it.
    volume: str
    #: True for a generic ephemeral volume (the claim is ``<pod>-<volume>``, owned by the pod).
    ephemeral: bool = False


@dataclass(frozen=True, slots=True)
class VolumeVerdict:
    """What a pod's claims say about its placement: ``terms`` - one OR-list of node selector
    terms per restriction, all of them ANDed with the pod's own required node affinity - or
    ``wait``: (reason code, message) why the pod cannot be placed yet."""

    terms: tuple[tuple[NodeSelectorTerm, ...], ...] = ()
    wait: tuple[str, str] | None = None


#: The verdict of a pod whose claims restrict nothing.
NO_VERDICT = VolumeVerdict()


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def pod_claims(spec: Any, pod_name: str) -> tuple[PodClaim, ...]:
    """The claims the volumes of pod ``spec`` need, in volume order, each once."""
    volumes = _mapping(spec).get("volumes")
    out: dict[str, PodClaim] = {}
    for volume in volumes if isinstance(volumes, list) else []:
        volume = _mapping(volume)
        name = str(volume.get("name") or "")
        claim = _mapping(volume.get("persistentVolumeClaim")).get("claimName")
        if isinstance(claim, str) and claim:
            out.setdefault(claim, PodClaim(claim, name))
        elif isinstance(volume.get("ephemeral"), Mapping) and name:
            out.setdefault(f"{pod_name}-{name}", PodClaim(f"{pod_name}-{name}", name, True))
    return tuple(out.values())


def _owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    refs = _mapping(obj.get("metadata")).get("ownerReferences")
    return any(
        _mapping(r).get("uid") == uid and _mapping(r).get("controller") is True
        for r in (refs if isinstance(refs, list) else [])
    )


def _zone_terms(pv: Mapping[str, Any]) -> tuple[NodeSelectorTerm, ...] | None:
    """VolumeZone's rule for the PV's zone and region labels as OR-ed terms; None when it
    has none. A node with none of the four labels always matches."""
    labels = _mapping(_mapping(pv.get("metadata")).get("labels"))
    alternatives: list[list[tuple[NodeSelectorRequirement, ...]]] = []
    for key in sorted(_TOPOLOGY_LABELS):
        raw = labels.get(key)
        values = tuple(sorted({v for v in str(raw).split("__") if v})) if raw else ()
        if not values:
            continue
        ga = _TOPOLOGY_LABELS[key]
        if ga == key:
            alternatives.append([(NodeSelectorRequirement(key, "In", values),)])
        else:
            alternatives.append(
                [
                    (NodeSelectorRequirement(key, "In", values),),
                    (
                        NodeSelectorRequirement(key, "DoesNotExist"),
                        NodeSelectorRequirement(ga, "In", values),
                    ),
                ]
            )
    if not alternatives:
        return None
    terms: list[tuple[NodeSelectorRequirement, ...]] = [()]
    for options in alternatives:
        terms = [t + o for t in terms for o in options]
    unlabelled = tuple(NodeSelectorRequirement(k, "DoesNotExist") for k in sorted(_TOPOLOGY_LABELS))
    return (NodeSelectorTerm(unlabelled), *(NodeSelectorTerm(t) for t in terms))


def _pv_restrictions(
    pv_name: str, pv: Mapping[str, Any]
) -> tuple[list[tuple[NodeSelectorTerm, ...]], tuple[str, str] | None]:
    """The PV's node affinity and zone terms, or why they cannot be evaluated."""
    out: list[tuple[NodeSelectorTerm, ...]] = []
    affinity = _mapping(_mapping(pv.get("spec")).get("nodeAffinity"))
    required = affinity.get("required")
    if required is not None:
        raw = _mapping(required).get("nodeSelectorTerms")
        for i, term in enumerate(raw if isinstance(raw, list) else []):
            fields = _mapping(term).get("matchFields")
            for j, e in enumerate(fields if isinstance(fields, list) else []):
                if _mapping(e).get("key") != "metadata.name":
                    return out, (
                        _UNSUPPORTED_FIELD,
                        f"persistentvolume {pv_name}: {_PV_TERMS}[{i}].matchFields[{j}] is "
                        "not supported yet (only metadata.name is); the pod waits",
                    )
        try:
            terms = node_selector_terms(raw, _PV_TERMS)
        except PodSpecError as e:
            return out, (VOLUME_NOT_FOUND, f"persistentvolume {pv_name}: {e.field}: {e.message}")
        # No terms matches no node (as in Kubernetes); one term that matches nothing says so.
        out.append(terms or (NodeSelectorTerm(),))
    zone = _zone_terms(pv)
    if zone is not None:
        out.append(zone)
    return out, None


def claim_class(obj: Mapping[str, Any]) -> str:
    """The StorageClass of a claim or a volume: the beta annotation, else
    ``spec.storageClassName``, else "" (no class)."""
    annotations = _mapping(_mapping(obj.get("metadata")).get("annotations"))
    spec = _mapping(obj.get("spec"))
    return str(annotations.get(_CLASS_ANNOTATION) or spec.get("storageClassName") or "")


def _quantity(raw: Any) -> Fraction | None:
    if raw is None:
        return None
    try:
        return parse_quantity(raw)
    except (QuantityError, TypeError):
        return None


def _modes(raw: Any) -> frozenset[str]:
    return frozenset(str(m) for m in raw) if isinstance(raw, list) else frozenset()


@dataclass(frozen=True, slots=True)
class VolumeFacts:
    """What of a PersistentVolume decides whether it can bind a claim, and where; parsed once
    per version of the volume (:class:`VolumeCatalog`)."""

    name: str
    storage_class: str = ""
    #: (namespace, name, uid) of ``spec.claimRef``; None when it has none.
    claim_ref: tuple[str, str, str] | None = None
    phase: str = ""
    deleting: bool = False
    #: ``spec.capacity.storage``; None when missing or unreadable (it then binds nothing).
    capacity: Fraction | None = None
    access_modes: frozenset[str] = frozenset()
    volume_mode: str = "Filesystem"
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Where it may be used: its node affinity and zone labels ANDed (() is any node).
    terms: tuple[NodeSelectorTerm, ...] = ()
    #: (reason code, message) when its restrictions cannot be evaluated: it binds nothing.
    problem: tuple[str, str] | None = None
    #: ``metadata.resourceVersion``: the precondition of the write that binds it.
    resource_version: str = field(default="", compare=False)

    @classmethod
    def of(cls, name: str, pv: Mapping[str, Any]) -> VolumeFacts:
        """The facts of the volume object ``pv`` (never raises)."""
        meta = _mapping(pv.get("metadata"))
        spec = _mapping(pv.get("spec"))
        ref = spec.get("claimRef")
        claim_ref = None
        if isinstance(ref, Mapping):
            # A claimRef of any kind means the volume is not free.
            claim_ref = (
                str(ref.get("namespace") or ""),
                str(ref.get("name") or ""),
                str(ref.get("uid") or ""),
            )
        problem: tuple[str, str] | None
        restrictions, problem = _pv_restrictions(name, pv)
        terms: tuple[NodeSelectorTerm, ...] = (NodeSelectorTerm(),)
        if problem is None:
            combined = and_terms(*restrictions)
            if combined is None:
                problem = (
                    _UNSUPPORTED_FIELD,
                    f"persistentvolume {name}: its node affinity and zone labels together make "
                    f"more than {MAX_TERMS} node selector terms, which is not supported yet",
                )
            else:
                terms = combined
        labels = _mapping(meta.get("labels"))
        return cls(
            name=name,
            storage_class=claim_class(pv),
            claim_ref=claim_ref,
            phase=str(_mapping(pv.get("status")).get("phase") or ""),
            deleting=bool(meta.get("deletionTimestamp")),
            capacity=_quantity(_mapping(spec.get("capacity")).get("storage")),
            access_modes=_modes(spec.get("accessModes")),
            volume_mode=str(spec.get("volumeMode") or "Filesystem"),
            labels={str(k): str(v) for k, v in labels.items()},
            terms=terms,
            problem=problem,
            resource_version=str(meta.get("resourceVersion") or ""),
        )

    def names(self, namespace: str, name: str, uid: str) -> bool:
        """True when ``claimRef`` names the claim (and its uid, when the claimRef has one):
        the volume is bound, or pre-bound, to it."""
        ref = self.claim_ref
        return (
            ref is not None
            and (ref[0], ref[1]) == (namespace, name)
            and (not ref[2] or not uid or ref[2] == uid)
        )


class VolumeCatalog:
    """PersistentVolumes parsed into :class:`VolumeFacts`, indexed by StorageClass and by the
    claim (``namespace/name``) their ``claimRef`` names, so finding the candidates of a claim
    looks at the volumes of its class only. The cache :meth:`update`\\ s it as volumes change;
    :meth:`of` indexes a plain mapping."""

    def __init__(self) -> None:
        self._facts: dict[str, VolumeFacts] = {}
        self._by_class: dict[str, set[str]] = {}
        self._by_claim: dict[str, set[str]] = {}

    @classmethod
    def of(cls, pvs: Mapping[str, Mapping[str, Any]]) -> VolumeCatalog:
        """A catalog of the volumes ``pvs`` (by name)."""
        catalog = cls()
        for name, pv in pvs.items():
            catalog.update(name, pv)
        return catalog

    @staticmethod
    def _claim_key(facts: VolumeFacts) -> str | None:
        ref = facts.claim_ref
        return f"{ref[0]}/{ref[1]}" if ref is not None and ref[1] else None

    def update(
        self, name: str, pv: Mapping[str, Any] | None
    ) -> tuple[VolumeFacts | None, VolumeFacts | None]:
        """The volume ``name`` is now ``pv`` (None: deleted); (old facts, new facts)."""
        old = self._facts.pop(name, None)
        if old is not None:
            self._by_class.get(old.storage_class, set()).discard(name)
            key = self._claim_key(old)
            if key is not None:
                names = self._by_claim.get(key, set())
                names.discard(name)
                if not names:
                    self._by_claim.pop(key, None)
        new = VolumeFacts.of(name, pv) if pv is not None else None
        if new is not None:
            self._facts[name] = new
            self._by_class.setdefault(new.storage_class, set()).add(name)
            key = self._claim_key(new)
            if key is not None:
                self._by_claim.setdefault(key, set()).add(name)
        return old, new

    def get(self, name: str) -> VolumeFacts | None:
        """The facts of the volume ``name``."""
        return self._facts.get(name)

    def in_class(self, storage_class: str) -> Collection[str]:
        """Names of the volumes of a StorageClass."""
        return self._by_class.get(storage_class, set())

    def claimed_by(self, claim: str) -> Collection[str]:
        """Names of the volumes whose ``claimRef`` names ``namespace/name``."""
        return self._by_claim.get(claim, set())

    def __len__(self) -> int:
        return len(self._facts)


@dataclass(frozen=True, slots=True)
class ClaimNeeds:
    """What an unbound claim asks of a volume (its ``spec``)."""

    namespace: str
    name: str
    uid: str = ""
    resource_version: str = ""
    storage_class: str = ""
    #: ``spec.resources.requests.storage`` (0 when missing).
    request: Fraction = Fraction(0)
    access_modes: frozenset[str] = frozenset()
    volume_mode: str = "Filesystem"
    #: ``spec.selector`` over the volume's labels; one that cannot be read selects none.
    selector: LabelSelector = field(default_factory=LabelSelector)
    #: Position among the pod's claims (ties of equal requests keep volume order).
    order: int = 0

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    @classmethod
    def of(
        cls, namespace: str, pvc: Mapping[str, Any], order: int = 0, name: str = ""
    ) -> ClaimNeeds:
        """The needs of the claim object ``pvc`` named ``name`` (default: its own
        ``metadata.name``); never raises."""
        meta = _mapping(pvc.get("metadata"))
        spec = _mapping(pvc.get("spec"))
        requests = _mapping(_mapping(spec.get("resources")).get("requests"))
        return cls(
            namespace=namespace,
            name=name or str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            resource_version=str(meta.get("resourceVersion") or ""),
            storage_class=claim_class(pvc),
            request=_quantity(requests.get("storage")) or Fraction(0),
            access_modes=_modes(spec.get("accessModes")),
            volume_mode=str(spec.get("volumeMode") or "Filesystem"),
            selector=_label_selector(spec.get("selector")),
            order=order,
        )


#: Selects no volume (a selector that cannot be read).
_NO_VOLUME = LabelSelector(expressions=(NodeSelectorRequirement("", "In", ()),))
_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def _label_selector(raw: Any) -> LabelSelector:
    """A claim's ``spec.selector`` (``matchLabels`` and ``matchExpressions`` with In, NotIn,
    Exists and DoesNotExist); absent or empty selects every volume."""
    if raw is None:
        return LabelSelector()
    if not isinstance(raw, Mapping):
        return _NO_VOLUME
    match = tuple(sorted((str(k), str(v)) for k, v in _mapping(raw.get("matchLabels")).items()))
    out: list[NodeSelectorRequirement] = []
    expressions = raw.get("matchExpressions")
    for e in expressions if isinstance(expressions, list) else []:
        e = _mapping(e)
        op = e.get("operator")
        values = e.get("values")
        if op not in _SELECTOR_OPERATORS or not e.get("key"):
            return _NO_VOLUME
        out.append(
            NodeSelectorRequirement(
                str(e["key"]),
                op,
                tuple(str(v) for v in values) if isinstance(values, list) else (),
            )
        )
    return LabelSelector(match, tuple(out))


def volume_fits(pv: VolumeFacts, need: ClaimNeeds) -> bool:
    """Whether an unclaimed volume could bind the claim, as kube-scheduler's
    FindMatchingVolume decides for a WaitForFirstConsumer claim (the node aside): no
    ``claimRef``, phase ``Available``, not being deleted, the claim's StorageClass, capacity at
    least the claim's request, the same ``volumeMode`` (default ``Filesystem``), every access
    mode of the claim, and labels matching the claim's ``selector``."""
    return (
        pv.claim_ref is None
        and pv.phase == "Available"
        and not pv.deleting
        and pv.storage_class == need.storage_class
        and pv.capacity is not None
        and pv.capacity >= need.request
        and pv.volume_mode == need.volume_mode
        and need.access_modes <= pv.access_modes
        and need.selector.matches(pv.labels)
    )


def _candidates(
    need: ClaimNeeds,
    catalog: VolumeCatalog,
    reserved: Mapping[str, str],
    reserved_claims: Mapping[str, str],
    taken: Collection[str] = (),
) -> tuple[list[VolumeFacts], tuple[str, str] | None]:
    """The volumes that could bind ``need``, smallest first (then by name), and the problem of
    a volume left out because its restrictions cannot be evaluated.

    A volume the scheduler chose for the claim (``reserved_claims``: claim -> volume, not yet
    seen bound) or whose ``claimRef`` names the claim (pre-bound) is its only candidate, as in
    kube-scheduler; volumes chosen for other claims (``reserved``: volume -> claim) and the
    ``taken`` ones are left out."""
    own = reserved_claims.get(need.key)
    if own is not None:
        facts = catalog.get(own)
        return ([facts] if facts is not None and not facts.deleting else []), None
    for name in sorted(catalog.claimed_by(need.key)):
        facts = catalog.get(name)
        if facts is None or name in taken or reserved.get(name, need.key) != need.key:
            continue
        if (
            not facts.names(need.namespace, need.name, need.uid)
            or facts.deleting
            or facts.capacity is None
            or facts.capacity < need.request
            or facts.volume_mode != need.volume_mode
        ):
            continue
        if facts.problem is not None:
            return [], facts.problem
        return [facts], None
    out: list[VolumeFacts] = []
    problem: tuple[str, str, str] | None = None
    for name in catalog.in_class(need.storage_class):
        facts = catalog.get(name)
        if facts is None or name in reserved or name in taken or not volume_fits(facts, need):
            continue
        if facts.problem is not None:
            if problem is None or name < problem[0]:
                problem = (name, *facts.problem)
            continue
        out.append(facts)
    out.sort(key=lambda f: (f.capacity, f.name))
    return out, (problem[1], problem[2]) if problem is not None else None


def or_terms(alternatives: Iterable[tuple[NodeSelectorTerm, ...]]) -> tuple[NodeSelectorTerm, ...]:
    """The OR of required node affinities, each an OR of terms (an empty tuple allows any
    node, and then so does the OR). Terms that differ only in the values of their first
    ``In`` requirement are merged into one (``hostname In n1`` OR ``hostname In n2`` is
    ``hostname In n1, n2``), so a hundred local volumes make one term, not a hundred. A term
    without requirements matches nothing and is dropped; when nothing is left, one such term
    stands for "no node"."""
    groups: dict[tuple[tuple[NodeSelectorRequirement, ...], str, int], set[str]] = {}
    for terms in alternatives:
        if not terms:
            return ()
        for term in terms:
            reqs = term.requirements
            if not reqs:
                continue
            at = next((i for i, r in enumerate(reqs) if r.operator == "In"), -1)
            if at < 0:
                groups.setdefault((reqs, "", at), set())
            else:
                key = (reqs[:at] + reqs[at + 1 :], reqs[at].key, at)
                groups.setdefault(key, set()).update(reqs[at].values)
    out = [
        NodeSelectorTerm(rest)
        if at < 0
        else NodeSelectorTerm(
            (*rest[:at], NodeSelectorRequirement(key, "In", tuple(sorted(values))), *rest[at:])
        )
        for (rest, key, at), values in groups.items()
    ]
    return tuple(out) if out else (NodeSelectorTerm(),)


def _matching(options: list[list[str]]) -> int:
    """The most claims that get distinct volumes, each from its ``options`` (augmenting
    paths; a pod has a handful of claims)."""
    owner: dict[str, int] = {}

    def place(i: int, seen: set[str]) -> bool:
        for name in options[i]:
            if name in seen:
                continue
            seen.add(name)
            if name not in owner or place(owner[name], seen):
                owner[name] = i
                return True
        return False

    return sum(place(i, set()) for i in range(len(options)))


@dataclass(frozen=True, slots=True)
class VolumeBinding:
    """The volume chosen for an unbound claim on the pod's node (see
    :mod:`scheduler.commit.volumebind`, which writes it)."""

    namespace: str
    claim: str
    claim_uid: str
    volume: str
    #: The volume's resourceVersion when it was chosen: the write's precondition.
    volume_version: str = ""
    claim_version: str = ""
    #: The volume's ``claimRef`` names the claim already: nothing to write, the PV
    #: controller completes the binding.
    prebound: bool = False

    @property
    def claim_key(self) -> str:
        """``namespace/name`` of the claim."""
        return f"{self.namespace}/{self.claim}"

    def claim_ref(self) -> dict[str, str]:
        """The ``spec.claimRef`` naming the claim (as kube-scheduler's reference to it)."""
        ref = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "namespace": self.namespace,
            "name": self.claim,
            "uid": self.claim_uid,
        }
        if self.claim_version:
            ref["resourceVersion"] = self.claim_version
        return ref

    def patch(self) -> dict[str, Any]:
        """The merge patch that binds the volume to the claim: what kube-scheduler's update
        writes (``claimRef``, ``pv.kubernetes.io/bound-by-controller``), with the volume's
        resourceVersion as a precondition (409 when it changed since it was chosen)."""
        meta: dict[str, Any] = {"annotations": {BOUND_BY_CONTROLLER: "yes"}}
        if self.volume_version:
            meta["resourceVersion"] = self.volume_version
        return {"metadata": meta, "spec": {"claimRef": self.claim_ref()}}


def claim_binding(pvc: Mapping[str, Any] | None, key: str, volume: str) -> tuple[bool, str]:
    """Whether the claim ``key`` (``pvc``, None when gone) is bound to ``volume`` with the
    binding completed by the PV controller: (True, ""); (False, "") while it is not yet;
    (False, why) when it never will be."""
    if pvc is None:
        return False, f"persistentvolumeclaim {key} was deleted"
    meta = _mapping(pvc.get("metadata"))
    if meta.get("deletionTimestamp"):
        return False, f"persistentvolumeclaim {key} is being deleted"
    name = _mapping(pvc.get("spec")).get("volumeName")
    if name and name != volume:
        return False, f"persistentvolumeclaim {key} was bound to persistentvolume {name} instead"
    return bool(name) and BIND_COMPLETED in _mapping(meta.get("annotations")), ""


def _no_candidates(need: ClaimNeeds, storage_class: Mapping[str, Any]) -> tuple[str, str]:
    what = (
        f"0 persistentvolumes available for persistentvolumeclaim {need.key} "
        f"(StorageClass {need.storage_class})"
    )
    provisioner = str(storage_class.get("provisioner") or "")
    if provisioner and provisioner != NO_PROVISIONER:
        return (
            VOLUME_NOT_BOUND,
            f"{what}; dynamic provisioning (provisioner {provisioner}) is not supported yet: "
            "create a matching persistentvolume, or use a StorageClass with volumeBindingMode: "
            "Immediate",
        )
    return (VOLUME_NOT_BOUND, f"{what}; no provisioning is done here")


#: :func:`_claim_wait`'s answer for an unbound WaitForFirstConsumer claim: this scheduler
#: binds it to one of its candidates.
_TO_BIND = ("", "bind")


def _claim_wait(
    namespace: str,
    pod_name: str,
    pod_uid: str,
    claim: PodClaim,
    pvc: Mapping[str, Any] | None,
    classes: Mapping[str, Mapping[str, Any]],
    absent: Collection[str],
) -> tuple[str, str] | None:
    """Why ``claim`` keeps the pod waiting before its PersistentVolume is looked at; None
    when it is bound, :data:`_TO_BIND` when this scheduler binds it."""
    key = f"{namespace}/{claim.name}"
    if "PersistentVolumeClaim" in absent:
        return (
            VOLUME_NOT_FOUND,
            f"persistentvolumeclaim {key} cannot be checked: the scheduler may not read "
            f"persistentvolumeclaims ({_RBAC_HINT})",
        )
    if pvc is None:
        if claim.ephemeral:
            return (
                VOLUME_NOT_FOUND,
                f"persistentvolumeclaim {key} of ephemeral volume {claim.volume} not found "
                "(the ephemeral volume controller creates it)",
            )
        return (VOLUME_NOT_FOUND, f"persistentvolumeclaim {key} not found")
    meta = _mapping(pvc.get("metadata"))
    if meta.get("deletionTimestamp"):
        return (VOLUME_NOT_FOUND, f"persistentvolumeclaim {key} is being deleted")
    if claim.ephemeral and not _owned_by(pvc, pod_uid):
        return (
            VOLUME_NOT_FOUND,
            f"persistentvolumeclaim {key} was not created for pod {namespace}/{pod_name} "
            f"(ephemeral volume {claim.volume}; the pod does not own the claim)",
        )
    spec = _mapping(pvc.get("spec"))
    annotations = _mapping(meta.get("annotations"))
    if spec.get("volumeName") and BIND_COMPLETED in annotations:
        return None
    if spec.get("volumeName"):
        return (
            VOLUME_NOT_BOUND,
            f"waiting for persistentvolumeclaim {key} to be bound (to persistentvolume "
            f"{spec['volumeName']})",
        )
    class_name = claim_class(pvc)
    storage_class = classes.get(class_name) if class_name else None
    if storage_class is not None and storage_class.get("volumeBindingMode") == (
        "WaitForFirstConsumer"
    ):
        return _TO_BIND
    why = ""
    if class_name and storage_class is None:
        why = (
            f" (StorageClass {class_name} cannot be read)"
            if "StorageClass" in absent
            else f" (StorageClass {class_name} not found)"
        )
    return (VOLUME_NOT_BOUND, f"waiting for persistentvolumeclaim {key} to be bound{why}")


def _unbound_claim(
    need: ClaimNeeds,
    classes: Mapping[str, Mapping[str, Any]],
    absent: Collection[str],
    catalog: VolumeCatalog,
    reserved: Mapping[str, str],
    reserved_claims: Mapping[str, str],
    write_problem: str | None,
) -> tuple[tuple[str, str] | None, tuple[NodeSelectorTerm, ...], list[VolumeFacts]]:
    """(why the pod waits, or None; where some candidate may be used; the candidates) of an
    unbound WaitForFirstConsumer claim."""
    what = f"persistentvolumeclaim {need.key} (StorageClass {need.storage_class})"
    if "PersistentVolume" in absent:
        wait = (
            VOLUME_NOT_BOUND,
            f"{what} cannot be bound: the scheduler may not read persistentvolumes ({_RBAC_HINT})",
        )
        return wait, (), []
    if write_problem is not None:
        return (VOLUME_NOT_BOUND, f"{what} cannot be bound: {write_problem}"), (), []
    candidates, problem = _candidates(need, catalog, reserved, reserved_claims)
    if not candidates:
        return problem or _no_candidates(need, classes.get(need.storage_class) or {}), (), []
    terms = or_terms(f.terms for f in candidates)
    if len(terms) > MAX_TERMS:
        wait = (
            _UNSUPPORTED_FIELD,
            f"the {len(candidates)} persistentvolumes available for {what} have together more "
            f"than {MAX_TERMS} node selector terms, which is not supported yet; the pod waits",
        )
        return wait, (), []
    return None, terms, candidates


def volume_verdict(
    namespace: str,
    pod_name: str,
    pod_uid: str,
    claims: tuple[PodClaim, ...],
    *,
    pvcs: Mapping[str, Mapping[str, Any]],
    pvs: Mapping[str, Mapping[str, Any]],
    classes: Mapping[str, Mapping[str, Any]],
    absent: Collection[str] = (),
    catalog: VolumeCatalog | None = None,
    reserved: Mapping[str, str] | None = None,
    reserved_claims: Mapping[str, str] | None = None,
    avoid: Collection[str] = (),
    write_problem: str | None = None,
) -> VolumeVerdict:
    """The verdict on a pod's ``claims``: ``pvcs`` by ``namespace/name``, ``pvs`` and
    ``classes`` by name; ``absent`` holds the kinds whose objects cannot be read. The first
    claim (in volume order) that keeps the pod waiting decides the reason.

    For unbound WaitForFirstConsumer claims: ``catalog`` indexes ``pvs`` (built when None);
    ``reserved`` (volume -> claim) and ``reserved_claims`` (claim -> volume) are the volumes
    chosen for claims and not yet seen bound; ``avoid`` names nodes where binding this pod's
    claims failed (left out until the volumes change); ``write_problem`` says why volumes
    cannot be bound at all (the scheduler may not write them)."""
    terms: list[tuple[NodeSelectorTerm, ...]] = []
    to_bind: list[tuple[ClaimNeeds, list[VolumeFacts]]] = []
    for order, claim in enumerate(claims):
        pvc = pvcs.get(f"{namespace}/{claim.name}")
        wait = _claim_wait(namespace, pod_name, pod_uid, claim, pvc, classes, absent)
        if wait is _TO_BIND:
            assert pvc is not None
            if catalog is None:
                catalog = VolumeCatalog.of(pvs)
            need = ClaimNeeds.of(namespace, pvc, order, claim.name)
            wait, restriction, candidates = _unbound_claim(
                need,
                classes,
                absent,
                catalog,
                reserved or {},
                reserved_claims or {},
                write_problem,
            )
            if wait is not None:
                return VolumeVerdict(wait=wait)
            to_bind.append((need, candidates))
            if restriction and restriction not in terms:
                terms.append(restriction)
            continue
        if wait is not None:
            return VolumeVerdict(wait=wait)
        assert pvc is not None
        pv_name = str(_mapping(pvc.get("spec")).get("volumeName"))
        key = f"{namespace}/{claim.name}"
        if "PersistentVolume" in absent:
            return VolumeVerdict(
                wait=(
                    VOLUME_NOT_FOUND,
                    f"persistentvolumeclaim {key} is bound to persistentvolume {pv_name}, "
                    f"which cannot be checked: the scheduler may not read persistentvolumes "
                    f"({_RBAC_HINT})",
                )
            )
        pv = pvs.get(pv_name)
        if pv is None:
            return VolumeVerdict(
                wait=(
                    VOLUME_NOT_FOUND,
                    f"persistentvolumeclaim {key} is bound to persistentvolume {pv_name}, "
                    "which does not exist",
                )
            )
        restrictions, wait = _pv_restrictions(pv_name, pv)
        if wait is not None:
            return VolumeVerdict(wait=wait)
        for r in restrictions:
            if r not in terms:
                terms.append(r)
    if len(to_bind) > 1:
        options = [[f.name for f in candidates] for _, candidates in to_bind]
        found = _matching(options)
        if found < len(to_bind):
            keys = ", ".join(need.key for need, _ in to_bind)
            return VolumeVerdict(
                wait=(
                    VOLUME_NOT_BOUND,
                    f"persistentvolumeclaims {keys} need {len(to_bind)} distinct "
                    f"persistentvolumes, only {found} of them can be bound at once; no "
                    "provisioning is done here",
                )
            )
    if to_bind and avoid:
        terms.append(
            (
                NodeSelectorTerm(
                    (NodeSelectorRequirement(_NODE_NAME, "NotIn", tuple(sorted(avoid))),)
                ),
            )
        )
    return VolumeVerdict(terms=tuple(terms)) if terms else NO_VERDICT


def choose_volumes(
    namespace: str,
    pod_name: str,
    pod_uid: str,
    claims: tuple[PodClaim, ...],
    node: str,
    node_labels: Mapping[str, str],
    *,
    pvcs: Mapping[str, Mapping[str, Any]],
    classes: Mapping[str, Mapping[str, Any]],
    catalog: VolumeCatalog,
    reserved: Mapping[str, str],
    reserved_claims: Mapping[str, str],
) -> tuple[VolumeBinding, ...] | str:
    """A volume for each unbound WaitForFirstConsumer claim of the pod, usable on ``node``
    (labels ``node_labels``), as kube-scheduler chooses: the claims by request, smallest first
    (then in volume order), each the smallest candidate that fits the node (then by name) and
    was not chosen for another claim. Deterministic. A message when a claim has none (another
    pod took it meanwhile, or the pod's claims changed)."""
    labels = {**node_labels, _NODE_NAME: node}
    needs: list[ClaimNeeds] = []
    for order, claim in enumerate(claims):
        pvc = pvcs.get(f"{namespace}/{claim.name}")
        wait = _claim_wait(namespace, pod_name, pod_uid, claim, pvc, classes, ())
        if wait is None:
            continue
        if wait is not _TO_BIND or pvc is None:
            return wait[1]
        needs.append(ClaimNeeds.of(namespace, pvc, order, claim.name))
    needs.sort(key=lambda n: (n.request, n.order))
    taken: set[str] = set()
    chosen: list[tuple[int, VolumeBinding]] = []
    for need in needs:
        candidates, _ = _candidates(need, catalog, reserved, reserved_claims, taken)
        facts = next((f for f in candidates if affinity_matches(f.terms, labels)), None)
        if facts is None:
            return (
                f"no persistentvolume is left for persistentvolumeclaim {need.key} "
                f"(StorageClass {need.storage_class}) on node {node}"
            )
        taken.add(facts.name)
        binding = VolumeBinding(
            namespace=namespace,
            claim=need.name,
            claim_uid=need.uid,
            volume=facts.name,
            volume_version=facts.resource_version,
            claim_version=need.resource_version,
            prebound=facts.names(need.namespace, need.name, need.uid),
        )
        chosen.append((need.order, binding))
    return tuple(b for _, b in sorted(chosen, key=lambda c: c[0]))


def and_terms(
    *alternatives: tuple[NodeSelectorTerm, ...], limit: int = MAX_TERMS
) -> tuple[NodeSelectorTerm, ...] | None:
    """The AND of required node affinities, each an OR of terms (an empty tuple: no
    restriction): the OR of every combination of one term from each, its requirements
    joined. A term without requirements matches nothing and is dropped; when nothing is left,
    one such term stands for "no node". None when there are more than ``limit`` terms."""
    out: list[tuple[NodeSelectorRequirement, ...]] | None = None
    for terms in alternatives:
        if not terms:
            continue
        options = [t.requirements for t in terms if t.requirements]
        if out is None:
            out = options
        else:
            out = [a + tuple(r for r in b if r not in a) for a in out for b in options]
        if len(out) > limit:
            return None
        if not out:
            return (NodeSelectorTerm(),)
    if out is None:
        return ()
    return tuple(NodeSelectorTerm(r) for r in dict.fromkeys(out))


def with_volumes(pod: Pod, verdict: VolumeVerdict) -> Pod:
    """``pod`` with its volumes' restrictions ANDed into its required node affinity, or
    marked :attr:`Pod.blocked` with the verdict's reason (also when the AND has more than
    :data:`MAX_TERMS` alternatives)."""
    if verdict.wait is not None:
        return dataclasses.replace(pod, blocked=verdict.wait)
    if not verdict.terms:
        return pod
    combined = and_terms(pod.affinity, *verdict.terms)
    if combined is None:
        return dataclasses.replace(
            pod,
            blocked=(
                _UNSUPPORTED_FIELD,
                f"the required node affinity of the pod and of its persistentvolumes "
                f"together make more than {MAX_TERMS} node selector terms, which is not "
                "supported yet; the pod waits (use fewer terms)",
            ),
        )
    return dataclasses.replace(
        pod, affinity=combined, volume_affinity=True, spec_affinity=pod.affinity
    )
