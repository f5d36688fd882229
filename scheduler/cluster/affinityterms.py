"""ANDing and ORing required node affinities, each an OR-list of node selector terms.

A pod's own required node affinity and the restrictions of its PersistentVolumes
(:mod:`scheduler.cluster.volumes`) are such OR-lists: they are ANDed (:func:`and_terms`) into
the one affinity every stage checks, and the volumes that could bind one claim are ORed
(:func:`or_terms`) into where some of them may be used.
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.cluster.selectors import NodeSelectorRequirement, NodeSelectorTerm

__all__ = ["MAX_TERMS", "and_terms", "or_terms"]

#: Most alternatives (node selector terms) a pod's affinity ANDed with its volumes' may have.
MAX_TERMS = 64


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
