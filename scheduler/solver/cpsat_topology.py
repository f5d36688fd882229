"""An exact, pod-level search for the gangs whose placement depends on where pods run, when
the instance is small: :func:`place_ruled_exactly`.

The greedy places pods one after another and never revisits a node choice; a pod with
anti-affinity that took the node another pod needed, or a spread count raised in the wrong
rack, can leave a pod out that another choice would have placed. The aggregated CP-SAT model
(:mod:`.cpsat`) counts pods per node class and cannot see domains, so these gangs
(:attr:`~.ruled_gangs.TopologyGangs.ruled`) keep the greedy's placement there. Here they get
a model of their own, one boolean per (pod, node):

- ``x[p, n]`` for the pending pods of the ruled gangs (extras included) over their
  candidate nodes: placeable, accepted by taints / node selector / required node affinity,
  with room for the pod alone (every resource: pods count and host ports are resources),
  carrying every key the pod's affinity and spread terms name, and outside the domains the
  fixed pods' anti-affinity (both directions) closes. Fixed pods: the running ones and the
  other gangs' pods as the greedy placed them (no rule selects those).
- capacity per node and resource; device thousandths (and free whole devices for whole-GPU
  pods) per node, the grant itself made afterwards by the default packer;
- a gang's required pods all or none (``y[g]``); extras only with their gang; queue limits
  and quota (:func:`~.rows.queue_rows`);
- required anti-affinity between model pods: per domain of the term's key, a pod and a pod
  its term matches are not both there (symmetric, so the order does not matter);
- kube-scheduler judges affinity and spread against the pods placed *before* a pod, so the
  model orders them too: gangs get distinct positions and pods distinct positions inside
  their gang (the answer is a sequence of whole gangs, as the validator replays it), and
  ``w = before(q, p) and q in domain d`` counts what ``p`` sees. Affinity: for each term,
  ``p`` in domain ``d`` needs a fixed matching pod in ``d`` or a matching model pod placed
  before it in ``d``, unless ``p`` is the first of a group that is affine to itself (it
  matches its own terms, no fixed pod matches them, and no model pod matching them is
  placed before it - kube-scheduler's rule). Spread (``DoNotSchedule``): for ``p`` in
  domain ``d``, ``count(d) - count(d') <= maxSkew - [p matches]`` for every eligible domain
  ``d'`` (that is ``count(d) - min <= ...``), counts of the pods placed before ``p`` on the
  constraint's eligible nodes; with fewer eligible domains than ``minDomains`` the minimum
  is 0. Matching, eligibility and domains read the parsed rules
  (:mod:`scheduler.cluster.podaffinity`) as :class:`~scheduler.plugins.podtopology.PodTopology`
  does.

Objective, lexicographic by weights: per priority tier (highest first) work within fair
share, then all work (:func:`~.hybrid.admission_key`'s measure); then pods placed (extras
count); then, as the minor term, pods kept on the node the greedy chose for them (the
greedy's node choice is what applied preferences and packing). The greedy's placement is
the hint.

Run only when some ruled gang (or an extra of one) was left out, and when the instance is
small: at most :data:`MAX_PODS_IN_ALL` pending pods of ruled gangs, and at most
:data:`MAX_POD_NODES` (pod, node) pairs to look at - a pod looks at the nodes that carry
its node selector's labels, or at every node (the first test, made before anything is
built, counts the pods without a node selector times the nodes: the 5,000-node benchmark
with ``--constraints`` stops there). The ruled gangs are then split into groups that
cannot affect each other (:func:`_groups`: no shared candidate node, no rule selecting
across, no queue row in common) and only the groups with a pod left out are solved, each
as a model of its own of at most :data:`MAX_PODS` pods and :data:`MAX_ORDER_TERMS` order
helpers. The whole search of a cycle (candidates, models, CP-SAT) stops starting models
after :data:`MAX_SECONDS`, or :data:`BUDGET_SHARE` of ``time_limit_seconds`` if less;
each CP-SAT call gets what is left of that.
A group's answer is kept only if it beats the greedy's by :func:`~.hybrid.admission_key`
(or ties it and places more pods), and the whole placement only if the validator
(:func:`~.validate.validate`, which replays the rules in the answer's order) accepts it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from scheduler.cluster.node import GPU_MILLI
from scheduler.cluster.pod import Pod
from scheduler.cluster.podaffinity import LabelSelector, PodAffinityTerm, SpreadConstraint
from scheduler.cluster.queue import pod_queue_usage
from scheduler.cluster.snapshot import Snapshot
from scheduler.framework.filters import node_rules_allow
from scheduler.plugins.podtopology import spread_eligibility_key, spread_eligible_nodes
from scheduler.solver.greedy import GangRequest, GreedyResult
from scheduler.solver.hybrid import admission_key, model_gang
from scheduler.solver.placement import PlacementSettings, PodAssignment
from scheduler.solver.problem import Problem
from scheduler.solver.queues import QueueBook
from scheduler.solver.rows import ModelGang, fair_rooms, queue_rows, work_units
from scheduler.solver.state import ClusterState, pick_devices
from scheduler.solver.validate import validate

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

__all__ = [
    "BUDGET_SHARE",
    "MAX_ORDER_TERMS",
    "MAX_PODS",
    "MAX_PODS_IN_ALL",
    "MAX_POD_NODES",
    "MAX_SECONDS",
    "ExactAnswer",
    "place_ruled_exactly",
    "solve_ruled",
]

log = structlog.get_logger(__name__)

#: Pods of one model (a group of ruled gangs that affect each other) at most.
MAX_PODS = 64
#: Pending pods of all ruled gangs (extras included) at most, and (pod, node) pairs looked
#: at most (a pod looks at the nodes its node selector allows, or all). Pods without a
#: node selector are counted first, by one multiplication: a large cluster skips there.
MAX_PODS_IN_ALL = 512
MAX_POD_NODES = 40000
#: Order helpers (``before`` pairs and "before and in domain" booleans) at most.
MAX_ORDER_TERMS = 20000
#: Seconds for the whole search of a cycle at most, and at most this share of the cycle's
#: ``time_limit_seconds`` (0.2 s with the default 0.5 s).
MAX_SECONDS = 0.25
BUDGET_SHARE = 0.4
#: Objective weights must stay well inside CP-SAT's 64-bit integers.
_MAX_WEIGHT = 2**60


class _TooBig(Exception):
    """The model outgrew :data:`MAX_ORDER_TERMS` while it was built."""


@dataclass(frozen=True)
class ExactAnswer:
    """What the model chose: per model gang (in the order found) its pods and nodes, in the
    order they are to be placed; and CP-SAT's status name."""

    order: list[tuple[str, list[tuple[Pod, str]]]]
    status: str
    seconds: float


