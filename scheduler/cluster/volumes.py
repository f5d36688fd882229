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
- a pod waits, with a reason naming the claim, when a claim is missing, being deleted, an
  ephemeral claim is not the pod's own, a claim is not bound (``Immediate`` binding, no class,
  an unknown class, or bound by name but not complete yet: the PV controller binds those), or
  its PersistentVolume does not exist. An unbound claim of a ``WaitForFirstConsumer``
  StorageClass is not bound by this scheduler yet: the pod waits with ``UnsupportedField``.

Not honoured yet: per-node volume limits (CSI attach limits, ``CSINode``), ``ReadWriteOncePod``
claims used by another pod, and volumes that are not claims (they place no restriction here).

Everything accepts malformed input: what cannot be read makes the pod wait, never raises.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from scheduler.cluster.pod import Pod
from scheduler.cluster.podspec import PodSpecError, node_selector_terms
from scheduler.cluster.selectors import NodeSelectorRequirement, NodeSelectorTerm

__all__ = [
    "MAX_TERMS",
    "NO_VERDICT",
    "VOLUME_NOT_BOUND",
    "VOLUME_NOT_FOUND",
    "PodClaim",
    "VolumeVerdict",
    "and_terms",
    "pod_claims",
    "volume_verdict",
    "with_volumes",
]

#: The claim (or its PersistentVolume) does not exist, is being deleted, or is not the pod's.
VOLUME_NOT_FOUND = "VolumeNotFound"
#: The claim waits to be bound by the PV controller.
VOLUME_NOT_BOUND = "VolumeNotBound"
#: Same code as :data:`scheduler.fairness.findings.UNSUPPORTED_FIELD` (cluster/ imports no
#: fairness/).
_UNSUPPORTED_FIELD = "UnsupportedField"
#: Most alternatives (node selector terms) a pod's affinity ANDed with its volumes' may have.
MAX_TERMS = 64

_BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
_CLASS_ANNOTATION = "volume.beta.kubernetes.io/storage-class"
_ZONE = "topology.kubernetes.io/zone"
_REGION = "topology.kubernetes.io/region"
_BETA_ZONE = "failure-domain.beta.kubernetes.io/zone"
_BETA_REGION = "failure-domain.beta.kubernetes.io/region"
#: VolumeZone's labels; a deprecated one may be matched by the node's GA label.
_TOPOLOGY_LABELS = {_BETA_ZONE: _ZONE, _BETA_REGION: _REGION, _ZONE: _ZONE, _REGION: _REGION}
_PV_TERMS = "spec.nodeAffinity.required.nodeSelectorTerms"
_RBAC_HINT = "grant get, list and watch on them to the scheduler; see manifests/20-rbac.yaml"


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


def _claim_wait(
    namespace: str,
    pod_name: str,
    pod_uid: str,
    claim: PodClaim,
    pvc: Mapping[str, Any] | None,
    classes: Mapping[str, Mapping[str, Any]],
    absent: Collection[str],
) -> tuple[str, str] | None:
    """Why ``claim`` keeps the pod waiting before its PersistentVolume is looked at."""
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
    if spec.get("volumeName") and _BIND_COMPLETED in annotations:
        return None
    if spec.get("volumeName"):
        return (
            VOLUME_NOT_BOUND,
            f"waiting for persistentvolumeclaim {key} to be bound (to persistentvolume "
            f"{spec['volumeName']})",
        )
    class_name = annotations.get(_CLASS_ANNOTATION) or spec.get("storageClassName") or ""
    storage_class = classes.get(str(class_name)) if class_name else None
    if storage_class is not None and storage_class.get("volumeBindingMode") == (
        "WaitForFirstConsumer"
    ):
        return (
            _UNSUPPORTED_FIELD,
            f"persistentvolumeclaim {key} (StorageClass {class_name}): binding "
            "WaitForFirstConsumer volumes is not supported yet; the pod waits (bind the claim "
            "to a persistentvolume first, or use a StorageClass with volumeBindingMode: "
            "Immediate)",
        )
    why = ""
    if class_name and storage_class is None:
        why = (
            f" (StorageClass {class_name} cannot be read)"
            if "StorageClass" in absent
            else f" (StorageClass {class_name} not found)"
        )
    return (VOLUME_NOT_BOUND, f"waiting for persistentvolumeclaim {key} to be bound{why}")


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
) -> VolumeVerdict:
    """The verdict on a pod's ``claims``: ``pvcs`` by ``namespace/name``, ``pvs`` and
    ``classes`` by name; ``absent`` holds the kinds whose objects cannot be read. The first
    claim (in volume order) that keeps the pod waiting decides the reason."""
    terms: list[tuple[NodeSelectorTerm, ...]] = []
    for claim in claims:
        pvc = pvcs.get(f"{namespace}/{claim.name}")
        wait = _claim_wait(namespace, pod_name, pod_uid, claim, pvc, classes, absent)
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
    return VolumeVerdict(terms=tuple(terms)) if terms else NO_VERDICT


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
