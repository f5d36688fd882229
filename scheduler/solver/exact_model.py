"""The pod-level CP-SAT model of the exact search (:mod:`.cpsat_topology`):
:class:`ExactModel`, one boolean per (pod, candidate node) over the pending pods of a group of
ruled gangs (extras included), and its rows:

- ``x[p, n]`` for each pod over its candidates (:meth:`.ExactContext.candidates`);
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

The greedy's placement is the hint (:meth:`ExactModel.add_hints`). A model that needs more
than :data:`MAX_ORDER_TERMS` order helpers raises :class:`ModelTooBig` while it is built.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from scheduler.cluster.node import GPU_MILLI
from scheduler.cluster.pod import Pod
from scheduler.cluster.podaffinity import PodAffinityTerm, SpreadConstraint
from scheduler.cluster.queue import pod_queue_usage
from scheduler.plugins.podtopology import spread_eligibility_key, spread_eligible_nodes
from scheduler.solver.exact_context import ExactContext
from scheduler.solver.greedy import GangRequest
from scheduler.solver.hybrid import model_gang
from scheduler.solver.problem import Problem
from scheduler.solver.queues import QueueBook
from scheduler.solver.rows import ModelGang, queue_rows, work_units

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

__all__ = ["MAX_ORDER_TERMS", "ExactModel", "ModelTooBig"]

#: Order helpers (``before`` pairs and "before and in domain" booleans) at most.
MAX_ORDER_TERMS = 20000


class ModelTooBig(Exception):
    """The model outgrew :data:`MAX_ORDER_TERMS` while it was built."""


class ExactModel:
    """One model over ``gangs`` on the free state of ``ctx`` (model pods released)."""

    def __init__(
        self,
        ctx: ExactContext,
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
            raise ModelTooBig

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