def _greedy_nodes(greedy: GreedyResult, keys: AbstractSet[str]) -> dict[str, str]:
    return {a.pod_uid: a.node for k, pods in greedy.placed.items() if k in keys for a in pods}


def _located(state: ClusterState) -> list[tuple[Pod, str]]:
    """The pods on nodes in ``state`` (bound and applied), as PodTopology follows them."""
    out = [(p, p.node_name or "") for p in state.bound.values() if p.node_name in state.nodes]
    out += [(state.pods[uid], a.node) for uid, a in state.placed.items()]
    return out


class _Context:
    """What every model of one call shares: node labels, the fixed pods (on nodes in
    ``state``, which holds no model pod) indexed by label, and candidates per pod."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.labels: dict[str, Mapping[str, str]] = {
            n: s.node.label_map for n, s in state.nodes.items()
        }
        self.located = _located(state)
        self._carrying: dict[tuple[str, str], list[tuple[Pod, str]]] = {}
        for pod, node in self.located:
            for kv in pod.labels:
                self._carrying.setdefault(kv, []).append((pod, node))
        #: (term, key, value) of the fixed pods' anti-affinity: the domains they guard
        self.guards = [
            (t, t.topology_key, value)
            for pod, node in self.located
            for t in pod.pod_anti_affinity
            if t.selector is not None
            and (value := self.labels[node].get(t.topology_key)) is not None
        ]
        self._allowed: dict[tuple[object, int], bool] = {}
        self._by_label: dict[tuple[str, str], list[str]] | None = None

    def scope(self, pod: Pod) -> Sequence[str]:
        """The nodes carrying every label of the pod's node selector (all nodes without
        one), in the state's order: where :meth:`candidates` looks."""
        if not pod.node_selector:
            return list(self.state.nodes)
        if self._by_label is None:
            self._by_label = {}
            for name, labels in self.labels.items():
                for kv in labels.items():
                    self._by_label.setdefault(kv, []).append(name)
        lists = [self._by_label.get(kv, []) for kv in pod.node_selector]
        shortest = min(lists, key=len)
        if len(lists) == 1:
            return shortest
        rest = [set(x) for x in lists if x is not shortest]
        return [n for n in shortest if all(n in r for r in rest)]

    def fixed(self, selector: LabelSelector | None) -> Sequence[tuple[Pod, str]]:
        """The fixed pods a rule with ``selector`` may select (by its anchor label)."""
        if selector is None:
            return ()
        anchor = selector.anchor
        return self.located if anchor is None else self._carrying.get(anchor, ())

    def candidates(self, pod: Pod) -> list[str]:
        """Nodes ``pod`` may take whatever the other model pods do: placeable, node rules,
        room for it alone, every key its affinity and spread name, and outside the domains
        the fixed pods' anti-affinity (either way) closes to it."""
        state = self.state
        labels_of = pod.label_map
        closed = {(k, v) for t, k, v in self.guards if t.matches(pod.namespace, labels_of)}
        for t in pod.pod_anti_affinity:
            for other, node in self.fixed(t.selector):
                value = self.labels[node].get(t.topology_key)
                if value is not None and t.matches(other.namespace, other.label_map):
                    closed.add((t.topology_key, value))
        keys = {t.topology_key for t in pod.pod_affinity} | {c.topology_key for c in pod.spread}
        sig = (pod.tolerations, pod.node_selector, pod.affinity)
        out = []
        for name in self.scope(pod):
            slot = state.nodes[name]
            if not slot.placeable:
                continue
            ok = self._allowed.get((sig, slot.static_id))
            if ok is None:
                ok = self._allowed[(sig, slot.static_id)] = node_rules_allow(pod, slot.node)
            if not ok:
                continue
            labels = self.labels[name]
            if any(k not in labels for k in keys):
                continue
            if closed and any((k, v) in closed for k, v in labels.items()):
                continue
            demand = state.demand_on(pod, slot)
            if demand is None or not slot.fits(demand):
                continue
            if demand.gpu_count and (
                pick_devices(slot.gpu_free, demand.gpu_count, demand.gpu_milli) is None
            ):
                continue
            out.append(name)
        return out


