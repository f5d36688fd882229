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
  affinity (:func:`~scheduler.cluster.affinityterms.and_terms`), so every stage that checks
  node affinity keeps them;
- an unbound claim of a ``WaitForFirstConsumer`` StorageClass is bound by this scheduler to a
  pre-created PersistentVolume (kube-scheduler's VolumeBinding for static volumes): its
  *candidates* are the volumes that could bind it
  (:func:`~scheduler.cluster.volumecatalog.volume_fits`); the pod may go only where some
  candidate of each such claim may be used - the candidates' restrictions ORed
  (:func:`~scheduler.cluster.affinityterms.or_terms`) and ANDed like a bound volume's. When
  the pod is committed, :func:`choose_volumes` picks one candidate per claim on the chosen
  node, and :mod:`scheduler.commit.volumebind` writes the binding. Nothing is provisioned: a
  claim without candidates waits (naming the provisioner when its class has a dynamic one);
- a pod waits, with a reason naming the claim, when a claim is missing, being deleted, an
  ephemeral claim is not the pod's own, a claim is not bound (``Immediate`` binding, no class,
  an unknown class, or bound by name but not complete yet: the PV controller binds those), its
  PersistentVolume does not exist, or an unbound ``WaitForFirstConsumer`` claim has no
  candidate.

Not honoured yet: per-node volume limits (CSI attach limits, ``CSINode``), ``ReadWriteOncePod``
claims used by another pod, dynamic provisioning, and volumes that are not claims (they place
no restriction here).

Everything accepts malformed input: what cannot be read makes the pod wait, never raises.

This module gives the verdict on a pod's claims (:func:`volume_verdict`), chooses its volumes on
a node (:func:`choose_volumes`) and applies the verdict to the pod (:func:`with_volumes`), from:
:mod:`scheduler.cluster.volumeobjects` (the claim, volume and StorageClass objects as read),
:mod:`scheduler.cluster.volumecatalog` (the volumes that could bind a claim) and
:mod:`scheduler.cluster.affinityterms` (ANDing and ORing node selector terms).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.cluster.affinityterms import MAX_TERMS, and_terms, or_terms
from scheduler.cluster.pod import Pod
from scheduler.cluster.selectors import (
    NodeSelectorRequirement,
    NodeSelectorTerm,
    affinity_matches,
)
from scheduler.cluster.volumecatalog import VolumeCatalog, claim_candidates
from scheduler.cluster.volumeobjects import (
    BIND_COMPLETED,
    UNSUPPORTED_FIELD,
    VOLUME_NOT_BOUND,
    VOLUME_NOT_FOUND,
    ClaimNeeds,
    PodClaim,
    VolumeBinding,
    VolumeFacts,
    claim_class,
    pod_claims,
    pv_restrictions,
)

# pod_claims is re-exported: scheduler.cache.store imports it from here.
__all__ = [
    "NO_PROVISIONER",
    "NO_VERDICT",
    "VolumeVerdict",
    "choose_volumes",
    "pod_claims",
    "volume_verdict",
    "with_volumes",
]

#: The provisioner of StorageClasses for pre-created (local) volumes only.
NO_PROVISIONER = "kubernetes.io/no-provisioner"
_RBAC_HINT = "grant get, list and watch on them to the scheduler; see manifests/20-rbac.yaml"
_NODE_NAME = "metadata.name"


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


def _owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    refs = _mapping(obj.get("metadata")).get("ownerReferences")
    return any(
        _mapping(r).get("uid") == uid and _mapping(r).get("controller") is True
        for r in (refs if isinstance(refs, list) else [])
    )


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
    candidates, problem = claim_candidates(need, catalog, reserved, reserved_claims)
    if not candidates:
        return problem or _no_candidates(need, classes.get(need.storage_class) or {}), (), []
    terms = or_terms(f.terms for f in candidates)
    if len(terms) > MAX_TERMS:
        wait = (
            UNSUPPORTED_FIELD,
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
        restrictions, wait = pv_restrictions(pv_name, pv)
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
        candidates, _ = claim_candidates(need, catalog, reserved, reserved_claims, taken)
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


def with_volumes(pod: Pod, verdict: VolumeVerdict) -> Pod:
    """``pod`` with its volumes' restrictions ANDed into its required node affinity, or
    marked :attr:`Pod.blocked` with the verdict's reason (also when the AND has more than
    :data:`~scheduler.cluster.affinityterms.MAX_TERMS` alternatives)."""
    if verdict.wait is not None:
        return dataclasses.replace(pod, blocked=verdict.wait)
    if not verdict.terms:
        return pod
    combined = and_terms(pod.affinity, *verdict.terms)
    if combined is None:
        return dataclasses.replace(
            pod,
            blocked=(
                UNSUPPORTED_FIELD,
                f"the required node affinity of the pod and of its persistentvolumes "
                f"together make more than {MAX_TERMS} node selector terms, which is not "
                "supported yet; the pod waits (use fewer terms)",
            ),
        )
    return dataclasses.replace(
        pod, affinity=combined, volume_affinity=True, spec_affinity=pod.affinity
    )
