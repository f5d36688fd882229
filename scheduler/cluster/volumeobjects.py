"""PersistentVolumeClaims, PersistentVolumes and StorageClasses as the scheduler reads them,
and a pod's volumes: what :mod:`scheduler.cluster.volumes` decides from.

- :func:`pod_claims`: the claims a pod's volumes need (:class:`PodClaim`);
- :class:`VolumeFacts`: what of a PersistentVolume decides whether it can bind a claim, and
  where (:func:`pv_restrictions`: its node affinity and zone labels as node selector terms);
- :class:`ClaimNeeds`: what an unbound claim asks of a volume; :func:`claim_class`: the
  StorageClass of a claim or a volume;
- :class:`VolumeBinding`: the write that binds a chosen volume to a claim, and
  :func:`claim_binding`: whether the PV controller has completed it.

Everything accepts malformed input and never raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, NamedTuple

from scheduler.cluster.affinityterms import MAX_TERMS, and_terms
from scheduler.cluster.podspec import PodSpecError, node_selector_terms
from scheduler.cluster.quantity import QuantityError, parse_quantity
from scheduler.cluster.selectors import LabelSelector, NodeSelectorRequirement, NodeSelectorTerm

__all__ = [
    "BIND_COMPLETED",
    "BOUND_BY_CONTROLLER",
    "UNSUPPORTED_FIELD",
    "VOLUME_NOT_BOUND",
    "VOLUME_NOT_FOUND",
    "ClaimNeeds",
    "PodClaim",
    "VolumeBinding",
    "VolumeFacts",
    "claim_binding",
    "claim_class",
    "pod_claims",
    "pv_restrictions",
]

#: The claim (or its PersistentVolume) does not exist, is being deleted, or is not the pod's.
VOLUME_NOT_FOUND = "VolumeNotFound"
#: The claim waits to be bound (by the PV controller, or by this scheduler to a volume).
VOLUME_NOT_BOUND = "VolumeNotBound"
#: Same code as :data:`scheduler.fairness.findings.UNSUPPORTED_FIELD` (cluster/ imports no
#: fairness/).
UNSUPPORTED_FIELD = "UnsupportedField"

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


class PodClaim(NamedTuple):
    """A PersistentVolumeClaim a pod's volume needs."""

    #: The claim's name, in the pod's namespace.
    name: str
    #: The pod's volume that uses it.
    volume: str
    #: True for a generic ephemeral volume (the claim is ``<pod>-<volume>``, owned by the pod).
    ephemeral: bool = False


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


def pv_restrictions(
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
                        UNSUPPORTED_FIELD,
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
    per version of the volume
    (:class:`~scheduler.cluster.volumecatalog.VolumeCatalog`)."""

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
        restrictions, problem = pv_restrictions(name, pv)
        terms: tuple[NodeSelectorTerm, ...] = (NodeSelectorTerm(),)
        if problem is None:
            combined = and_terms(*restrictions)
            if combined is None:
                problem = (
                    UNSUPPORTED_FIELD,
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