class _Builder:
    """One model over ``gangs`` on the free state of ``ctx`` (model pods released)."""

    def __init__(
        self,
        ctx: _Context,
        gangs: Sequence[GangRequest],
        hint: Mapping[str, str],
        hint_order: Sequence[str],
        cand: Mapping[str, list[str]] | None = None,
    ) -> None:
        self.ctx = ctx
        self.state = ctx.state
        self.gangs = list(gangs)
        from ortools.sat.python import cp_model  # deferred: OR-Tools costs 0.16 s to import

        self.m = cp_model.CpModel()
        self.labels = ctx.labels
        self.pods: list[Pod] = []
        self.gang_of: list[int] = []
        self.required: list[bool] = []
        for gi, g in enumerate(self.gangs):
            for p in g.required:
                self.pods.append(p)
                self.gang_of.append(gi)
                self.required.append(True)
            for p in g.extras:
                self.pods.append(p)
                self.gang_of.append(gi)
                self.required.append(False)
        self.hint = hint
        self.cand: list[list[str]] = [
            cand[p.uid] if cand is not None else ctx.candidates(p) for p in self.pods
        ]
        self.x: list[dict[str, cp_model.IntVar]] = [
            {n: self.m.new_bool_var(f"x{i}_{n}") for n in nodes}
            for i, nodes in enumerate(self.cand)
        ]
        self.placed: list[cp_model.LinearExprT] = [sum(row.values()) for row in self.x]
        self.order_terms = 0
        self._z: dict[tuple[int, str, str, frozenset[str] | None], cp_model.IntVar | None] = {}
        self._before: dict[tuple[int, int], cp_model.IntVar] = {}
        self._w: dict[tuple[int, int, str, str, frozenset[str] | None], cp_model.IntVar] = {}
        self._eligible: dict[object, frozenset[str]] = {}
        n_gangs = len(self.gangs)
        self.gpos = [self.m.new_int_var(0, max(0, n_gangs - 1), f"g{i}") for i in range(n_gangs)]
        self.ipos: list[cp_model.IntVar] = []
        for i, p in enumerate(self.pods):
            g = self.gangs[self.gang_of[i]]
            n_req = len(g.required)
            lo, hi = (0, n_req - 1) if self.required[i] else (n_req, n_req + len(g.extras) - 1)
            self.ipos.append(self.m.new_int_var(lo, hi, f"i{i}_{p.name}"))
        rank = {key: k for k, key in enumerate(hint_order)}
        self.gang_rank = [rank.get(g.key, len(rank) + gi) for gi, g in enumerate(self.gangs)]

    # --- helpers --------------------------------------------------------------------------

    def z(
        self, i: int, key: str, value: str, within: frozenset[str] | None = None
    ) -> cp_model.IntVar | None:
        """A boolean: pod ``i`` is on a node with ``key=value`` (among ``within``); None when
        none of its candidates is."""
        memo = (i, key, value, within)
        if memo in self._z:
            return self._z[memo]
        lits = [
            v
            for n, v in self.x[i].items()
            if self.labels[n].get(key) == value and (within is None or n in within)
        ]
        got: cp_model.IntVar | None = None
        if len(lits) == 1:
            got = lits[0]
        elif lits:
            got = self.m.new_bool_var(f"z{i}_{key}_{value}")
            self.m.add(sum(lits) == got)
        self._z[memo] = got
        return got

    def before(self, q: int, p: int) -> cp_model.LiteralT:
        """Whether pod ``q`` is placed before pod ``p`` (a literal, or a constant)."""
        gq, gp = self.gang_of[q], self.gang_of[p]
        if gq == gp and self.required[q] != self.required[p]:
            return self.required[q]  # required pods come before their gang's extras
        a, b, pos = (
            (min(gq, gp), max(gq, gp), self.gpos)
            if gq != gp
            else (
                min(q, p),
                max(q, p),
                self.ipos,
            )
        )
        key = (a, b) if gq != gp else (-1 - a, -1 - b)
        lit = self._before.get(key)
        if lit is None:
            self._grow()
            lit = self._before[key] = self.m.new_bool_var(f"b{key}")
            self.m.add(pos[a] < pos[b]).only_enforce_if(lit)
            self.m.add(pos[a] > pos[b]).only_enforce_if(~lit)
        first = gq if gq != gp else q
        return lit if first == a else ~lit

    def seen_in(
        self, q: int, p: int, key: str, value: str, within: frozenset[str] | None = None
    ) -> cp_model.IntVar | None:
        """A boolean: ``q`` is placed before ``p`` on a node with ``key=value`` (among
        ``within``); None when it cannot be."""
        z = self.z(q, key, value, within)
        if z is None:
            return None
        b = self.before(q, p)
        if b is True:
            return z
        if b is False:
            return None
        memo = (q, p, key, value, within)
        got = self._w.get(memo)
        if got is None:
            self._grow()
            got = self._w[memo] = self.m.new_bool_var(f"w{q}_{p}_{key}_{value}")
            self.m.add_bool_and([b, z]).only_enforce_if(got)
            self.m.add_bool_or([~b, ~z, got])
        return got

    def _grow(self) -> None:
        self.order_terms += 1
        if self.order_terms > MAX_ORDER_TERMS:
            raise _TooBig

    def domains_of(self, i: int, key: str) -> list[str]:
        return sorted({self.labels[n][key] for n in self.cand[i] if key in self.labels[n]})

    def eligible(self, pod: Pod, c: SpreadConstraint) -> frozenset[str]:
        """The nodes a spread constraint of ``pod`` counts (as PodTopology's eligible nodes:
        every constraint's key; node selector and own affinity unless the policy ignores
        them; taints when the policy honours them)."""
        keys = tuple(sorted({x.topology_key for x in pod.spread}))
        sig = spread_eligibility_key(pod, c, keys)
        got = self._eligible.get(sig)
        if got is not None:
            return got
        nodes = ((name, slot.node.taints) for name, slot in self.state.nodes.items())
        got = self._eligible[sig] = spread_eligible_nodes(pod, c, keys, nodes, self.labels)
        return got

    # --- rows -----------------------------------------------------------------------------

    def capacity(self) -> None:
        state = self.state
        on_node: dict[str, list[int]] = {}
        for i, nodes in enumerate(self.cand):
            for n in nodes:
                on_node.setdefault(n, []).append(i)
        for n, idx in on_node.items():
            slot = state.nodes[n]
            rows: dict[str, list[tuple[cp_model.IntVar, int]]] = {}
            milli: list[tuple[cp_model.IntVar, int]] = []
            whole: list[tuple[cp_model.IntVar, int]] = []
            for i in idx:
                demand = state.demand_on(self.pods[i], slot)
                assert demand is not None  # a candidate: it fits
                for r, v in demand.requests.items():
                    if v > 0:
                        rows.setdefault(r, []).append((self.x[i][n], v))
                if demand.gpu_count:
                    milli.append((self.x[i][n], demand.gpu_count * demand.gpu_milli))
                    if demand.whole_gpus:
                        whole.append((self.x[i][n], demand.gpu_count))
            for r, terms in rows.items():
                if sum(v for _, v in terms) > slot.free.get(r, 0):
                    self.m.add(sum(v * lit for lit, v in terms) <= slot.free.get(r, 0))
            if milli and sum(v for _, v in milli) > sum(slot.gpu_free):
                self.m.add(sum(v * lit for lit, v in milli) <= sum(slot.gpu_free))
            free_whole = sum(1 for f in slot.gpu_free if f >= GPU_MILLI)
            if whole and sum(v for _, v in whole) > free_whole:
                self.m.add(sum(v * lit for lit, v in whole) <= free_whole)

    def gangs_and_queues(
        self, book: QueueBook, problem: Problem
    ) -> tuple[list[cp_model.IntVar | int], list[ModelGang]]:
        """``y`` per gang (1 for a gang with no required pod left), all or none, extras only
        with their gang, and the queue rows."""
        y: list[cp_model.IntVar | int] = []
        for gi, g in enumerate(self.gangs):
            y.append(self.m.new_bool_var(f"y{gi}") if g.required else 1)
        for i in range(len(self.pods)):
            yi = y[self.gang_of[i]]
            if self.required[i]:
                self.m.add(self.placed[i] == yi)
            elif not isinstance(yi, int):
                self.m.add(self.placed[i] <= yi)
        # Queue rows over gangs (their required ask) and extras (each on its own, as the
        # greedy charges them).
        items: list[ModelGang] = []
        lits: list[cp_model.LinearExprT] = []
        model_gangs: list[ModelGang] = []
        for gi, g in enumerate(self.gangs):
            if g.required:
                mg = model_gang(g, False)
                items.append(mg)
                model_gangs.append(mg)
                lits.append(y[gi])
        for i, p in enumerate(self.pods):
            if not self.required[i]:
                g = self.gangs[self.gang_of[i]]
                ask = pod_queue_usage(p)
                one = GangRequest(g.key, g.queue, g.priority, g.preemptible, (p,), (), ask)
                items.append(ModelGang(one, False, 0, work_units(ask), ask))
                lits.append(self.placed[i])
        tree = problem.snapshot.queue_tree
        for _, terms, cap in queue_rows(items, tree, problem.report, book.charged, book.pinned):
            self.m.add(sum(v * lits[k] for k, v in terms) <= cap)
        return y, model_gangs

    def anti_affinity(self) -> None:
        done: set[tuple[int, int, str, str]] = set()
        for p, pod in enumerate(self.pods):
            for t in pod.pod_anti_affinity:
                for q, other in enumerate(self.pods):
                    if q == p or not t.matches(other.namespace, other.label_map):
                        continue
                    shared = set(self.domains_of(p, t.topology_key))
                    shared &= set(self.domains_of(q, t.topology_key))
                    for v in sorted(shared):
                        key = (min(p, q), max(p, q), t.topology_key, v)
                        if key in done:
                            continue
                        done.add(key)
                        zp, zq = self.z(p, t.topology_key, v), self.z(q, t.topology_key, v)
                        if zp is not None and zq is not None:
                            self.m.add(zp + zq <= 1)

    def affinity(self) -> None:
        for p, pod in enumerate(self.pods):
            terms = pod.pod_affinity
            if not terms or not self.cand[p]:
                continue
            self._affinity_of(p, pod, terms)

    def _affinity_of(self, p: int, pod: Pod, terms: tuple[PodAffinityTerm, ...]) -> None:
        def matches_all(other: Pod) -> bool:
            return all(t.matches(other.namespace, other.label_map) for t in terms)

        fixed: Counter[tuple[str, str]] = Counter()
        anchored = next((t.selector for t in terms if t.selector is not None), None)
        for other, node in self.ctx.fixed(anchored):
            if matches_all(other):
                here = self.labels[node]
                for t in terms:
                    if t.topology_key in here:
                        fixed[(t.topology_key, here[t.topology_key])] += 1
        support = [q for q, other in enumerate(self.pods) if q != p and matches_all(other)]
        root: cp_model.IntVar | None = None
        if not fixed and matches_all(pod):
            root = self.m.new_bool_var(f"root{p}")
            term_keys = {t.topology_key for t in terms}
            for q in support:
                keyed = [v for n, v in self.x[q].items() if term_keys & self.labels[n].keys()]
                if not keyed:
                    continue
                b = self.before(q, p)
                if b is False:
                    continue
                # the first of the group: no pod matching its terms is placed before it
                row = self.m.add(root + sum(keyed) <= 1)
                if b is not True:
                    row.only_enforce_if(b)
        for t in terms:
            for v in self.domains_of(p, t.topology_key):
                if fixed[(t.topology_key, v)] > 0:
                    continue
                zp = self.z(p, t.topology_key, v)
                if zp is None:
                    continue
                seen = [
                    w for q in support if (w := self.seen_in(q, p, t.topology_key, v)) is not None
                ]
                extra = [root] if root is not None else []
                if not seen and not extra:
                    self.m.add(zp == 0)
                else:
                    self.m.add(zp <= sum(seen) + sum(extra))

    def spread(self) -> None:
        for p, pod in enumerate(self.pods):
            if not self.cand[p]:
                continue
            for c in pod.spread:
                self._spread_of(p, pod, c)

    def _spread_of(self, p: int, pod: Pod, c: SpreadConstraint) -> None:
        key = c.topology_key
        eligible = self.eligible(pod, c)
        domains = sorted({self.labels[n][key] for n in eligible})

        def counted(other: Pod) -> bool:
            return (
                not other.deleting
                and other.namespace == pod.namespace
                and c.matches(other.label_map)
            )

        fixed: Counter[str] = Counter(
            self.labels[node][key]
            for other, node in self.ctx.fixed(c.selector)
            if node in eligible and counted(other)
        )
        others = [q for q, other in enumerate(self.pods) if q != p and counted(other)]
        room = c.max_skew - (1 if c.matches(pod.label_map) else 0)

        def count(d: str) -> tuple[int, list[cp_model.IntVar]]:
            seen = [w for q in others if (w := self.seen_in(q, p, key, d, eligible)) is not None]
            return fixed[d], seen

        low_zero = len(domains) < c.min_domains
        counts = {d: count(d) for d in sorted(set(domains) | set(self.domains_of(p, key)))}
        for d in self.domains_of(p, key):
            zp = self.z(p, key, d)
            if zp is None:
                continue
            base, seen = counts[d]
            if low_zero:
                if base > room:
                    self.m.add(zp == 0)
                elif base + len(seen) > room:
                    self.m.add(base + sum(seen) <= room).only_enforce_if(zp)
                continue
            for d2 in domains:
                if d2 == d:
                    continue
                base2, seen2 = counts[d2]
                if base + len(seen) - base2 <= room:
                    continue  # holds whatever is placed
                self.m.add(base + sum(seen) - base2 - sum(seen2) <= room).only_enforce_if(zp)

    def orders(self) -> None:
        if len(self.gangs) > 1:
            self.m.add_all_different(self.gpos)
        by_gang: dict[int, list[cp_model.IntVar]] = {}
        for i, v in enumerate(self.ipos):
            by_gang.setdefault(self.gang_of[i], []).append(v)
        for vs in by_gang.values():
            if len(vs) > 1:
                self.m.add_all_different(vs)

    def add_hints(self, y: Sequence[cp_model.IntVar | int]) -> None:
        for i, p in enumerate(self.pods):
            where = self.hint.get(p.uid)
            for n, v in self.x[i].items():
                self.m.add_hint(v, n == where)
        for gi, g in enumerate(self.gangs):
            yi = y[gi]
            if not isinstance(yi, int):
                self.m.add_hint(yi, all(p.uid in self.hint for p in g.required))
        for gi, rank in enumerate(sorted(range(len(self.gangs)), key=self.gang_rank.__getitem__)):
            self.m.add_hint(self.gpos[rank], gi)
        counters: Counter[int] = Counter()
        for extras in (False, True):  # a gang's required pods first, then its extras
            for i in range(len(self.pods)):
                if self.required[i] != extras:
                    gang = self.gang_of[i]
                    self.m.add_hint(self.ipos[i], counters[gang])
                    counters[gang] += 1


