"""An exact, pod-level search for the gangs whose placement depends on where pods run, when
the instance is small: :func:`place_ruled_exactly`.

The greedy places pods one after another and never revisits a node choice; a pod with
anti-affinity that took the node another pod needed, or a spread count raised in the wrong
rack, can leave a pod out that another choice would have placed. The aggregated CP-SAT model
(:mod:`.cpsat`) counts pods per node class and cannot see domains, so these gangs
(:attr:`~.ruled_gangs.TopologyGangs.ruled`) keep the greedy's placement there. Here they get
a model of their own, one boolean per (pod, node), built in parts:

- :mod:`.exact_context`: the nodes' labels, the fixed pods and each pod's candidate nodes;
- :mod:`.exact_model`: the variables and rows (capacity, gangs whole, queues, anti-affinity,
  affinity and spread in a placement order);
- :mod:`.exact_solve`: the objective, CP-SAT and the answer (:func:`solve_ruled`);
- this module: when to search, the groups of gangs that cannot affect each other, and
  applying an answer that beats the greedy's.

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
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet

import structlog

from scheduler.cluster.pod import Pod
from scheduler.cluster.podaffinity import LabelSelector, PodAffinityTerm
from scheduler.cluster.queue import pod_queue_usage
from scheduler.cluster.snapshot import Snapshot
from scheduler.solver.exact_context import ExactContext
from scheduler.solver.exact_model import MAX_ORDER_TERMS
from scheduler.solver.exact_solve import ExactAnswer, solve_ruled
from scheduler.solver.greedy import GangRequest, GreedyResult
from scheduler.solver.hybrid import admission_key, model_gang
from scheduler.solver.placement import PlacementSettings, PodAssignment
from scheduler.solver.problem import Problem
from scheduler.solver.queues import QueueBook
from scheduler.solver.rows import ModelGang, queue_rows, work_units
from scheduler.solver.state import ClusterState
from scheduler.solver.validate import validate

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
#: Seconds for the whole search of a cycle at most, and at most this share of the cycle's
#: ``time_limit_seconds`` (0.2 s with the default 0.5 s).
MAX_SECONDS = 0.25
BUDGET_SHARE = 0.4


def _greedy_nodes(greedy: GreedyResult, keys: AbstractSet[str]) -> dict[str, str]:
    return {a.pod_uid: a.node for k, pods in greedy.placed.items() if k in keys for a in pods}


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
    ctx = ExactContext(state)
    if sum(len(ctx.scope(p)) for p in model_pods) > MAX_POD_NODES:
        log.info("ruled_exact_skipped", cycle=cycle, reason="pods x nodes", pods=len(model_pods))
        return _restore(state, [], first, greedy)
    cand = {p.uid: ctx.candidates(p) for p in model_pods}

    def can_gain(g: GangRequest) -> bool:
        # A model places a pod only on a candidate node: a gang with a required pod that has
        # none stays out whatever the model does, and so does an extra without one. Groups
        # with nothing to gain are not solved - a cycle with many pods that fit nowhere
        # (a selector no node matches) would otherwise spend the budget on them.
        if not short(g) or any(not cand[p.uid] for p in g.required):
            return False
        return g.key not in greedy.placed or any(cand[p.uid] for p in g.extras)

    groups = _groups(gangs, cand, problem, book)
    deadline = started + min(MAX_SECONDS, BUDGET_SHARE * settings.time_limit_seconds)
    admitted = set(greedy.placed)
    chosen: dict[int, ExactAnswer] = {}
    for k, group in enumerate(groups):
        left = deadline - time.perf_counter()
        size = sum(len(g.required) + len(g.extras) for g in group)
        if left <= 0.005 or size > MAX_PODS or not any(can_gain(g) for g in group):
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
