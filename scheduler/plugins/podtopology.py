"""Where other pods run decides where a pod may go: required pod affinity, anti-affinity (both
directions) and ``DoNotSchedule`` topology spread, as kube-scheduler's InterPodAffinity and
PodTopologySpread filters define them.

:class:`PodTopology` follows the pods located on nodes (bound in the snapshot and placed
during the cycle: the solver calls :meth:`PodTopology.add` / :meth:`PodTopology.remove` as it
applies and releases them) and answers, for one pod at a time, :meth:`PodTopology.check`: a
function of a node that returns None when the node is allowed, else the reason. Placing pods
one after another with this check is exactly kube-scheduler's sequential semantics, so a
placement made this way is one kube-scheduler could have made.

The rules, for pod P and candidate node N (``N[k]`` is N's value of label k):

- **anti-affinity of P**: for each term, no pod matching it runs on a node with the same
  ``N[key]``; a node without the key passes.
- **anti-affinity of running pods** (symmetric): no pod E whose term matches P runs on a node
  with ``N[key]`` equal to E's node's.
- **affinity of P**: N has every term's key, and for each term some pod matching *all* terms
  runs in N's domain of that term; unless no such pod runs anywhere and P matches all its own
  terms (the first pod of a group that is affine to itself).
- **spread**: N has every constraint's key; per constraint, matching pods of P's namespace
  (not terminating) are counted per domain over the *eligible* nodes (those the pod's node
  selector and affinity accept, unless ``nodeAffinityPolicy: Ignore``; whose taints it
  tolerates when ``nodeTaintsPolicy: Honor``; that carry every constraint's key); then
  ``count(N[key]) + (1 if P matches) - min over domains <= maxSkew``, where the minimum is 0
  while fewer than ``minDomains`` domains exist.

Counters are built lazily per distinct rule and kept up to date on every add/remove, so a
check costs a few dictionary lookups per rule once built.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from scheduler.cluster.node import Node, Taint
from scheduler.cluster.pod import Pod
from scheduler.cluster.podaffinity import (
    LabelSelector,
    PodAffinityTerm,
    Preferences,
    SpreadConstraint,
)
from scheduler.cluster.selectors import affinity_matches, node_selector_matches, tolerates

__all__ = [
    "AFFINITY",
    "ANTI_AFFINITY",
    "EXISTING_ANTI_AFFINITY",
    "SPREAD",
    "SPREAD_IGNORED",
    "SPREAD_LABEL",
    "NodeCheck",
    "PodTopology",
    "Preference",
    "attracts",
    "spread_eligibility_key",
    "spread_eligible_nodes",
]

#: Reasons, worded as kube-scheduler words them (users search for these).
AFFINITY = "node(s) didn't match pod affinity rules"
ANTI_AFFINITY = "node(s) didn't match pod anti-affinity rules"
EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"
SPREAD = "node(s) didn't match pod topology spread constraints"
SPREAD_LABEL = "node(s) didn't match pod topology spread constraints (missing required label)"


#: Per node: how well it meets a pod's preferences (:meth:`PodTopology.preference`).
Preference = Callable[[str], tuple[float, float, float]]
#: What the spread part of a :data:`Preference` loses on a node without a constraint's
#: topology key (kube-scheduler leaves such a node out of the spread score: its worst).
SPREAD_IGNORED = 1e9


def spread_eligibility_key(
    pod: Pod, c: SpreadConstraint, keys: tuple[str, ...]
) -> tuple[object, ...]:
    """What :func:`spread_eligible_nodes` depends on for ``pod`` and ``c`` (a cache key)."""
    sig: tuple[object, ...] = (keys, c.honor_affinity, c.honor_taints)
    if c.honor_affinity:
        sig += (pod.node_selector, pod.own_affinity)
    if c.honor_taints:
        sig += (pod.tolerations,)
    return sig


def spread_eligible_nodes(
    pod: Pod,
    c: SpreadConstraint,
    keys: tuple[str, ...],
    nodes: Iterable[tuple[str, tuple[Taint, ...]]],
    labels: Mapping[str, Mapping[str, str]],
) -> frozenset[str]:
    """The nodes a spread constraint of ``pod`` counts, as kube-scheduler's PodTopologySpread
    does: nodes carrying every key in ``keys`` (all of the pod's constraints' keys), that
    match the pod's node selector and own required affinity unless ``nodeAffinityPolicy``
    ignores them, and whose taints it tolerates when ``nodeTaintsPolicy`` honours them.
    ``nodes``: (name, taints) pairs; ``labels``: each node's labels."""
    out = []
    # Asked of every node of the cluster: what depends on the pod only is read once, and
    # the node's labels are copied (to expose its name) only for a pod with node affinity.
    selector = pod.node_selector if c.honor_affinity else ()
    terms = pod.own_affinity if c.honor_affinity else ()
    tolerations = pod.tolerations
    for name, taints in nodes:
        node_labels = labels[name]
        if any(k not in node_labels for k in keys):
            continue
        if selector and not node_selector_matches(selector, node_labels):
            continue
        if terms and not affinity_matches(terms, {**node_labels, "metadata.name": name}):
            continue
        if c.honor_taints and not tolerates(tolerations, taints):
            continue
        out.append(name)
    return frozenset(out)