def solve_ruled(
    snapshot: Snapshot,
    problem: Problem,
    gangs: Sequence[GangRequest],
    state: ClusterState,
    book: QueueBook,
    hint: Mapping[str, str],
    hint_order: Sequence[str],
    *,
    seconds: float,
    ctx: _Context | None = None,
    cand: Mapping[str, list[str]] | None = None,
) -> ExactAnswer | None:
    """The model over ``gangs`` on ``state`` (which must not hold their pods), solved; None
    when it is too big or CP-SAT found nothing. ``hint``: pod uid -> node of a valid answer
    (the greedy's); ``hint_order``: gang keys in that answer's order. ``ctx`` and ``cand``
    (candidates by pod uid), when given, were computed on this ``state``."""
    started = time.perf_counter()
    try:
        b = _Builder(ctx or _Context(state), gangs, hint, hint_order, cand)
        y, model_gangs = b.gangs_and_queues(book, problem)
        b.capacity()
        b.anti_affinity()
        b.affinity()
        b.spread()
        b.orders()
    except _TooBig:
        log.info("ruled_exact_skipped", reason="order terms", limit=MAX_ORDER_TERMS)
        return None
    objective = _objective(b, y, model_gangs, problem, book)
    if objective is None:
        return None
    b.m.maximize(objective)
    b.add_hints(y)
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, seconds)
    # One worker: the answer does not depend on thread timing (these models are tiny).
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    code = solver.solve(b.m)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    chosen: list[tuple[int, int, str]] = []  # (gang position, pod position, node) per pod
    by_gang: dict[int, list[tuple[int, Pod, str]]] = {}
    for i, pod in enumerate(b.pods):
        node = next((n for n, v in b.x[i].items() if solver.boolean_value(v)), None)
        if node is not None:
            by_gang.setdefault(b.gang_of[i], []).append((solver.value(b.ipos[i]), pod, node))
            chosen.append((b.gang_of[i], i, node))
    order = sorted(by_gang, key=lambda gi: (solver.value(b.gpos[gi]), b.gang_rank[gi]))
    out = [
        (b.gangs[gi].key, [(pod, node) for _, pod, node in sorted(by_gang[gi], key=lambda t: t[0])])
        for gi in order
    ]
    return ExactAnswer(out, solver.status_name(code), time.perf_counter() - started)


