"""Rules that place a pod relative to other pods: required pod affinity and anti-affinity, and
topology spread constraints - as Kubernetes defines them, read from a pod spec.

These are pure values; what they mean for a node given where other pods run is decided by
:mod:`scheduler.framework.topology` (the scheduler's filter) and checked again by
:mod:`scheduler.solver.validate_topology` (the independent validator).

Reading follows the API's defaults:

- a term's namespaces are its ``namespaces`` list, all namespaces for an empty
  ``namespaceSelector: {}``, else the pod's own namespace. A ``namespaceSelector`` with
  labels in it needs Namespace labels the scheduler does not watch: that field is listed as
  unsupported (the pod waits, named) rather than guessed;
- ``matchLabelKeys`` / ``mismatchLabelKeys`` become ``In`` / ``NotIn`` requirements on the
  pod's own label values (keys the pod does not carry are ignored), as the API server does
  for pod affinity and kube-scheduler does for spread constraints;
- a missing ``labelSelector`` matches no pod; an empty one matches every pod;
- spread: ``minDomains`` defaults to 1, ``nodeAffinityPolicy`` to ``Honor`` and
  ``nodeTaintsPolicy`` to ``Ignore``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.cluster.selectors import LabelSelector, NodeSelectorRequirement, NodeSelectorTerm

__all__ = [
    "HOSTNAME_LABEL",
    "LabelSelector",
    "PodAffinityTerm",
    "PodRules",
    "Preferences",
    "SpreadConstraint",
    "WeightedTerm",
    "parse_pod_preferences",
    "parse_pod_rules",
    "scoring_terms",
]

_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
#: The node label every kubelet sets to the node's name.
HOSTNAME_LABEL = "kubernetes.io/hostname"
_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass(frozen=True, slots=True)
class PodAffinityTerm:
    """One required pod (anti-)affinity term, namespaces resolved.

    ``selector`` None matches no pod; ``namespaces`` None (the default when a term is built
    directly) means every namespace; :func:`parse_pod_rules` always resolves them.
    """

    topology_key: str
    selector: LabelSelector | None = None
    namespaces: tuple[str, ...] | None = None

    def matches(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """True when a pod in ``namespace`` with ``labels`` is one this term is about."""
        if self.selector is None:
            return False
        if self.namespaces is not None and namespace not in self.namespaces:
            return False
        return self.selector.matches(labels)


@dataclass(frozen=True, slots=True)
class SpreadConstraint:
    """A ``whenUnsatisfiable: DoNotSchedule`` topology spread constraint (selector resolved)."""

    max_skew: int
    topology_key: str
    selector: LabelSelector | None = None
    min_domains: int = 1
    #: nodeAffinityPolicy Honor: only nodes the pod's node selector/affinity accept count.
    honor_affinity: bool = True
    #: nodeTaintsPolicy Honor: only nodes whose taints the pod tolerates count.
    honor_taints: bool = False

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True when a pod (of the constrained pod's namespace) with ``labels`` counts."""
        return self.selector is not None and self.selector.matches(labels)


@dataclass(frozen=True, slots=True)
class WeightedTerm:
    """A preferred pod (anti-)affinity term with its weight (1-100)."""

    weight: int
    term: PodAffinityTerm


@dataclass(frozen=True, slots=True)
class Preferences:
    """What a pod prefers (never required): preferred pod affinity and anti-affinity,
    ``ScheduleAnyway`` spread constraints, preferred node affinity ``(weight, term)``."""

    affinity: tuple[WeightedTerm, ...] = ()
    anti_affinity: tuple[WeightedTerm, ...] = ()
    spread: tuple[SpreadConstraint, ...] = ()
    nodes: tuple[tuple[int, NodeSelectorTerm], ...] = ()


