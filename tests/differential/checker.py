"""An independent checker of Kubernetes' placement rules, written from the Kubernetes
documentation (Assigning Pods to Nodes, Taints and Tolerations, Pod Topology Spread
Constraints, Resource Management for Pods and Containers, the API reference of PodSpec).

It shares no code with the scheduler under test (nothing here imports ``scheduler``): it is the
referee of the differential test, and it is itself checked against kube-scheduler's own
placements on every run.

Input: the Nodes and Pods of one isolated cluster (plain API dicts). Pods with
``spec.nodeName`` are placed; the others are ignored (a pending pod takes nothing on a node and
counts in no topology domain). :func:`check` returns every :class:`Violation` it finds.

Which rules are judged how:

- Order-independent rules are judged on the final state, which is exact because pods are only
  ever added during a case (never deleted or moved), and each of these rules is about a node's
  contents or a pair of pods: resources (cpu, memory, every other requested resource, the node's
  ``pods`` count), NoSchedule/NoExecute taints, ``nodeSelector``, required node affinity, host
  ports, and required pod anti-affinity (a forbidden pair is forbidden whichever of the two came
  first, because kube-scheduler checks both the incoming pod's terms and the existing pods'
  terms; so a pair in one domain is a violation in any order).
- Required pod affinity and ``DoNotSchedule`` topology spread depend on which pods existed
  when a pod was placed (the first-pod exception of affinity; the skew counted at that moment).
  The moment a scheduler decided is not observable (binds of one cycle, or kube-scheduler's
  asynchronous binds, reach the API server in any order), so the checker asks the question that
  is: *is there an order of placing these pods, one at a time on their final nodes, in which
  every pod passes the affinity and spread rules as kube-scheduler applies them to an incoming
  pod?* It searches the orders (depth-first over sets of placed pods, remembering dead ends).
  If kube-scheduler's rules were followed, its own decision order is such an order, so this
  never accuses a correct scheduler; if none exists, no sequential rule-following scheduler
  could have produced the placement. A batch scheduler that places two pods that need each
  other in one step gets the benefit of the doubt, which is the intended meaning of "every
  placement satisfies the rules".

Where the documentation and kube-scheduler's code differ, the documentation is followed, so
kube-scheduler's placements always pass: with several required pod-affinity terms the docs ask
each term to be satisfied by some pod, kube-scheduler (v1.37) counts only pods that match all
the terms. The differential cases use one term per pod, where both agree.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

__all__ = [
    "Violation",
    "check",
    "effective_requests",
    "label_selector_matches",
    "node_affinity_matches",
    "parse_quantity",
    "tolerates",
]

Obj = Mapping[str, Any]

HOSTNAME = "kubernetes.io/hostname"
#: Order-dependent placements get this many search steps before the checker gives up (and says
#: so, as a violation of rule ``search``): far more than cases of a dozen pods need.
SEARCH_BUDGET = 100_000

# Rule names used in violations.
RESOURCES = "resources"
TAINTS = "taints"
NODE_SELECTOR = "nodeSelector"
NODE_AFFINITY = "nodeAffinity"
HOST_PORTS = "hostPorts"
ANTI_AFFINITY = "podAntiAffinity"
AFFINITY = "podAffinity"
SPREAD = "topologySpread"
SEARCH = "search"
UNKNOWN_NODE = "unknownNode"


@dataclass(frozen=True)
class Violation:
    """One broken rule: which pod, on which node, which rule, and the evidence."""

    pod: str
    node: str
    rule: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        """JSON-ready."""
        return asdict(self)


# ----------------------------------------------------------------------------- quantities

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[a-zA-Z]*)$")


def parse_quantity(value: object) -> Fraction:
    """A Kubernetes resource quantity (``500m``, ``2``, ``1.5Gi``, ``1e3``) as an exact number."""
    if isinstance(value, int | float):
        return Fraction(str(value))
    text = str(value).strip()
    m = _QUANTITY.match(text)
    if not m:
        raise ValueError(f"not a quantity: {value!r}")
    number, suffix = Fraction(m.group(1)), m.group(2)
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        return number * Fraction(10) ** int(suffix[1:])
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    raise ValueError(f"unknown quantity suffix in {value!r}")


def _requests_of(container: Obj) -> dict[str, Fraction]:
    resources = container.get("resources") or {}
    # A limit without a request defaults the request to the limit (API server defaulting;
    # repeated here for pods given as written).
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {k: parse_quantity(v) for k, v in merged.items()}


def _add(into: dict[str, Fraction], more: Mapping[str, Fraction]) -> None:
    for k, v in more.items():
        into[k] = into.get(k, Fraction(0)) + v


def effective_requests(pod: Obj) -> dict[str, Fraction]:
    """The pod's requests as the scheduler counts them (Resource Management for Pods and
    Containers; Sidecar Containers): the larger of (app containers + sidecars) and, for each
    init container, (itself + the sidecars started before it); plus ``spec.overhead``. Pod-level
    ``spec.resources.requests`` replace the containers' sum for the resources they name."""
    spec = pod.get("spec") or {}
    total: dict[str, Fraction] = {}
    for c in spec.get("containers") or []:
        _add(total, _requests_of(c))
    sidecars: dict[str, Fraction] = {}
    init_peak: dict[str, Fraction] = {}
    for c in spec.get("initContainers") or []:
        own = _requests_of(c)
        if c.get("restartPolicy") == "Always":
            _add(sidecars, own)
            current = dict(sidecars)
        else:
            current = dict(sidecars)
            _add(current, own)
        for k, v in current.items():
            init_peak[k] = max(init_peak.get(k, Fraction(0)), v)
    _add(total, sidecars)
    for k, v in init_peak.items():
        total[k] = max(total.get(k, Fraction(0)), v)
    pod_level = ((spec.get("resources") or {}).get("requests")) or {}
    for k, v in pod_level.items():
        total[k] = parse_quantity(v)
    _add(total, {k: parse_quantity(v) for k, v in (spec.get("overhead") or {}).items()})
    return total