def _objective(
    b: _Builder,
    y: Sequence[cp_model.IntVar | int],
    model_gangs: Sequence[ModelGang],
    problem: Problem,
    book: QueueBook,
) -> cp_model.LinearExprT | None:
    """Levels, least significant first: pods kept on the greedy's node, pods placed, then
    per tier (lowest priority first) ``K * work within fair share + work``."""
    from ortools.sat.python import cp_model

    m = b.m
    kept = [v for i, p in enumerate(b.pods) for n, v in b.x[i].items() if b.hint.get(p.uid) == n]
    levels: list[tuple[cp_model.LinearExprT, int]] = [
        (sum(kept), len(kept)),
        (sum(b.placed), len(b.pods)),
    ]
    y_of = {g.key: y[gi] for gi, g in enumerate(b.gangs)}
    rooms = fair_rooms(model_gangs, problem.report, book.charged)
    # Fair room is shared by the tiers of a queue: per room, the tiers' parts.
    by_room: dict[tuple[str, str], list[cp_model.IntVar]] = {}
    for prio in sorted({g.request.priority for g in model_gangs}):
        tier = [g for g in model_gangs if g.request.priority == prio]
        work = sum(g.work * y_of[g.request.key] for g in tier)
        work_max = sum(g.work for g in tier)
        fair_terms = []
        fair_max = 0
        for (q, r), room in rooms.items():
            units = [
                (g.units[r], y_of[g.request.key])
                for g in tier
                if g.request.queue == q and g.units[r] > 0
            ]
            if not units:
                continue
            cap = min(room, sum(u for u, _ in units))
            f = m.new_int_var(0, cap, f"fair{prio}_{q}_{r}")
            m.add(f <= sum(u * lit for u, lit in units))
            by_room.setdefault((q, r), []).append(f)
            fair_terms.append(f)
            fair_max += cap
        k = work_max + 1
        levels.append((k * sum(fair_terms) + work, k * fair_max + work_max))
    for key, vs in by_room.items():
        if len(vs) > 1:
            m.add(sum(vs) <= rooms[key])
    weights = []
    weight = 1
    for _, most in levels:
        weights.append(weight)
        weight *= most + 1
        if weight > _MAX_WEIGHT:
            log.info("ruled_exact_skipped", reason="objective weights")
            return None
    return cp_model.LinearExpr.weighted_sum([e for e, _ in levels], weights)


