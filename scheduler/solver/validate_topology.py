"""Independent check of pod affinity, anti-affinity and spread in a placement.

Kubernetes evaluates these rules when a pod is scheduled, against the pods running at that
moment; so a placement is valid when its assignments, taken in the order given, each pass the
rules against the snapshot's running pods plus the assignments before it. This module replays
them that way. It shares no code with :mod:`scheduler.plugins.podtopology` (the placement
passes' filter) on purpose: the same rules, written twice, from the Kubernetes documentation,
so that a bug in one is caught by the other. Only the parsed rules
(:mod:`scheduler.cluster.podaffinity`) are shared.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from scheduler.cluster.node import Node
from scheduler.cluster.pod import Pod
from scheduler.cluster.podaffinity import PodAffinityTerm, SpreadConstraint
from scheduler.cluster.selectors import affinity_matches, node_selector_matches, tolerates
from scheduler.cluster.snapshot import Snapshot
from scheduler.solver.placement import PodAssignment

__all__ = ["topology_violations"]


@dataclass(frozen=True, slots=True)
class _OneTerm:
    """Pods matching one term, per value of its key."""

    term: PodAffinityTerm

    @property
    def label(self) -> tuple[str, str] | None:
        """A label every pod this rule counts carries (None: unknown)."""
        return self.term.selector.anchor if self.term.selector is not None else None


@dataclass(frozen=True, slots=True)
class _AllTerms:
    """Pods matching every affinity term of a pod, per ``key=value`` of each term."""

    terms: tuple[PodAffinityTerm, ...]

    @property
    def label(self) -> tuple[str, str] | None:
        """A label every pod this rule counts carries (None: unknown)."""
        for t in self.terms:
            if t.selector is not None and t.selector.anchor is not None:
                return t.selector.anchor
        return None


@dataclass(frozen=True, slots=True)
class _SpreadRule:
    """Pods a spread constraint counts, per value of its key, over its eligible nodes."""

    constraint: SpreadConstraint
    namespace: str
    eligible: frozenset[str]

    @property
    def label(self) -> tuple[str, str] | None:
        """A label every pod this rule counts carries (None: unknown)."""
        selector = self.constraint.selector
        return selector.anchor if selector is not None else None


_Rule = _OneTerm | _AllTerms | _SpreadRule


class _Replay:
    """Running pods and the assignments so far, with tallies per rule asked about."""

    def __init__(self, nodes: Mapping[str, Node], running: Iterable[Pod]) -> None:
        self.nodes = nodes
        self.labels = {name: dict(n.labels) for name, n in nodes.items()}
        self.where: list[tuple[Pod, dict[str, str], str]] = []
        #: label -> positions in ``where`` of the pods carrying it
        self.by_label: dict[tuple[str, str], list[int]] = {}
        self.tallies: dict[_Rule, Counter[str]] = {}
        #: rules asked about, by the label every pod they count carries (None: any pod)
        self.rules_by_label: dict[tuple[str, str] | None, list[_Rule]] = {}
        self.owners: dict[PodAffinityTerm, Counter[str]] = {}
        self.owners_by_label: dict[tuple[str, str] | None, set[PodAffinityTerm]] = {}
        self._eligible: dict[object, frozenset[str]] = {}
        self._domains: dict[tuple[frozenset[str], str], set[str]] = {}
        for pod in running:
            if pod.node_name in self.labels:
                self.add(pod, pod.node_name or "")

    def add(self, pod: Pod, node: str) -> None:
        labels = dict(pod.labels)
        for kv in pod.labels:
            self.by_label.setdefault(kv, []).append(len(self.where))
        self.where.append((pod, labels, node))
        for term in pod.pod_anti_affinity:
            value = self.labels[node].get(term.topology_key)
            if value is not None and term.selector is not None:
                self.owners.setdefault(term, Counter())[value] += 1
                self.owners_by_label.setdefault(term.selector.anchor, set()).add(term)
        keys: list[tuple[str, str] | None] = [None, *pod.labels]
        for key in keys:
            for rule in self.rules_by_label.get(key, ()):
                self._tally_one(rule, self.tallies[rule], pod, labels, node)

    def _tally_one(
        self, rule: _Rule, tally: Counter[str], pod: Pod, labels: dict[str, str], node: str
    ) -> None:
        here = self.labels[node]
        if isinstance(rule, _OneTerm):
            value = here.get(rule.term.topology_key)
            if value is not None and rule.term.matches(pod.namespace, labels):
                tally[value] += 1
        elif isinstance(rule, _AllTerms):
            if all(t.matches(pod.namespace, labels) for t in rule.terms):
                for t in rule.terms:
                    value = here.get(t.topology_key)
                    if value is not None:
                        tally[f"{t.topology_key}={value}"] += 1
        elif (
            node in rule.eligible
            and not pod.deleting
            and pod.namespace == rule.namespace
            and rule.constraint.matches(labels)
        ):
            tally[here[rule.constraint.topology_key]] += 1

    def tally(self, rule: _Rule) -> Counter[str]:
        got = self.tallies.get(rule)
        if got is None:
            got = self.tallies[rule] = Counter()
            label = rule.label
            self.rules_by_label.setdefault(label, []).append(rule)
            rows = (
                self.where
                if label is None
                else [self.where[i] for i in self.by_label.get(label, ())]
            )
            for pod, labels, node in rows:
                self._tally_one(rule, got, pod, labels, node)
        return got

    def eligible(self, pod: Pod, c: SpreadConstraint) -> frozenset[str]:
        keys = {x.topology_key for x in pod.spread}
        memo = (
            frozenset(keys),
            (pod.node_selector, pod.own_affinity) if c.honor_affinity else None,
            pod.tolerations if c.honor_taints else None,
        )
        got = self._eligible.get(memo)
        if got is None:
            got = self._eligible[memo] = self._eligible_nodes(pod, c, keys)
        return got

    def domains(self, eligible: frozenset[str], key: str) -> set[str]:
        """Values of ``key`` among the ``eligible`` nodes."""
        memo = (eligible, key)
        got = self._domains.get(memo)
        if got is None:
            got = self._domains[memo] = {self.labels[n][key] for n in eligible}
        return got

    def _eligible_nodes(self, pod: Pod, c: SpreadConstraint, keys: set[str]) -> frozenset[str]:
        out = set()
        for name, node in self.nodes.items():
            labels = self.labels[name]
            if not keys <= labels.keys():
                continue
            if c.honor_affinity:
                if not node_selector_matches(pod.node_selector, labels):
                    continue
                if not affinity_matches(pod.own_affinity, {**labels, "metadata.name": name}):
                    continue
            if c.honor_taints and not tolerates(pod.tolerations, node.taints):
                continue
            out.add(name)
        return frozenset(out)

    def problems(self, pod: Pod, node: str) -> list[str]:
        """What the rules say against ``pod`` on ``node`` now."""
        here = self.labels[node]
        labels = dict(pod.labels)
        out = []
        near = {t for kv in (None, *pod.labels) for t in self.owners_by_label.get(kv, ())}
        for term in near:
            owners = self.owners[term]
            value = here.get(term.topology_key)
            if value is not None and owners[value] > 0 and term.matches(pod.namespace, labels):
                out.append(f"the anti-affinity of a pod in {term.topology_key}={value} excludes it")
        for term in pod.pod_anti_affinity:
            value = here.get(term.topology_key)
            if value is not None and self.tally(_OneTerm(term))[value] > 0:
                out.append(f"its anti-affinity: a matching pod runs in {term.topology_key}={value}")
        if pod.pod_affinity:
            terms = pod.pod_affinity
            tally = self.tally(_AllTerms(terms))
            missing = [t.topology_key for t in terms if t.topology_key not in here]
            if missing:
                out.append(f"its affinity: node has no label {missing[0]}")
            elif not all(tally[f"{t.topology_key}={here[t.topology_key]}"] > 0 for t in terms):
                alone = not any(n > 0 for n in tally.values()) and all(
                    t.matches(pod.namespace, labels) for t in terms
                )
                if not alone:
                    out.append("its affinity: no matching pod in the node's domain")
        for c in pod.spread:
            if c.topology_key not in here:
                out.append(f"spread: node has no label {c.topology_key}")
                continue
            eligible = self.eligible(pod, c)
            tally = self.tally(_SpreadRule(c, pod.namespace, eligible))
            domains = self.domains(eligible, c.topology_key)
            low = 0 if len(domains) < c.min_domains else min(tally[d] for d in domains)
            skew = tally[here[c.topology_key]] + (1 if c.matches(labels) else 0) - low
            if skew > c.max_skew:
                out.append(
                    f"spread on {c.topology_key}: skew {skew} > maxSkew {c.max_skew} "
                    f"in {c.topology_key}={here[c.topology_key]}"
                )
        return out


def topology_violations(
    snapshot: Snapshot,
    assignments: Sequence[PodAssignment],
    *,
    evicted: Collection[str] = (),
    checked: int = 0,
) -> list[str]:
    """Messages for assignments that break pod (anti-)affinity or spread when the placement
    is replayed in order (empty = ok). The first ``checked`` assignments passed before: they
    are counted, not judged again."""
    pods = snapshot.pod_by_uid
    placed = [(pods[a.pod_uid], a) for a in assignments if a.pod_uid in pods]
    # Nothing to replay when no placed pod has rules (anti-affinity among them) and no
    # running pod has anti-affinity; asked before the running pods are listed.
    if not any(p.topology_rules for p, _ in placed) and not any(
        p.pod_anti_affinity and p.bound and p.active and p.uid not in evicted for p in snapshot.pods
    ):
        return []
    running = [p for p in snapshot.pods if p.bound and p.active and p.uid not in evicted]
    replay = _Replay(snapshot.node_by_name, running)
    out = []
    for k, (pod, a) in enumerate(placed):
        if a.node not in replay.labels:
            continue  # the main validator names unknown nodes
        if k >= checked:
            out += [f"pod {pod.key} on node {a.node}: {p}" for p in replay.problems(pod, a.node)]
        replay.add(pod, a.node)
    return out
