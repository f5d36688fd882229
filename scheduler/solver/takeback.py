"""Taking back: evict running work so a pending gang fits (reclaim, preemption, consolidation,
elastic shrink).

Runs after placement, on the gangs placement left out, in admission order (priority, then
fairness), at most ``take_back_gangs`` per cycle. For each gang one CP-SAT model over the
nodes that could host it:

- columns: ``x[n, s]`` pods of the gang's shape ``s`` on node ``n``; ``e[u]`` evict unit
  ``u`` (:mod:`.victims`: a whole running gang, or one elastic pod beyond minMember);
  ``m[u]`` move unit ``u`` (consolidation: evicted and placed again in this model, on
  columns ``y[n, u, s]``);
- rows: every pod of the gang placed; per node and resource, what is placed fits in what is
  free plus what evicted or moved units free there; whole GPUs only on devices that are
  free or freed entirely (``w[d]``), shares within the freed thousandths; a unit is evicted
  or moved or kept, a shrink never together with its whole gang; PodDisruptionBudgets; per
  victim branch of the queue tree, what is reclaimed stays within its excess over fair
  share; moved pods at most ``consolidation_max_pods`` per cycle;
- objective (minimise): whole gangs evicted, lower priority first; then GPU-seconds lost
  (:meth:`.victims.Unit.work`). Moves cost their GPU-seconds only, so moving a pod is
  preferred to evicting a gang, and shrinking an elastic gang to minMember to either.

The model is solved with a hint from the greedy choice (cheapest units first, then the
ones not needed dropped) and falls back to it. The chosen pods are placed on a
:class:`ClusterState` with real device grants; a gang whose pods do not pack after all is
left for the next cycle. Everything returned is checked again by
:func:`scheduler.solver.validate.validate_evictions`.

This module runs the stage gang by gang; the greedy choice is :mod:`.takeback_greedy`, the
model :mod:`.takeback_model`, and carrying a choice out (placements, eviction records)
:mod:`.takeback_apply`.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import structlog

from scheduler.cluster.pod import Pod
from scheduler.cluster.podspec import is_extended_resource
from scheduler.cluster.snapshot import Snapshot
from scheduler.fairness import FairShareReport
from scheduler.fairness.admission import OVER_QUOTA
from scheduler.framework.scoring import NodeScorer
from scheduler.solver.greedy import GangRequest, place_gangs
from scheduler.solver.placement import Eviction, PlacementSettings, PodAssignment
from scheduler.solver.queues import QueueBook
from scheduler.solver.state import ClusterState
from scheduler.solver.takeback_apply import apply_choice, eviction_records
from scheduler.solver.takeback_greedy import UnitIndex
from scheduler.solver.takeback_model import solve_gang, unit_costs
from scheduler.solver.victim_prospects import (
    free_total,
    lowest_running_priority,
    may_evict_for,
    room_anywhere,
)
from scheduler.solver.victims import Unit, actions_for, build_units, may_evict

__all__ = ["TakeBack", "take_back"]

log = structlog.get_logger(__name__)

#: The least part of the cycle's time limit the stage gets, whatever placement used of it
#: (0.1 s of the default 0.5 s). The first gang is tried in any case; this is room for more.
#: At 0.2 s it let a second gang start on the 5,000-node benchmark once the first one's model
#: took 0.05 s, which put every such cycle 0.1 s further over its budget.
MIN_BUDGET_SHARE = 0.2

#: Below this much left of the stage's budget a gang's victims are chosen by the greedy alone
#: (:mod:`.takeback_greedy`), without building its CP-SAT model (:mod:`.takeback_model`).
MIN_MODEL_SECONDS = 0.05


@dataclass
class TakeBack:
    """What the stage decided: placements (nominations), evictions, and per gang the pods it
    waits for."""

    assignments: list[PodAssignment] = field(default_factory=list)
    evictions: list[Eviction] = field(default_factory=list)
    waits_for: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: Pending gang -> why it could not take anything back (for the explainer).
    refused: dict[str, str] = field(default_factory=dict)
    #: See :attr:`scheduler.solver.placement.Placement.min_evicted_gpu_milli`.
    min_evicted_gpu_milli: int = 0

    def freed(self) -> set[str]:
        """Uids whose room the placements use: the victims', and those of the terminating
        pods the held gangs wait for (as :attr:`scheduler.solver.placement.Placement.freed`)."""
        out = {e.pod_uid for e in self.evictions}
        out.update(uid for uids in self.waits_for.values() for uid in uids)
        return out


def holds_claimed_devices(snapshot: Snapshot, pod: Pod) -> bool:
    """True for a bound pod that holds devices through ResourceClaims: its own, or the claim
    made for an extended resource its node does not advertise (served by DRA)."""
    if pod.resource_claims:
        return True
    if snapshot.dra is None:
        # No DeviceClass, slice or claim anywhere: no extended resource is served by DRA.
        return False
    node = snapshot.node_by_name.get(pod.node_name or "")
    return node is not None and any(
        v > 0 and is_extended_resource(r) and node.allocatable.get(r, 0) <= 0
        for r, v in pod.requests.items()
    )


def take_back(
    snapshot: Snapshot,
    report: FairShareReport,
    order: Sequence[GangRequest],
    admitted: set[str],
    state: ClusterState,
    book: QueueBook,
    settings: PlacementSettings,
    scorer: NodeScorer | None = None,
    *,
    cycle: int | None = None,
    budget: float | None = None,
) -> TakeBack:
    """Evict for the gangs of ``order`` not in ``admitted`` (see module docstring).

    ``state`` holds this cycle's placements and ``book`` their queue charges; both are
    updated with what this stage decides (victims released, gangs placed).

    ``budget``: wall seconds this stage may take, building its units included (default: the
    settings' time limit; at least :data:`MIN_BUDGET_SHARE` of it). No gang after the first is
    started when less than half of what a gang took so far is left; the first always is,
    so a cluster whose units take longer to build than the budget still takes back.
    """
    out = TakeBack()
    if not settings.take_back:
        return out
    started = time.perf_counter()
    now = snapshot.now
    # Pods already terminating (evicted by an earlier cycle, or by a leader before us) free
    # their room soon: a gang that fits once they are gone is held for them instead of
    # evicting anyone more. Room already promised to a held gang stays taken (held pods are
    # in the snapshot and in ``state``).
    leaving: dict[str, list[str]] = defaultdict(list)
    for p in snapshot.pods:
        if p.deleting and p.node_name and p.active and p.uid in state.bound:
            state.release(p.uid)
            leaving[p.node_name].append(p.uid)
    units: list[Unit] | None = None  # built once the first gang may take back
    lowest: dict[str, int] | None = None  # see lowest_running_priority
    room: tuple[int, int, int] | None = None  # free_total, until this stage changes state
    cost: list[int] = []  # by unit id (see unit_costs)
    may_move: list[Unit] = []  # see movable_units
    index = UnitIndex([], [])  # the units' (see UnitIndex), once they are built
    # The stage's budget is wall time, all of it: what the cycle's time limit promises
    # (building the units walks every running pod: ~0.09 s of a 5,000-node cycle, which,
    # left out, made every such cycle that much longer than its budget).
    limit = settings.time_limit_seconds
    deadline = time.perf_counter() + max(
        MIN_BUDGET_SHARE * limit, limit if budget is None else budget
    )
    per_gang: list[float] = []  # seconds each gang took: a gang not worth starting is not
    gangs = snapshot.gang_by_key
    taken: set[int] = set()  # units already evicted or moved this cycle
    taken_gangs: set[str] = set()
    moved_pods = 0
    pdb_used: Counter[str] = Counter()
    tried = 0
    for g in order:
        if not g.required or g.key in admitted or tried >= settings.take_back_gangs:
            continue
        gang = gangs.get(g.key)
        if gang is None:
            continue
        why = may_evict(gang, now)
        if why is not None:
            out.refused[g.key] = why
            continue
        problem = book.problem(g.queue, g.ask, preemptible=g.preemptible)
        if problem is not None and problem[0] == OVER_QUOTA:
            # Only non-preemptible usage counts against that quota: no eviction can help.
            out.refused[g.key] = problem[1]
            continue
        if lowest is None:
            lowest = lowest_running_priority(snapshot)
        if not leaving and not may_evict_for(g, lowest, snapshot, report, book.charged):
            # Checked before the units exist (building them walks every running pod): with
            # no victim allowed, only consolidation is left, and moves free nothing.
            if not lowest or moved_pods >= settings.consolidation_max_pods:
                out.refused[g.key] = "no running work may be taken for it"
                continue
            if room is None:
                room = free_total(state)
            if not room_anywhere(room, g):
                out.refused[g.key] = "evicting what it may take would not make room"
                continue
        if units is None:
            units = build_units(snapshot)
            cost = unit_costs(units, now)
            may_move = movable_units(snapshot, units, now)
            index = UnitIndex(units, cost)
        if not units and not leaving:
            break
        tried += 1
        gang_started = time.perf_counter()
        left = deadline - gang_started
        if per_gang and (left <= 0.01 or left < 0.5 * sum(per_gang) / len(per_gang)):
            break
        if leaving and _hold_for_leaving(g, state, book, leaving, scorer, settings, out):
            admitted.add(g.key)
            room = None
            continue
        actions = actions_for(
            g, units, taken, taken_gangs, snapshot.queue_tree, report, book.charged, now
        )
        cap = settings.consolidation_max_pods - moved_pods
        movable = [
            u
            for u in may_move
            if u.id not in actions
            and u.id not in taken
            and u.gang not in taken_gangs
            and len(u.pods) <= cap
        ]
        if not actions and not movable:
            out.refused[g.key] = "no running work may be taken for it"
            continue
        found = solve_gang(
            snapshot,
            g,
            units,
            cost,
            actions,
            movable,
            state,
            book,
            pdb_used,
            settings.consolidation_max_pods - moved_pods,
            left / max(1, settings.take_back_gangs - tried + 1),
            settings.workers,
            index,
            # Less left of the budget than a model needs: the greedy choice, as placement
            # keeps the greedy's answer when its time runs out.
            greedy_only=settings.greedy_only or left < MIN_MODEL_SECONDS,
        )
        per_gang.append(time.perf_counter() - gang_started)
        if found is None:
            out.refused[g.key] = "evicting what it may take would not make room"
            continue
        if not found.evict and not found.move:
            continue  # it fits as things are: placement left it out for another reason
        for i in found.evict:
            book.charge(units[i].queue, units[i].usage, -1)
        problem = book.problem(g.queue, g.ask, preemptible=g.preemptible)
        for i in found.evict:
            book.charge(units[i].queue, units[i].usage)
        if problem is not None:
            out.refused[g.key] = problem[1]
            continue
        placed = apply_choice(snapshot, g, units, found, state, scorer, settings)
        if placed is None:
            out.refused[g.key] = "the pods it would free do not pack the gang"
            continue
        assignments, moves = placed
        uids: list[str] = []
        # Messages first: they quote the queues' usage as it was when the choice was made.
        for uid_, act in sorted(found.evict.items()):
            out.evictions += eviction_records(snapshot, report, book, g, units[uid_], act)
        for uid_ in sorted(found.evict):
            u = units[uid_]
            book.charge(u.queue, u.usage, -1)
            uids += [p.uid for p in u.pods]
            taken.add(u.id)
            if u.whole:
                taken_gangs.add(u.gang)
        for uid_ in sorted(found.move):
            u = units[uid_]
            out.evictions += eviction_records(snapshot, report, book, g, u, "consolidate")
            uids += [p.uid for p in u.pods]
            taken.add(u.id)
            taken_gangs.add(u.gang)
            moved_pods += len(u.pods)
        book.charge(g.queue, g.ask, preemptible=g.preemptible)
        for b in snapshot.budgets:
            pdb_used[b.key] += sum(1 for p in b.pod_uids if p in set(uids))
        out.assignments += assignments
        # Room of pods already terminating was released above for everyone: a gang landing
        # on their node waits for them too, as a held gang does (else it could be bound
        # while they still hold what it was given, and the validator, which counts them
        # until someone waits for them, would refuse the whole stage).
        on = sorted({a.node for a in assignments})
        waits = uids + [uid for n in on for uid in leaving.get(n, ()) if uid not in uids]
        out.waits_for[g.key] = tuple(waits)
        out.min_evicted_gpu_milli += found.floor
        admitted.add(g.key)
        room = None
        log.info(
            "taken_back",
            cycle=cycle,
            gang=g.key,
            queue=g.queue,
            evicted=sorted({units[i].gang for i in found.evict}),
            moved=sorted({units[i].gang for i in found.move}),
            pods=len(uids),
            placed_moves=moves,
        )
    log.debug("take_back_done", cycle=cycle, seconds=round(time.perf_counter() - started, 4))
    return out


def movable_units(snapshot: Snapshot, units: Sequence[Unit], now: float) -> list[Unit]:
    """The units consolidation may move, as far as the cycle decides (in unit order): whole
    gangs that ran their queue's min runtime for preemption and hold no claimed devices.
    Each gang then drops those it may evict, those already taken and those too large."""
    tree = snapshot.queue_tree
    least: dict[str, float] = {}
    out: list[Unit] = []
    for u in units:
        if not u.whole:
            continue
        runtime = least.get(u.queue)
        if runtime is None:
            runtime = least[u.queue] = tree.min_runtime(u.queue, "preempt")
        # A pod's claims hold devices where it runs; moving it would need them moved too.
        if now - u.started >= runtime and not any(
            holds_claimed_devices(snapshot, p) for p in u.pods
        ):
            out.append(u)
    return out


def _hold_for_leaving(
    g: GangRequest,
    state: ClusterState,
    book: QueueBook,
    leaving: Mapping[str, list[str]],
    scorer: NodeScorer | None,
    settings: PlacementSettings,
    out: TakeBack,
) -> bool:
    """Place ``g`` where terminating pods are leaving, held for them; True when it was."""
    if book.problem(g.queue, g.ask, preemptible=g.preemptible) is not None:
        return False
    spread = settings.gpu_strategy == "spread"
    result = place_gangs(state, [g], scorer, extras=False, spread_devices=spread)
    placed = result.assignments
    waits = [uid for n in sorted({a.node for a in placed}) for uid in leaving.get(n, ())]
    if g.key not in result.placed or not waits:
        for a in reversed(placed):
            state.release(a.pod_uid)
        return False
    book.charge(g.queue, g.ask, preemptible=g.preemptible)
    out.assignments += placed
    out.waits_for[g.key] = tuple(waits)
    log.info("held_for_terminating", gang=g.key, queue=g.queue, pods=len(waits))
    return True
