"""Gangs whose placement depends on where pods run (pod (anti-)affinity, topology spread,
preferences): which they are (:func:`topology_gang_sets`), a second greedy pass for them on
the emptiest nodes when the first left one out (:func:`place_ruled_again`), and the CP-SAT
stage run around the greedy's placement of them (:func:`improve_around`), since the model
counts pods per node class and cannot see domains. Used by :func:`.solve.solve`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import structlog

from scheduler.cluster.pod import Pod
from scheduler.cluster.podaffinity import HOSTNAME_LABEL, PodAffinityTerm, SpreadConstraint
from scheduler.cluster.snapshot import Snapshot
from scheduler.framework.scoring import NodeScorer
from scheduler.plugins.packing import PackingScorer
from scheduler.solver.cpsat import CpResult
from scheduler.solver.greedy import GreedyResult, place_gangs
from scheduler.solver.hybrid import admission_key, current_classes, improve
from scheduler.solver.patterns import ClassInfo
from scheduler.solver.placement import PlacementSettings, PodAssignment
from scheduler.solver.problem import Problem
from scheduler.solver.queues import QueueBook
from scheduler.solver.state import ClusterState

__all__ = [
    "RETRY_RULED_GANGS",
    "TopologyGangs",
    "improve_around",
    "place_ruled_again",
    "topology_gang_sets",
    "topology_gangs",
]

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class TopologyGangs:
    """The placeable gangs whose placement depends on where pods run, found in one pass.

    ``ruled``: a pod of the gang has pod (anti-)affinity or spread rules or preferences, or
    a rule selects one (a running pod's anti-affinity, a pending pod's rule).
    ``left_to_greedy``: those of them the CP-SAT stage must leave as the greedy placed them -
    all but the gangs the model expresses itself: whose only rule keeps their own pods one
    per node (anti-affinity on the hostname that selects the gang's pods and no other pod,
    running or pending), and that no other rule selects.
    """

    ruled: frozenset[str]
    left_to_greedy: frozenset[str]


def topology_gang_sets(snapshot: Snapshot, problem: Problem) -> TopologyGangs:
    """Both sets of :class:`TopologyGangs`, from one pass over the rules of the cycle."""
    pending = [(g.key, p) for g in problem.order for p in (*g.required, *g.extras)]
    running = [p for p in snapshot.pods if p.bound and p.active]
    # (owner gang, or "" for a running pod; the rule)
    rules: list[tuple[str, PodAffinityTerm | tuple[SpreadConstraint, str]]] = []
    seen: set[object] = set()
    for key, p in pending:
        for t in (*p.pod_affinity, *p.pod_anti_affinity):
            if (key, t) not in seen:
                seen.add((key, t))
                rules.append((key, t))
        for c in p.spread:
            if (key, c, p.namespace) not in seen:
                seen.add((key, c, p.namespace))
                rules.append((key, (c, p.namespace)))
    for p in running:
        for t in p.pod_anti_affinity:
            if ("", t) not in seen:
                seen.add(("", t))
                rules.append(("", t))
    if not rules:
        alone = frozenset(key for key, p in pending if p.preferences is not None)
        return TopologyGangs(alone, alone)
    carrying: dict[tuple[str, str], list[tuple[str, Pod]]] = {}
    everyone = [*pending, *(("", p) for p in running)]
    for key, p in everyone:
        for kv in p.labels:
            carrying.setdefault(kv, []).append((key, p))
    # Preferences are chosen by the greedy's filter-aware search too (and need no rule).
    ruled = {key for key, p in pending if p.topology_rules or p.preferences is not None}
    # gang -> owners of the rules that select its pods; owner -> gangs ("" running) selected
    selected_by: dict[str, set[str]] = {}
    selects: dict[str, set[str]] = {}
    for owner, rule in rules:
        selector = rule.selector if isinstance(rule, PodAffinityTerm) else rule[0].selector
        if selector is None:
            continue
        anchor = selector.anchor
        candidates = everyone if anchor is None else carrying.get(anchor, [])
        for key, p in candidates:
            labels = p.label_map
            if isinstance(rule, PodAffinityTerm):
                hit = rule.matches(p.namespace, labels)
            else:
                hit = p.namespace == rule[1] and rule[0].matches(labels)
            if hit:
                selects.setdefault(owner, set()).add(key)
                if key:
                    selected_by.setdefault(key, set()).add(owner)
    ruled.update(selected_by)

    def modelled(key: str, pods: Sequence[Pod]) -> bool:
        own_rules_only = all(
            p.preferences is None
            and not p.pod_affinity
            and not p.spread
            and all(
                t.topology_key == HOSTNAME_LABEL and t.matches(p.namespace, p.label_map)
                for t in p.pod_anti_affinity
            )
            for p in pods
        )
        return (
            own_rules_only
            and selects.get(key, set()) <= {key}
            and selected_by.get(key, set()) <= {key}
        )

    by_gang = {g.key: (*g.required, *g.extras) for g in problem.order}
    return TopologyGangs(
        frozenset(ruled), frozenset(key for key in ruled if not modelled(key, by_gang[key]))
    )


def topology_gangs(snapshot: Snapshot, problem: Problem, *, expressed: bool = False) -> set[str]:
    """Keys of the placeable gangs the CP-SAT stage must leave as the greedy placed them
    (:attr:`TopologyGangs.left_to_greedy`); with ``expressed``, also those the model
    expresses itself (:attr:`TopologyGangs.ruled`)."""
    found = topology_gang_sets(snapshot, problem)
    return set(found.ruled if expressed else found.left_to_greedy)


#: At most this many gangs with topology rules get a second placement pass in a cycle.
RETRY_RULED_GANGS = 256


def place_ruled_again(
    snapshot: Snapshot,
    problem: Problem,
    ruled: AbstractSet[str],
    state: ClusterState,
    greedy: GreedyResult,
    cycle: int | None,
) -> GreedyResult:
    """A second try for the gangs whose placement depends on where pods run, when the first
    left one of them out: the same gangs, in the same order, placed again on the emptiest
    nodes first (least allocated, kube-scheduler's default) around the other gangs' places.
    ``ruled`` is every gang with such rules (:attr:`TopologyGangs.ruled`).

    Packing puts the first pod of a group where it leaves the least room; a later pod that
    must join it (affinity), or stay out of its domain (anti-affinity), or balance it
    (spread) may then find no node that an emptier choice would have left. The answer kept
    is the better one by :func:`~.hybrid.admission_key` (priority, fair-share work, all
    work); ``state`` holds it on return. Skipped beyond :data:`RETRY_RULED_GANGS` such
    gangs: the second pass costs as much as their first (0.5 s for 600 gangs on the
    5,000-node bench, where it never found a better answer).
    """
    if len(ruled) > RETRY_RULED_GANGS or not any(
        g.key in ruled and g.key not in greedy.placed for g in problem.order
    ):
        return greedy
    order = [g for g in problem.order if g.key in ruled]
    first = {k: v for k, v in greedy.placed.items() if k in ruled}
    for pods in reversed(list(first.values())):
        for a in reversed(pods):
            state.release(a.pod_uid)
    book = QueueBook(snapshot.queue_tree, problem.report)
    gangs = problem.by_key
    book.charge_many(
        (g.queue, g.ask, g.preemptible)
        for key in greedy.placed
        if key not in ruled and (g := gangs.get(key)) is not None
    )
    second = place_gangs(
        state, order, PackingScorer("spread", "spread"), book=book, spread_devices=True, cycle=cycle
    )
    others = {k for k in greedy.placed if k not in ruled}
    if admission_key(problem, others | set(second.placed)) > admission_key(
        problem, set(greedy.placed)
    ):
        log.info(
            "ruled_gangs_placed_again", cycle=cycle, before=len(first), after=len(second.placed)
        )
        placed = {k: v for k, v in greedy.placed.items() if k not in ruled}
        placed.update(second.placed)
        failed = {k: v for k, v in greedy.failed.items() if k not in ruled}
        failed.update(second.failed)
        return GreedyResult(placed, failed)
    for a in reversed(second.assignments):
        state.release(a.pod_uid)
    for pods in first.values():
        for a in pods:
            state.apply(a)
    return greedy


def improve_around(
    snapshot: Snapshot,
    problem: Problem,
    ruled: AbstractSet[str],
    state: ClusterState,
    initial: list[ClassInfo],
    greedy: GreedyResult,
    scorer: NodeScorer,
    settings: PlacementSettings,
    cycle: int | None,
    place_skipped: Callable[[], GreedyResult] | None = None,
) -> tuple[CpResult | None, list[PodAssignment] | None, str]:
    """:func:`~.hybrid.improve` for the gangs without topology rules, around the greedy's
    placement of the ``ruled`` ones (kept as placed, first in the returned order).
    ``place_skipped``: as :func:`~.hybrid.improve` takes it (only without ruled gangs).

    The CP-SAT model counts pods per node class and cannot see which pods run in which
    domain, so gangs whose placement depends on that (:attr:`TopologyGangs.left_to_greedy`)
    keep the greedy's sequential, filter-checked placement; the other gangs match no rule,
    so moving them cannot break one.
    """
    if not ruled:
        return improve(
            snapshot, problem, state, initial, greedy, scorer, settings, cycle, place_skipped
        )
    pinned = [a for key, pods in greedy.placed.items() if key in ruled for a in pods]
    rest = GreedyResult(
        {k: v for k, v in greedy.placed.items() if k not in ruled},
        {k: v for k, v in greedy.failed.items() if k not in ruled},
    )
    movable = rest.assignments
    for a in reversed(movable):
        state.release(a.pod_uid)
    around = current_classes(state)  # free capacity with the ruled gangs placed
    for a in movable:
        state.apply(a)
    cp, found, engine = improve(snapshot, problem, state, around, rest, scorer, settings, cycle)
    if found is None:
        return cp, None, engine
    return cp, [*pinned, *found], engine