class NodeCheck:
    """node name -> None when allowed, else the reason; ``keys`` are the node labels the
    answer depends on (nodes equal in these get the same answer)."""

    __slots__ = ("_test", "keys")

    def __init__(self, test: Callable[[str], str | None], keys: frozenset[str]) -> None:
        self._test = test
        self.keys = keys

    def __call__(self, node: str) -> str | None:
        return self._test(node)


#: A label (key, value) every pod a selector matches must carry; None when there is none.
Anchor = tuple[str, str] | None


def anchor_of(selector: LabelSelector | None) -> Anchor:
    """The selector's anchor label (:attr:`LabelSelector.anchor`); None without a selector."""
    return selector.anchor if selector is not None else None


class _Tally(ABC):
    """Pods one rule counts, per domain; kept up to date as pods come and go."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: Counter[object] = Counter()

    @abstractmethod
    def update(
        self, pod: Pod, labels: Mapping[str, str], node: Mapping[str, str], step: int
    ) -> None:
        """Count ``pod`` (``step`` 1) or stop counting it (-1) on a node with these labels."""


class _AffinityTally(_Tally):
    """Pods matching every affinity term of a pod, per (key, value) of each term."""

    __slots__ = ("terms",)

    def __init__(self, terms: tuple[PodAffinityTerm, ...]) -> None:
        super().__init__()
        self.terms = terms

    def update(
        self, pod: Pod, labels: Mapping[str, str], node: Mapping[str, str], step: int
    ) -> None:
        if all(t.matches(pod.namespace, labels) for t in self.terms):
            for t in self.terms:
                value = node.get(t.topology_key)
                if value is not None:
                    self.counts[(t.topology_key, value)] += step


class _TermTally(_Tally):
    """Pods matching one anti-affinity term, per value of its key."""

    __slots__ = ("term",)

    def __init__(self, term: PodAffinityTerm) -> None:
        super().__init__()
        self.term = term

    def update(
        self, pod: Pod, labels: Mapping[str, str], node: Mapping[str, str], step: int
    ) -> None:
        if self.term.matches(pod.namespace, labels):
            value = node.get(self.term.topology_key)
            if value is not None:
                self.counts[value] += step


class _SpreadTally(_Tally):
    """Pods one spread constraint counts (its namespace, not terminating, on an eligible
    node), per value of its key."""

    __slots__ = ("constraint", "domains", "eligible", "namespace")

    def __init__(
        self, c: SpreadConstraint, namespace: str, eligible: frozenset[str], domains: frozenset[str]
    ) -> None:
        super().__init__()
        self.constraint = c
        self.namespace = namespace
        self.eligible = eligible
        self.domains = domains

    def update(
        self, pod: Pod, labels: Mapping[str, str], node: Mapping[str, str], step: int
    ) -> None:
        if (
            not pod.deleting
            and pod.namespace == self.namespace
            and node.get(_NAME) in self.eligible
            and self.constraint.matches(labels)
        ):
            self.counts[node[self.constraint.topology_key]] += step


#: The node's name, kept among its labels here (spread eligibility is by node).
_NAME = "\0name"


def attracts(pod: Pod) -> bool:
    """True when ``pod``, once located, scores the pods its affinity terms match
    (:attr:`~scheduler.cluster.pod.Pod.scoring_affinity`)."""
    return bool(pod.scoring_affinity)


class PodTopology:
    """Pods per topology domain, for the rules of :mod:`scheduler.cluster.podaffinity`.

    Rules are looked up by an *anchor* label (:func:`anchor_of`): a pod is compared only
    with the rules whose anchor it carries (and the few without one), and a new rule counts
    only the pods carrying its anchor - so thousands of jobs, each keeping its own pods
    apart, cost no more per pod than one.
    """

    def __init__(self, nodes: Mapping[str, Node], located: Iterable[tuple[Pod, str]] = ()) -> None:
        self._nodes = nodes
        self._labels: dict[str, dict[str, str]] = {
            n: {**node.label_map, _NAME: n} for n, node in nodes.items()
        }
        self._pod_labels: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
        #: uid -> (pod, node) of every pod on a node
        self.located: dict[str, tuple[Pod, str]] = {}
        #: label -> uids of the located pods carrying it
        self._carrying: dict[tuple[str, str], dict[str, None]] = {}
        #: anti-affinity terms of located pods: term -> values of its key where owners run,
        #: and the terms by anchor
        self._owners: dict[PodAffinityTerm, Counter[str]] = {}
        self._owners_by: dict[Anchor, dict[PodAffinityTerm, None]] = {}
        #: terms of located pods that score pods they match (:meth:`preference`): (term,
        #: weight) -> values of its key where owners run, and the terms by anchor
        self._attracting: dict[tuple[PodAffinityTerm, int], Counter[str]] = {}
        self._attracting_by: dict[Anchor, dict[tuple[PodAffinityTerm, int], None]] = {}
        #: tallies by what they are about, and by anchor
        self._tallies: dict[object, _Tally] = {}
        self._tallies_by: dict[Anchor, list[_Tally]] = {}
        self._eligible: dict[object, frozenset[str]] = {}
        self._domains: dict[tuple[frozenset[str], str], frozenset[str]] = {}
        for pod, node in located:
            self.add(pod, node)

    # --- following pods -------------------------------------------------------------------

    def _labels_of(self, pod: Pod) -> dict[str, str]:
        got = self._pod_labels.get(pod.labels)
        if got is None:
            got = self._pod_labels[pod.labels] = dict(pod.labels)
        return got

    def add(self, pod: Pod, node: str) -> None:
        """``pod`` now runs (or is placed) on ``node``."""
        if pod.uid in self.located or node not in self._labels:
            return
        self.located[pod.uid] = (pod, node)
        for kv in pod.labels:
            self._carrying.setdefault(kv, {})[pod.uid] = None
        self._count(pod, node, 1)

    def remove(self, pod_uid: str) -> None:
        """The pod no longer holds its node."""
        got = self.located.pop(pod_uid, None)
        if got is None:
            return
        pod, node = got
        for kv in pod.labels:
            self._carrying[kv].pop(pod_uid, None)
        self._count(pod, node, -1)

    def _count(self, pod: Pod, node: str, step: int) -> None:
        node_labels = self._labels[node]
        for term in pod.pod_anti_affinity:
            value = node_labels.get(term.topology_key)
            if value is not None and term.selector is not None:
                owners = self._owners.get(term)
                if owners is None:
                    owners = self._owners[term] = Counter()
                    self._owners_by.setdefault(anchor_of(term.selector), {})[term] = None
                owners[value] += step
        for term, weight in pod.scoring_affinity:
            value = node_labels.get(term.topology_key)
            if value is not None and term.selector is not None:
                scoring = (term, weight)
                counts = self._attracting.get(scoring)
                if counts is None:
                    counts = self._attracting[scoring] = Counter()
                    by_anchor = self._attracting_by.setdefault(anchor_of(term.selector), {})
                    by_anchor[scoring] = None
                counts[value] += step
        if not self._tallies:
            return
        labels = self._labels_of(pod)
        for tally in self._tallies_by.get(None, ()):
            tally.update(pod, labels, node_labels, step)
        for kv in pod.labels:
            for tally in self._tallies_by.get(kv, ()):
                tally.update(pod, labels, node_labels, step)

    def _candidates(self, anchor: Anchor) -> Iterable[tuple[Pod, str]]:
        if anchor is None:
            return self.located.values()
        return (self.located[uid] for uid in self._carrying.get(anchor, {}))

    def _tally(self, key: object, make: Callable[[], _Tally], anchor: Anchor) -> _Tally:
        tally = self._tallies.get(key)
        if tally is None:
            tally = self._tallies[key] = make()
            self._tallies_by.setdefault(anchor, []).append(tally)
            for pod, node in self._candidates(anchor):
                tally.update(pod, self._labels_of(pod), self._labels[node], 1)
        return tally

    # --- tallies, built on first use ------------------------------------------------------

    def _affinity_counts(self, terms: tuple[PodAffinityTerm, ...]) -> Counter[object]:
        anchor = next((a for t in terms if (a := anchor_of(t.selector)) is not None), None)
        return self._tally(("affinity", terms), lambda: _AffinityTally(terms), anchor).counts

    def _anti_counts(self, term: PodAffinityTerm) -> Counter[object]:
        return self._tally(
            ("anti", term), lambda: _TermTally(term), anchor_of(term.selector)
        ).counts

    def _eligible_nodes(
        self, pod: Pod, c: SpreadConstraint, keys: tuple[str, ...]
    ) -> frozenset[str]:
        """Nodes a spread constraint of ``pod`` counts (the same for all its constraints with
        the same policies, whatever they select)."""
        sig = spread_eligibility_key(pod, c, keys)
        got = self._eligible.get(sig)
        if got is not None:
            return got
        got = self._eligible[sig] = spread_eligible_nodes(
            pod, c, keys, ((name, node.taints) for name, node in self._nodes.items()), self._labels
        )
        return got

    def _spread_tally(
        self, pod: Pod, c: SpreadConstraint, of: tuple[SpreadConstraint, ...] | None = None
    ) -> _SpreadTally:
        """The tally of ``c``, one of the constraints ``of`` (default: the pod's hard ones;
        nodes count only if they carry every constraint's key)."""
        keys = tuple(sorted({x.topology_key for x in (pod.spread if of is None else of)}))
        eligible = self._eligible_nodes(pod, c, keys)

        def make() -> _Tally:
            memo = (eligible, c.topology_key)
            domains = self._domains.get(memo)
            if domains is None:
                labels = self._labels
                domains = frozenset(labels[n][c.topology_key] for n in eligible)
                self._domains[memo] = domains
            return _SpreadTally(c, pod.namespace, eligible, domains)

        tally = self._tally(("spread", c, pod.namespace, eligible), make, anchor_of(c.selector))
        assert isinstance(tally, _SpreadTally)
        return tally

    def _guarding(self, pod: Pod) -> list[PodAffinityTerm]:
        """Anti-affinity terms of located pods that match ``pod`` (and guard some domain)."""
        if not self._owners:
            return []
        labels = self._labels_of(pod)
        out = []
        for anchor in (None, *pod.labels):
            for t in self._owners_by.get(anchor, ()):
                if t.matches(pod.namespace, labels) and any(
                    v > 0 for v in self._owners[t].values()
                ):
                    out.append(t)
        return out

    def _attracted(self, pod: Pod) -> list[tuple[str, int, Counter[str]]]:
        """(key, weight, owners per value) of the located pods' scoring terms
        (:attr:`~scheduler.cluster.pod.Pod.scoring_affinity`) that match ``pod``."""
        if not self._attracting:
            return []
        labels = self._labels_of(pod)
        out = []
        for anchor in (None, *pod.labels):
            for term, weight in self._attracting_by.get(anchor, ()):
                if term.matches(pod.namespace, labels):
                    counts = self._attracting[(term, weight)]
                    if any(v > 0 for v in counts.values()):
                        out.append((term.topology_key, weight, counts))
        return out

    # --- the check --------------------------------------------------------------------------

    def constrained(self, pod: Pod) -> bool:
        """True when some node may be refused to ``pod`` because of where pods run."""
        return pod.topology_rules or bool(self._guarding(pod))

    def check(self, pod: Pod) -> NodeCheck | None:
        """A node test for ``pod`` given the pods located now; None when nothing restricts it.

        The test is valid until the next :meth:`add` / :meth:`remove`.
        """
        guarding = self._guarding(pod)
        if not (pod.topology_rules or guarding):
            return None
        labels = self._labels_of(pod)
        node_labels = self._labels
        # existing pods' anti-affinity: forbidden (key, value) pairs
        forbidden_existing: dict[str, set[object]] = {}
        for t in guarding:
            guarded = forbidden_existing.setdefault(t.topology_key, set())
            guarded.update(v for v, n in self._owners[t].items() if n > 0)
        forbidden_own: list[tuple[str, set[object]]] = [
            (t.topology_key, {v for v, n in self._anti_counts(t).items() if n > 0})
            for t in pod.pod_anti_affinity
        ]
        affinity_terms = pod.pod_affinity
        affinity_counts = self._affinity_counts(affinity_terms) if affinity_terms else None
        first_of_group = (
            affinity_counts is not None
            and not any(n > 0 for n in affinity_counts.values())
            and all(t.matches(pod.namespace, labels) for t in affinity_terms)
        )
        spreads = []
        for c in pod.spread:
            s = self._spread_tally(pod, c)
            if len(s.domains) < c.min_domains:
                low = 0
            else:
                low = min((s.counts.get(d, 0) for d in s.domains), default=0)
            spreads.append(
                (c.topology_key, s.counts, low, c.max_skew - (1 if c.matches(labels) else 0))
            )

        def test(node: str) -> str | None:
            nl = node_labels[node]
            for key, counts, low, room in spreads:
                value = nl.get(key)
                if value is None:
                    return SPREAD_LABEL
                if counts.get(value, 0) - low > room:
                    return SPREAD
            # kube-scheduler's order: spread (above), affinity, own anti-affinity, running
            # pods' anti-affinity - so a node refused twice gets the same reason.
            if affinity_counts is not None:
                exist = True
                for t in affinity_terms:
                    value = nl.get(t.topology_key)
                    if value is None:
                        return AFFINITY
                    if affinity_counts.get((t.topology_key, value), 0) <= 0:
                        exist = False
                if not exist and not first_of_group:
                    return AFFINITY
            for key, values in forbidden_own:
                if nl.get(key) in values:
                    return ANTI_AFFINITY
            for key, values in forbidden_existing.items():
                if nl.get(key) in values:
                    return EXISTING_ANTI_AFFINITY
            return None

        keys = {t.topology_key for t in (*pod.pod_affinity, *pod.pod_anti_affinity)}
        keys.update(c.topology_key for c in pod.spread)
        keys.update(forbidden_existing)
        return NodeCheck(test, frozenset(keys))

    # --- preferences --------------------------------------------------------------------------

    def preference(self, pod: Pod) -> Preference | None:
        """Per node, how well it meets the pod's preferences, as (pod affinity, spread, node
        affinity) - higher is better in each; the caller weighs and normalises them over its
        candidates. None when nothing is preferred for the pod.

        Pod affinity: the weight of each preferred term times the matching pods in the
        node's domain (anti-affinity subtracts); plus, as kube-scheduler scores them, the
        terms of pods already located that match this pod, per such pod in the node's
        domain: 1 for a required affinity term, the weight of a preferred one (minus for
        anti-affinity). So a pod that others must join goes where they already are, and
        leaves the domains they avoid to them. Spread (``ScheduleAnyway``): minus the
        matching pods in the node's domain of each constraint (a node without the key is
        worst). Node affinity: the summed weights of the preferred terms the node matches.
        The same parts kube-scheduler's InterPodAffinity, PodTopologySpread and NodeAffinity
        scores use.
        """
        attracted = self._attracted(pod)
        prefs = pod.preferences
        if prefs is None:
            if not attracted:
                return None
            prefs = Preferences()
        weighted = [(w.weight, w.term, self._anti_counts(w.term)) for w in prefs.affinity]
        weighted += [(-w.weight, w.term, self._anti_counts(w.term)) for w in prefs.anti_affinity]
        soft = [(c, self._spread_tally(pod, c, prefs.spread).counts) for c in prefs.spread]
        node_labels = self._labels

        def score(node: str) -> tuple[float, float, float]:
            nl = node_labels[node]
            near = 0.0
            for weight, term, counts in weighted:
                value = nl.get(term.topology_key)
                if value is not None:
                    near += weight * counts.get(value, 0)
            for key, weight, owners in attracted:
                value = nl.get(key)
                if value is not None:
                    near += weight * owners.get(value, 0)
            spread = 0.0
            for c, counts in soft:
                value = nl.get(c.topology_key)
                spread -= counts.get(value, 0) if value is not None else SPREAD_IGNORED
            named = {**nl, "metadata.name": node}
            wanted = float(sum(w for w, term in prefs.nodes if term.matches(named)))
            return near, spread, wanted

        return score