@dataclass(frozen=True, slots=True)
class PodRules:
    """What :func:`parse_pod_rules` read; ``unsupported`` lists field paths it could not."""

    affinity: tuple[PodAffinityTerm, ...] = ()
    anti_affinity: tuple[PodAffinityTerm, ...] = ()
    spread: tuple[SpreadConstraint, ...] = ()
    unsupported: tuple[str, ...] = ()


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _selector(
    raw: Any,
    labels: Mapping[str, str],
    match_keys: Any,
    mismatch_keys: Any = None,
) -> LabelSelector | None:
    """The selector, with match/mismatch label keys folded in; None when absent. Raises
    ValueError on an operator Kubernetes does not define for label selectors."""
    if raw is None:
        return None
    raw = _mapping(raw)
    match = tuple(sorted((str(k), str(v)) for k, v in _mapping(raw.get("matchLabels")).items()))
    exprs: list[NodeSelectorRequirement] = []
    for e in _list(raw.get("matchExpressions")):
        e = _mapping(e)
        op = e.get("operator")
        if op not in _SELECTOR_OPERATORS:
            raise ValueError(f"operator {op!r}")
        values = tuple(str(v) for v in _list(e.get("values")))
        exprs.append(NodeSelectorRequirement(str(e.get("key") or ""), op, values))
    for key in _list(match_keys):
        if str(key) in labels:
            exprs.append(NodeSelectorRequirement(str(key), "In", (labels[str(key)],)))
    for key in _list(mismatch_keys):
        if str(key) in labels:
            exprs.append(NodeSelectorRequirement(str(key), "NotIn", (labels[str(key)],)))
    return LabelSelector(match, tuple(exprs))


def _term(
    raw: Any,
    namespace: str,
    labels: Mapping[str, str],
    path: str,
    unsupported: list[str],
    *,
    cautious: bool = False,
) -> PodAffinityTerm | None:
    raw = _mapping(raw)
    key = str(raw.get("topologyKey") or "")
    ns_selector = raw.get("namespaceSelector")
    namespaces: tuple[str, ...] | None
    if isinstance(ns_selector, Mapping) and (
        ns_selector.get("matchLabels") or ns_selector.get("matchExpressions")
    ):
        if not cautious:
            unsupported.append(f"{path}.namespaceSelector")
            return None
        ns_selector = {}  # every namespace: keeps out at least the pods it would
    if isinstance(ns_selector, Mapping):
        namespaces = None  # {}: every namespace
    else:
        listed = tuple(sorted({str(n) for n in _list(raw.get("namespaces"))}))
        namespaces = listed or (namespace,)
    if not key:
        unsupported.append(f"{path}.topologyKey")
        return None
    try:
        selector = _selector(
            raw.get("labelSelector"),
            labels,
            raw.get("matchLabelKeys"),
            raw.get("mismatchLabelKeys"),
        )
    except ValueError:
        unsupported.append(f"{path}.labelSelector")
        return None
    return PodAffinityTerm(key, selector, namespaces)


def _spread(
    raw: Any, labels: Mapping[str, str], path: str, unsupported: list[str]
) -> SpreadConstraint | None:
    raw = _mapping(raw)
    key = str(raw.get("topologyKey") or "")
    skew = raw.get("maxSkew")
    min_domains = raw.get("minDomains", 1)
    if min_domains is None:
        min_domains = 1
    if not key or not isinstance(skew, int) or isinstance(skew, bool) or skew < 1:
        unsupported.append(f"{path} (maxSkew and topologyKey are required)")
        return None
    if not isinstance(min_domains, int) or isinstance(min_domains, bool) or min_domains < 1:
        unsupported.append(f"{path}.minDomains")
        return None
    try:
        selector = _selector(raw.get("labelSelector"), labels, raw.get("matchLabelKeys"))
    except ValueError:
        unsupported.append(f"{path}.labelSelector")
        return None
    return SpreadConstraint(
        max_skew=skew,
        topology_key=key,
        selector=selector,
        min_domains=min_domains,
        honor_affinity=raw.get("nodeAffinityPolicy", "Honor") != "Ignore",
        honor_taints=raw.get("nodeTaintsPolicy", "Ignore") == "Honor",
    )