def place_ruled_exactly(
    snapshot: Snapshot,
    problem: Problem,
    ruled: AbstractSet[str],
    state: ClusterState,
    greedy: GreedyResult,
    settings: PlacementSettings,
    cycle: int | None,
) -> GreedyResult:
    """:func:`_place_ruled_exactly`; on any error the greedy's answer, ``state`` holding it
    again (the search is an improvement: its failure must not cost the cycle)."""
    try:
        return _place_ruled_exactly(snapshot, problem, ruled, state, greedy, settings, cycle)
    except Exception:
        log.exception("ruled_exact_failed", cycle=cycle)
        for uid in [uid for uid, a in state.placed.items() if a.gang in ruled]:
            state.release(uid)
        for key, pods in greedy.placed.items():
            if key in ruled:
                for a in pods:
                    state.apply(a)
        return greedy


def _place_ruled_exactly(
    snapshot: Snapshot,
    problem: Problem,
    ruled: AbstractSet[str],
    state: ClusterState,
    greedy: GreedyResult,
    settings: PlacementSettings,
    cycle: int | None,
) -> GreedyResult:
    """The greedy's answer with the ``ruled`` gangs placed by the exact model instead where
    it beats it (see the module docstring); else ``greedy`` itself. ``state`` holds the
    returned answer. ``ruled``: :attr:`~.ruled_gangs.TopologyGangs.ruled`.

    The ruled gangs fall apart into groups that cannot affect each other (no shared
    candidate node, no rule of one selecting a pod of the other, no queue row in common);
    only groups where the greedy left a pod out are solved, each on its own, and each
    group's answer is kept only when it is better by :func:`_better`."""
    gangs = [g for g in problem.order if g.key in ruled]
    model_pods = [p for g in gangs for p in (*g.required, *g.extras)]
    # Pods without a node selector may look at every node: that alone may be too much.
    unselected = sum(1 for p in model_pods if not p.node_selector)
    if (
        not gangs
        or len(model_pods) > MAX_PODS_IN_ALL
        or unselected * len(state.nodes) > MAX_POD_NODES
    ):
        return greedy
    placed_count = {k: len(v) for k, v in greedy.placed.items()}

    def short(g: GangRequest) -> bool:
        return placed_count.get(g.key, 0) < len(g.required) + len(g.extras)

    if not any(short(g) for g in gangs):
        return greedy  # nothing left out: only quality to gain, left to the greedy
    started = time.perf_counter()
    keys = {g.key for g in gangs}
    hint = _greedy_nodes(greedy, keys)
    first = {k: v for k, v in greedy.placed.items() if k in keys}
    for pods in reversed(list(first.values())):
        for a in reversed(pods):
            state.release(a.pod_uid)
    book = QueueBook(snapshot.queue_tree, problem.report)
    pods_by_uid = snapshot.pod_by_uid
    by_key = problem.by_key
    book.charge_many(
        (g.queue, pod_queue_usage(pods_by_uid[a.pod_uid]), g.preemptible)
        for key, done in greedy.placed.items()
        if key not in keys and (g := by_key.get(key)) is not None
        for a in done
        if a.pod_uid in pods_by_uid
    )
    ctx = _Context(state)
    if sum(len(ctx.scope(p)) for p in model_pods) > MAX_POD_NODES:
        log.info("ruled_exact_skipped", cycle=cycle, reason="pods x nodes", pods=len(model_pods))
        return _restore(state, [], first, greedy)
    cand = {p.uid: ctx.candidates(p) for p in model_pods}
    groups = _groups(gangs, cand, problem, book)
    deadline = started + min(MAX_SECONDS, BUDGET_SHARE * settings.time_limit_seconds)
    admitted = set(greedy.placed)
    chosen: dict[int, ExactAnswer] = {}
    for k, group in enumerate(groups):
        left = deadline - time.perf_counter()
        size = sum(len(g.required) + len(g.extras) for g in group)
        if left <= 0.005 or size > MAX_PODS or not any(short(g) for g in group):
            continue
        group_keys = {g.key for g in group}
        try:
            answer = solve_ruled(
                snapshot,
                problem,
                group,
                state,
                book,
                hint,
                [key for key in first if key in group_keys],
                seconds=left,
                ctx=ctx,
                cand=cand,
            )
        except Exception:  # an improvement only: its failure must not cost the cycle
            log.exception("ruled_exact_failed", cycle=cycle)
            continue
        if answer is None:
            continue
        now = (admitted - group_keys) | {key for key, _ in answer.order}
        before = sum(placed_count.get(key, 0) for key in group_keys)
        if _better(problem, admitted, now, before, answer):
            admitted = now
            chosen[k] = answer
    # Apply: the chosen groups' answers, the greedy's placement for the others.
    spread = settings.gpu_strategy == "spread"
    placed = {key: v for key, v in greedy.placed.items() if key not in keys}
    applied: list[PodAssignment] = []
    for k, group in enumerate(groups):
        answer = chosen.get(k)
        got = _apply(state, answer, spread) if answer is not None else None
        if got is None:
            chosen.pop(k, None)
            got = {g.key: first[g.key] for g in group if g.key in first}
            for pods in got.values():
                for a in pods:
                    state.apply(a)
        placed.update(got)
        applied += [a for pods in got.values() for a in pods]
    if not chosen:
        return _restore(state, applied, first, greedy)
    candidate = GreedyResult(placed, {k: v for k, v in greedy.failed.items() if k not in placed})
    violations = validate(snapshot, candidate.assignments)
    if violations:
        log.error("ruled_exact_invalid", cycle=cycle, violations=violations[:20])
        return _restore(state, applied, first, greedy)
    log.info(
        "ruled_gangs_placed_exactly",
        cycle=cycle,
        groups=len(chosen),
        before=sum(len(v) for v in first.values()),
        after=sum(len(v) for key, v in placed.items() if key in keys),
        seconds=round(time.perf_counter() - started, 4),
    )
    return candidate


