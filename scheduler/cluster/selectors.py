"""Node selection rules of a pod: tolerations, nodeSelector, required node affinity.

Matching follows the Kubernetes semantics: ``nodeSelector`` is an AND of exact labels; required
node affinity is an OR of terms, each an AND of requirements; a pod lands only on nodes whose
NoSchedule and NoExecute taints it tolerates (PreferNoSchedule is a preference, not a rule).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from scheduler.cluster.node import Node, Taint

__all__ = [
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "Operator",
    "Toleration",
    "affinity_matches",
    "node_selector_matches",
    "tolerates",
]

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]


@dataclass(frozen=True, slots=True)
class Toleration:
    """A pod toleration. An empty ``key`` with ``Exists`` tolerates every taint."""

    key: str = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: str = ""  # empty matches every effect

    def tolerates(self, taint: Taint) -> bool:
        """True when this toleration covers ``taint``."""
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


@dataclass(frozen=True, slots=True)
class NodeSelectorRequirement:
    """One ``matchExpressions`` entry of a node selector term."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True when ``labels`` satisfy this requirement."""
        present = self.key in labels
        value = labels.get(self.key)
        if self.operator == "In":
            return present and value in self.values
        if self.operator == "NotIn":
            return not present or value not in self.values
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        # Gt/Lt compare integers; a non-integer label or value never matches.
        if not present or len(self.values) != 1:
            return False
        try:
            left, right = int(value or ""), int(self.values[0])
        except ValueError:
            return False
        return left > right if self.operator == "Gt" else left < right


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    """A node selector term: all requirements must hold (``matchExpressions``)."""

    requirements: tuple[NodeSelectorRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True when every requirement holds. An empty term matches nothing, as in Kubernetes."""
        return bool(self.requirements) and all(r.matches(labels) for r in self.requirements)


def tolerates(tolerations: tuple[Toleration, ...], taints: tuple[Taint, ...]) -> bool:
    """True when every NoSchedule/NoExecute taint is tolerated by some toleration."""
    for taint in taints:
        if taint.effect == "PreferNoSchedule":
            continue
        if not any(t.tolerates(taint) for t in tolerations):
            return False
    return True


def node_selector_matches(selector: tuple[tuple[str, str], ...], labels: Mapping[str, str]) -> bool:
    """True when every ``nodeSelector`` label is present with the same value."""
    return all(labels.get(k) == v for k, v in selector)


def affinity_matches(terms: tuple[NodeSelectorTerm, ...], labels: Mapping[str, str]) -> bool:
    """Required node affinity: no terms means no constraint; otherwise any term may match."""
    return not terms or any(term.matches(labels) for term in terms)


def node_accepts(
    node: Node,
    tolerations: tuple[Toleration, ...],
    selector: tuple[tuple[str, str], ...],
    terms: tuple[NodeSelectorTerm, ...],
) -> bool:
    """Taints, nodeSelector and required affinity together (not capacity or node state)."""
    # matchFields may only name metadata.name; expose it like a label so one matcher serves.
    labels = {**node.label_map, "metadata.name": node.name}
    return (
        tolerates(tolerations, node.taints)
        and node_selector_matches(selector, labels)
        and affinity_matches(terms, labels)
    )


__all__ += ["node_accepts"]


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A ``metav1.LabelSelector`` (``matchLabels`` and ``matchExpressions``), over pod labels:
    pod affinity, spread constraints, PodDisruptionBudgets."""

    match_labels: tuple[tuple[str, str], ...] = ()
    expressions: tuple[NodeSelectorRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True when every label and expression holds (an empty selector matches all)."""
        return all(labels.get(k) == v for k, v in self.match_labels) and all(
            e.matches(labels) for e in self.expressions
        )

    @property
    def anchor(self) -> tuple[str, str] | None:
        """A label every pod this selector matches carries, if there is one: rules are
        looked up by it, so a pod is compared only with rules that may select it."""
        if self.match_labels:
            return self.match_labels[0]
        for e in self.expressions:
            if e.operator == "In" and len(e.values) == 1:
                return (e.key, e.values[0])
        return None

    def describe(self) -> str:
        """``app=web, tier in (a,b)`` - for messages."""
        parts = [f"{k}={v}" for k, v in self.match_labels]
        for e in self.expressions:
            if e.operator in ("Exists", "DoesNotExist"):
                parts.append(e.key if e.operator == "Exists" else f"!{e.key}")
            else:
                parts.append(f"{e.key} {e.operator.lower()} ({','.join(e.values)})")
        return ", ".join(parts) or "every pod"


__all__ += ["LabelSelector"]