def parse_pod_rules(
    spec: Any, namespace: str, labels: Mapping[str, str], *, cautious: bool = False
) -> PodRules:
    """Required pod affinity/anti-affinity and ``DoNotSchedule`` spread constraints of a pod
    spec. Never raises: a part it cannot read is listed in ``unsupported`` (the pod waits,
    named). Preferences (preferred terms, ``ScheduleAnyway``) are not read here.

    ``cautious`` is for pods already on a node, whose anti-affinity keeps other pods away:
    a term whose ``namespaceSelector`` selects by Namespace labels (not watched) is read as
    selecting every namespace, which keeps out at least the pods it would."""
    spec = _mapping(spec)
    affinity = _mapping(spec.get("affinity"))
    unsupported: list[str] = []
    found: dict[str, list[PodAffinityTerm]] = {"podAffinity": [], "podAntiAffinity": []}
    for kind, out in found.items():
        for i, raw in enumerate(_list(_mapping(affinity.get(kind)).get(_REQUIRED))):
            term = _term(
                raw,
                namespace,
                labels,
                f"spec.affinity.{kind}.{_REQUIRED}[{i}]",
                unsupported,
                cautious=cautious,
            )
            if term is not None:
                out.append(term)
    spread: list[SpreadConstraint] = []
    for i, raw in enumerate(_list(spec.get("topologySpreadConstraints"))):
        # Unset means DoNotSchedule; only ScheduleAnyway is a preference.
        if _mapping(raw).get("whenUnsatisfiable") == "ScheduleAnyway":
            continue
        c = _spread(raw, labels, f"spec.topologySpreadConstraints[{i}]", unsupported)
        if c is not None:
            spread.append(c)
    return PodRules(
        tuple(found["podAffinity"]),
        tuple(found["podAntiAffinity"]),
        tuple(spread),
        tuple(unsupported),
    )


_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def _weight(raw: Mapping[str, Any]) -> int | None:
    w = raw.get("weight")
    return w if isinstance(w, int) and not isinstance(w, bool) and 1 <= w <= 100 else None


#: kube-scheduler's ``hardPodAffinityWeight`` (default 1): what a running pod's required
#: affinity term adds to the score of a node, in its domain, for a pod the term matches.
HARD_POD_AFFINITY_WEIGHT = 1


def scoring_terms(
    affinity: tuple[PodAffinityTerm, ...], preferences: Preferences | None
) -> tuple[tuple[PodAffinityTerm, int], ...]:
    """The terms with which a pod, once on a node, scores other pods as kube-scheduler's
    InterPodAffinity does: each required affinity term with
    :data:`HARD_POD_AFFINITY_WEIGHT`, each preferred affinity term with its weight, each
    preferred anti-affinity term with minus its weight."""
    out = [(t, HARD_POD_AFFINITY_WEIGHT) for t in affinity]
    if preferences is not None:
        out += [(w.term, w.weight) for w in preferences.affinity]
        out += [(w.term, -w.weight) for w in preferences.anti_affinity]
    return tuple(out)


def parse_pod_preferences(
    spec: Any,
    namespace: str,
    labels: Mapping[str, str],
    nodes: tuple[tuple[int, NodeSelectorTerm], ...] = (),
) -> Preferences | None:
    """The pod's preferences, or None when it has none. A preference that cannot be read is
    left out (leaving a preference out never makes a placement wrong; the API server refuses
    most such specs anyway). ``nodes``: preferred node affinity, read by the caller."""
    spec = _mapping(spec)
    affinity = _mapping(spec.get("affinity"))
    found: dict[str, list[WeightedTerm]] = {"podAffinity": [], "podAntiAffinity": []}
    for kind, out in found.items():
        for raw in _list(_mapping(affinity.get(kind)).get(_PREFERRED)):
            raw = _mapping(raw)
            weight = _weight(raw)
            term = _term(raw.get("podAffinityTerm"), namespace, labels, "", [])
            if weight is not None and term is not None:
                out.append(WeightedTerm(weight, term))
    spread = []
    for raw in _list(spec.get("topologySpreadConstraints")):
        if _mapping(raw).get("whenUnsatisfiable") == "ScheduleAnyway":
            c = _spread(raw, labels, "", [])
            if c is not None:
                spread.append(c)
    if not (found["podAffinity"] or found["podAntiAffinity"] or spread or nodes):
        return None
    return Preferences(
        tuple(found["podAffinity"]), tuple(found["podAntiAffinity"]), tuple(spread), nodes
    )