def _restore(
    state: ClusterState,
    applied: Sequence[PodAssignment],
    first: Mapping[str, Sequence[PodAssignment]],
    greedy: GreedyResult,
) -> GreedyResult:
    """Put ``state`` back to the greedy's placement of the ruled gangs; return it."""
    for a in reversed(applied):
        state.release(a.pod_uid)
    for pods in first.values():
        for a in pods:
            state.apply(a)
    return greedy


def _groups(
    gangs: Sequence[GangRequest],
    cand: Mapping[str, Sequence[str]],
    problem: Problem,
    book: QueueBook,
) -> list[list[GangRequest]]:
    """``gangs`` in groups that cannot affect each other, each in the order given: gangs
    are joined when their pods share a candidate node, a rule of one selects a pod of the
    other (anti-affinity, affinity or spread, either way), or a queue row holds both."""
    parent = list(range(len(gangs)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def join(i: int, j: int) -> None:
        a, b = find(i), find(j)
        if a != b:
            parent[max(a, b)] = min(a, b)

    pods = [(gi, p) for gi, g in enumerate(gangs) for p in (*g.required, *g.extras)]
    on_node: dict[str, int] = {}
    carrying: dict[tuple[str, str], list[tuple[int, Pod]]] = {}
    for gi, p in pods:
        for n in cand[p.uid]:
            join(gi, on_node.setdefault(n, gi))
        for kv in p.labels:
            carrying.setdefault(kv, []).append((gi, p))
    for gi, p in pods:
        rules: list[tuple[LabelSelector | None, PodAffinityTerm | None]] = [
            (t.selector, t) for t in (*p.pod_affinity, *p.pod_anti_affinity)
        ]
        rules += [(c.selector, None) for c in p.spread]
        for selector, term in rules:
            if selector is None:
                continue
            anchor = selector.anchor
            for gj, q in pods if anchor is None else carrying.get(anchor, ()):
                if term is not None:
                    hit = term.matches(q.namespace, q.label_map)
                else:
                    hit = q.namespace == p.namespace and selector.matches(q.label_map)
                if hit:
                    join(gi, gj)
    # Queue rows: gangs by their required ask, extras each on its own (as the models count
    # them); ``owner`` maps a row item to its gang.
    items = [model_gang(g, False) for g in gangs]
    owner = list(range(len(gangs)))
    for gi, g in enumerate(gangs):
        for p in g.extras:
            ask = pod_queue_usage(p)
            one = GangRequest(g.key, g.queue, g.priority, g.preemptible, (p,), (), ask)
            items.append(ModelGang(one, False, 0, work_units(ask), ask))
            owner.append(gi)
    tree = problem.snapshot.queue_tree
    for _, terms, _ in queue_rows(items, tree, problem.report, book.charged, book.pinned):
        for i, _ in terms[1:]:
            join(owner[terms[0][0]], owner[i])
    out: dict[int, list[GangRequest]] = {}
    for gi, g in enumerate(gangs):
        out.setdefault(find(gi), []).append(g)
    return list(out.values())


def _better(
    problem: Problem,
    admitted: AbstractSet[str],
    now: AbstractSet[str],
    pods_before: int,
    answer: ExactAnswer,
) -> bool:
    """``now`` admits more than ``admitted`` by :func:`~.hybrid.admission_key`, or as much
    with more pods placed (``pods_before``: the greedy's, of the answer's gangs)."""
    before = admission_key(problem, set(admitted))
    after = admission_key(problem, set(now))
    if after != before:
        return after > before
    return sum(len(v) for _, v in answer.order) > pods_before


def _apply(
    state: ClusterState, answer: ExactAnswer, spread: bool
) -> dict[str, list[PodAssignment]] | None:
    """Apply the answer to ``state`` in its order, devices from the default packer
    (``spread``: the emptiest devices); None (and ``state`` as it was) when a pod does not
    fit after all."""
    out: dict[str, list[PodAssignment]] = {}
    done: list[PodAssignment] = []
    for key, pods in answer.order:
        for pod, node in pods:
            grant = state.grant_for(pod, node, spread=spread)
            if grant is None:
                for a in reversed(done):
                    state.release(a.pod_uid)
                return None
            a = PodAssignment(pod.uid, pod.key, key, node, grant)
            state.apply(a, pod)
            done.append(a)
            out.setdefault(key, []).append(a)
    return out