# ------------------------------------------------------------------------ labels and nodes


def _labels(obj: Obj) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _name(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


def _namespace(pod: Obj) -> str:
    return str((pod.get("metadata") or {}).get("namespace") or "default")


def _expression_matches(expr: Obj, labels: Mapping[str, str]) -> bool:
    """One label-selector requirement (In, NotIn, Exists, DoesNotExist; Gt/Lt for nodes)."""
    key, op = str(expr.get("key")), expr.get("operator")
    values = list(expr.get("values") or [])
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        if not present or len(values) != 1:
            return False
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    raise ValueError(f"unknown selector operator {op!r}")


def label_selector_matches(selector: Obj | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector: ``matchLabels`` and ``matchExpressions`` all hold. An absent
    (null) selector selects nothing; an empty one (``{}``) selects everything."""
    if selector is None:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    return all(_expression_matches(e, labels) for e in selector.get("matchExpressions") or [])


def _term_matches_node(term: Obj, node: Obj) -> bool:
    """A NodeSelectorTerm: every expression and field requirement holds; an empty term
    matches no node."""
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return False
    labels = _labels(node)
    if not all(_expression_matches(e, labels) for e in exprs):
        return False
    node_fields = {"metadata.name": str((node.get("metadata") or {}).get("name"))}
    return all(_expression_matches(f, node_fields) for f in fields)


def node_affinity_matches(pod: Obj, node: Obj) -> bool:
    """``spec.nodeSelector`` (every pair present on the node) and the required node affinity
    (its terms ORed) both hold."""
    return _node_selector_ok(pod, node) and _required_node_affinity_ok(pod, node)


def _node_selector_ok(pod: Obj, node: Obj) -> bool:
    labels = _labels(node)
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def _required_node_affinity_ok(pod: Obj, node: Obj) -> bool:
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return True
    return any(_term_matches_node(t, node) for t in required.get("nodeSelectorTerms") or [])


# ------------------------------------------------------------------------------- taints


def tolerates(toleration: Obj, taint: Obj) -> bool:
    """Whether one toleration tolerates one taint: an empty toleration effect matches every
    effect; ``Exists`` matches any value (and an empty key with ``Exists`` every key);
    ``Equal`` (the default operator) needs the same key and value."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    op = toleration.get("operator") or "Equal"
    key = toleration.get("key") or ""
    if op == "Exists":
        return not key or key == taint.get("key")
    if op == "Equal":
        return key == taint.get("key") and (toleration.get("value") or "") == (
            taint.get("value") or ""
        )
    return False


def _untolerated(pod: Obj, node: Obj) -> list[Obj]:
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    return [
        t
        for t in (node.get("spec") or {}).get("taints") or []
        if t.get("effect") in ("NoSchedule", "NoExecute")
        and not any(tolerates(tol, t) for tol in tolerations)
    ]


# ---------------------------------------------------------------------------- host ports


def _host_ports(pod: Obj) -> list[tuple[str, str, int]]:
    spec = pod.get("spec") or {}
    out = []
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        for p in c.get("ports") or []:
            port = int(p.get("hostPort") or 0)
            if port > 0:
                ip = p.get("hostIP") or "0.0.0.0"
                out.append((ip, p.get("protocol") or "TCP", port))
    return out


def _ports_conflict(a: tuple[str, str, int], b: tuple[str, str, int]) -> bool:
    """Same protocol and port, and the host IPs overlap (0.0.0.0 overlaps every IP)."""
    if a[1:] != b[1:]:
        return False
    return a[0] == b[0] or "0.0.0.0" in (a[0], b[0])


# -------------------------------------------------------------------------- pod affinity


def _affinity_terms(pod: Obj, kind: str) -> list[Obj]:
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get(kind) or {}
    return list(affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or [])


def _term_matches_pod(term: Obj, owner: Obj, other: Obj) -> bool:
    """Whether ``other`` is among the pods a PodAffinityTerm of ``owner`` selects: in the
    term's namespaces (its ``namespaces``; ``namespaceSelector: {}`` means all; neither means
    the owner's own namespace) and matching its ``labelSelector``, with ``matchLabelKeys``
    (``key In [owner's value]``) and ``mismatchLabelKeys`` (``key NotIn [owner's value]``)
    ANDed in."""
    namespaces = set(term.get("namespaces") or [])
    ns_selector = term.get("namespaceSelector")
    if ns_selector is not None and (
        ns_selector.get("matchLabels") or ns_selector.get("matchExpressions")
    ):
        raise ValueError("namespaceSelector with requirements needs Namespace labels")
    all_namespaces = ns_selector is not None
    if not namespaces and not all_namespaces:
        namespaces = {_namespace(owner)}
    if not all_namespaces and _namespace(other) not in namespaces:
        return False
    labels = _labels(other)
    if not label_selector_matches(term.get("labelSelector"), labels):
        return False
    owner_labels = _labels(owner)
    for key in term.get("matchLabelKeys") or []:
        if key in owner_labels and labels.get(key) != owner_labels[key]:
            return False
    for key in term.get("mismatchLabelKeys") or []:
        if key in owner_labels and labels.get(key) == owner_labels[key]:
            return False
    return True


@dataclass(frozen=True)
class _Placed:
    pod: Obj
    node: Obj

    @property
    def name(self) -> str:
        return _name(self.pod)

    @property
    def node_name(self) -> str:
        return str((self.node.get("metadata") or {}).get("name"))


def _same_domain(a: Obj, b: Obj, key: str) -> bool:
    la, lb = _labels(a), _labels(b)
    return key in la and key in lb and la[key] == lb[key]


def _affinity_problem(incoming: _Placed, existing: Sequence[_Placed]) -> str | None:
    """Required pod affinity of an incoming pod against the pods already placed: every term
    needs a matching pod in the node's domain of its topologyKey (the node must have the key).
    The documented exception: when no placed pod matches any of its terms, a pod that matches
    all of its own terms may go anywhere (so the first of a group with affinity to itself can
    start)."""
    terms = _affinity_terms(incoming.pod, "podAffinity")
    if not terms:
        return None
    node_labels = _labels(incoming.node)
    for t in terms:
        if t.get("topologyKey") not in node_labels:
            return f"node has no label {t.get('topologyKey')!r} (topologyKey of a podAffinity term)"
    missing = [
        t
        for t in terms
        if not any(
            _term_matches_pod(t, incoming.pod, e.pod)
            and _same_domain(incoming.node, e.node, t["topologyKey"])
            for e in existing
        )
    ]
    if not missing:
        return None
    any_match = any(
        _term_matches_pod(t, incoming.pod, e.pod) and t["topologyKey"] in _labels(e.node)
        for t in terms
        for e in existing
    )
    if not any_match and all(_term_matches_pod(t, incoming.pod, incoming.pod) for t in terms):
        return None
    t = missing[0]
    return (
        f"no pod matching {_describe_selector(t)} in its {t['topologyKey']}="
        f"{node_labels.get(t['topologyKey'])} when placed"
        + ("" if not any_match else " (and matching pods existed elsewhere)")
    )


def _describe_selector(term: Obj) -> str:
    sel = term.get("labelSelector") or {}
    parts = [f"{k}={v}" for k, v in (sel.get("matchLabels") or {}).items()]
    parts += [
        f"{e.get('key')} {e.get('operator')} {e.get('values') or ''}".strip()
        for e in sel.get("matchExpressions") or []
    ]
    keys = term.get("matchLabelKeys") or []
    return "{" + ", ".join(parts) + (f"; matchLabelKeys {keys}" if keys else "") + "}"


def _anti_affinity_violations(placed: Sequence[_Placed]) -> list[Violation]:
    """Every pair in one domain of a term's topologyKey where one pod's required anti-affinity
    term selects the other. Reported once, on the pod owning the term."""
    out = []
    for a in placed:
        for t in _affinity_terms(a.pod, "podAntiAffinity"):
            key = t.get("topologyKey", "")
            for b in placed:
                if b is a or not _same_domain(a.node, b.node, key):
                    continue
                if _term_matches_pod(t, a.pod, b.pod):
                    out.append(
                        Violation(
                            a.name,
                            a.node_name,
                            ANTI_AFFINITY,
                            f"{b.name} on {b.node_name} matches {_describe_selector(t)} in the "
                            f"same {key}={_labels(a.node).get(key)}",
                        )
                    )
    return out


# ------------------------------------------------------------------------ topology spread


def _spread_selector_matches(constraint: Obj, owner: Obj, other: Obj) -> bool:
    """The constraint's labelSelector, with ``matchLabelKeys`` (``key In [owner's value]``
    for keys the owner has) ANDed in; only pods of the owner's namespace count."""
    if _namespace(other) != _namespace(owner):
        return False
    labels = _labels(other)
    if not label_selector_matches(constraint.get("labelSelector"), labels):
        return False
    owner_labels = _labels(owner)
    return all(
        labels.get(k) == owner_labels[k]
        for k in constraint.get("matchLabelKeys") or []
        if k in owner_labels
    )


def _spread_problem(
    incoming: _Placed, existing: Sequence[_Placed], nodes: Sequence[Obj]
) -> str | None:
    """``DoNotSchedule`` constraints as the docs define them: count the matching pods per
    domain over the eligible nodes (those that pass the pod's nodeSelector and required node
    affinity, unless ``nodeAffinityPolicy: Ignore``; that tolerate its taints if
    ``nodeTaintsPolicy: Honor``; and that have every constraint's topologyKey); the global
    minimum is 0 when fewer domains than ``minDomains`` are eligible; placing the pod must keep
    (count in its domain + 1 if it matches itself) - minimum <= maxSkew."""
    constraints = [
        c
        for c in (incoming.pod.get("spec") or {}).get("topologySpreadConstraints") or []
        if c.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule"
    ]
    if not constraints:
        return None
    keys = [c["topologyKey"] for c in constraints]
    node_labels = _labels(incoming.node)
    for key in keys:
        if key not in node_labels:
            return f"node has no label {key!r} (topologyKey of a DoNotSchedule constraint)"

    def eligible(node: Obj, constraint: Obj) -> bool:
        labels = _labels(node)
        if not all(k in labels for k in keys):
            return False
        if constraint.get("nodeAffinityPolicy", "Honor") == "Honor" and not node_affinity_matches(
            incoming.pod, node
        ):
            return False
        return not (
            constraint.get("nodeTaintsPolicy", "Ignore") == "Honor"
            and _untolerated(incoming.pod, node)
        )

    for c in constraints:
        key = c["topologyKey"]
        counts: dict[str, int] = {}
        eligible_names = set()
        for node in nodes:
            if eligible(node, c):
                counts.setdefault(_labels(node)[key], 0)
                eligible_names.add((node.get("metadata") or {}).get("name"))
        for e in existing:
            if e.node_name in eligible_names and _spread_selector_matches(c, incoming.pod, e.pod):
                counts[_labels(e.node)[key]] += 1
        minimum = min(counts.values()) if counts else 0
        min_domains = c.get("minDomains")
        if min_domains is not None and len(counts) < int(min_domains):
            minimum = 0
        self_match = 1 if _spread_selector_matches(c, incoming.pod, incoming.pod) else 0
        domain = node_labels[key]
        skew = counts.get(domain, 0) + self_match - minimum
        if skew > int(c.get("maxSkew", 1)):
            return (
                f"{key}={domain} would have {counts.get(domain, 0) + self_match} matching "
                f"{_describe_selector(c)} against a minimum of {minimum} over {len(counts)} "
                f"domain(s){f' (minDomains {min_domains})' if min_domains else ''}: skew {skew} "
                f"> maxSkew {c.get('maxSkew', 1)} when placed"
            )
    return None


# ------------------------------------------------------------------------------- checking


def _order_dependent(pod: Obj) -> bool:
    spec = pod.get("spec") or {}
    return bool(_affinity_terms(pod, "podAffinity")) or any(
        c.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule"
        for c in spec.get("topologySpreadConstraints") or []
    )


def _relevant_to(constrained: Sequence[_Placed], p: _Placed) -> bool:
    """Whether ``p`` can change the verdict on a constrained pod (its affinity terms or spread
    selectors select ``p``): pods that cannot may be left out of the order search."""
    for c in constrained:
        if any(_term_matches_pod(t, c.pod, p.pod) for t in _affinity_terms(c.pod, "podAffinity")):
            return True
        for s in (c.pod.get("spec") or {}).get("topologySpreadConstraints") or []:
            if _spread_selector_matches(s, c.pod, p.pod):
                return True
    return False


def _order_violations(placed: Sequence[_Placed], nodes: Sequence[Obj]) -> list[Violation]:
    """Search an order of placements in which every pod passes affinity and spread (see the
    module docstring); if there is none, report the pods stuck in the deepest dead end."""
    constrained = [p for p in placed if _order_dependent(p.pod)]
    if not constrained:
        return []
    pods = [p for p in placed if _order_dependent(p.pod) or _relevant_to(constrained, p)]
    n = len(pods)
    full = (1 << n) - 1

    def problem(i: int, mask: int) -> str | None:
        existing = [pods[j] for j in range(n) if mask >> j & 1]
        return _affinity_problem(pods[i], existing) or _spread_problem(pods[i], existing, nodes)

    dead: set[int] = set()
    best = {"mask": 0, "depth": -1}
    steps = 0

    def search(mask: int, depth: int) -> bool:
        nonlocal steps
        if mask == full:
            return True
        if mask in dead:
            return False
        if depth > best["depth"]:
            best.update(mask=mask, depth=depth)
        for i in range(n):
            if mask >> i & 1:
                continue
            steps += 1
            if steps > SEARCH_BUDGET:
                raise _Budget
            if problem(i, mask) is None and search(mask | 1 << i, depth + 1):
                return True
        dead.add(mask)
        return False

    try:
        if search(0, 0):
            return []
    except _Budget:
        return [
            Violation(
                constrained[0].name,
                constrained[0].node_name,
                SEARCH,
                f"gave up after {SEARCH_BUDGET} steps searching a valid placement order",
            )
        ]
    mask = best["mask"]
    out = []
    for i in range(n):
        if not mask >> i & 1:
            why = problem(i, mask)
            if why is not None:
                rule = (
                    AFFINITY
                    if _affinity_problem(pods[i], [pods[j] for j in range(n) if mask >> j & 1])
                    else SPREAD
                )
                out.append(
                    Violation(
                        pods[i].name,
                        pods[i].node_name,
                        rule,
                        f"no order of placing the pods satisfies required pod affinity and "
                        f"DoNotSchedule spread; after {bin(mask).count('1')} of {n} placed: {why}",
                    )
                )
    return out


class _Budget(Exception):
    pass


def _node_violations(node: Obj, pods: Sequence[_Placed]) -> list[Violation]:
    """Resources, pod count and host ports of everything placed on one node."""
    node_name = str((node.get("metadata") or {}).get("name"))
    out = []
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    used: dict[str, Fraction] = {}
    for p in pods:
        _add(used, effective_requests(p.pod))
    names = ", ".join(p.name for p in pods)
    for resource, amount in sorted(used.items()):
        have = parse_quantity(allocatable.get(resource, 0))
        if amount > have:
            out.append(
                Violation(
                    pods[-1].name,
                    node_name,
                    RESOURCES,
                    f"{resource}: pods request {float(amount):g} > allocatable "
                    f"{float(have):g} (pods: {names})",
                )
            )
    if "pods" in allocatable and len(pods) > parse_quantity(allocatable["pods"]):
        out.append(
            Violation(
                pods[-1].name,
                node_name,
                RESOURCES,
                f"{len(pods)} pods > allocatable pods {allocatable['pods']} ({names})",
            )
        )
    seen: list[tuple[tuple[str, str, int], str]] = []
    for p in pods:
        for port in _host_ports(p.pod):
            for other, owner in seen:
                if owner != p.name and _ports_conflict(port, other):
                    out.append(
                        Violation(
                            p.name,
                            node_name,
                            HOST_PORTS,
                            f"host port {port[1]}/{port[2]} ({port[0]}) also used by {owner}",
                        )
                    )
        seen += [(port, p.name) for port in _host_ports(p.pod)]
    return out


def _pod_violations(p: _Placed) -> list[Violation]:
    """Taints, nodeSelector and required node affinity of one placed pod."""
    out = []
    for t in _untolerated(p.pod, p.node):
        out.append(
            Violation(
                p.name,
                p.node_name,
                TAINTS,
                f"taint {t.get('key')}={t.get('value', '')}:{t.get('effect')} not tolerated",
            )
        )
    if not _node_selector_ok(p.pod, p.node):
        selector = (p.pod.get("spec") or {}).get("nodeSelector")
        out.append(Violation(p.name, p.node_name, NODE_SELECTOR, f"nodeSelector {selector}"))
    if not _required_node_affinity_ok(p.pod, p.node):
        out.append(
            Violation(p.name, p.node_name, NODE_AFFINITY, "no required nodeSelectorTerm matches")
        )
    return out


def check(nodes: Iterable[Obj], pods: Iterable[Obj]) -> list[Violation]:
    """Every violation of Kubernetes' placement rules by the placed pods among ``pods`` on
    ``nodes`` (see the module docstring)."""
    node_list = list(nodes)
    by_name = {str((n.get("metadata") or {}).get("name")): n for n in node_list}
    placed: list[_Placed] = []
    out: list[Violation] = []
    for pod in pods:
        node_name = (pod.get("spec") or {}).get("nodeName")
        if not node_name:
            continue
        node = by_name.get(node_name)
        if node is None:
            out.append(Violation(_name(pod), node_name, UNKNOWN_NODE, "node not in the cluster"))
            continue
        placed.append(_Placed(pod, node))
    for p in placed:
        out += _pod_violations(p)
    for name, node in by_name.items():
        on_node = [p for p in placed if p.node_name == name]
        if on_node:
            out += _node_violations(node, on_node)
    out += _anti_affinity_violations(placed)
    out += _order_violations(placed, node_list)
    return out


def by_rule(violations: Iterable[Violation]) -> dict[str, list[Violation]]:
    """Violations grouped by rule (for summaries)."""
    out: dict[str, list[Violation]] = {}
    for v in violations:
        out.setdefault(v.rule, []).append(v)
    return out
