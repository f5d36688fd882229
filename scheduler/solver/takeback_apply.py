"""Carrying out one gang's take-back :class:`~.takeback_greedy.Choice`: the chosen units
released, the gang placed with real device grants and moved pods placed again on a
:class:`ClusterState` (or everything undone when it does not pack after all), and the
:class:`Eviction` records, one per pod taken, with the sentence its Event carries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from scheduler.cluster.snapshot import Snapshot
from scheduler.fairness import FairShareReport
from scheduler.fairness.admission import format_queue_amount
from scheduler.framework.scoring import NodeScorer
from scheduler.solver.greedy import GangRequest, place_gangs, pod_size
from scheduler.solver.placement import EvictAction, Eviction, PlacementSettings, PodAssignment
from scheduler.solver.queues import QueueBook
from scheduler.solver.state import ClusterState
from scheduler.solver.takeback_greedy import Choice
from scheduler.solver.victims import Unit, branch_pair, dominant, fair, used

__all__ = ["apply_choice", "eviction_records"]


def apply_choice(
    snapshot: Snapshot,
    g: GangRequest,
    units: Sequence[Unit],
    choice: Choice,
    state: ClusterState,
    scorer: NodeScorer | None,
    settings: PlacementSettings,
) -> tuple[list[PodAssignment], int] | None:
    """Release the chosen units, place the gang, then place moved pods again (kept in
    ``state`` for this cycle only: their controllers recreate them, and the next cycle
    places the new pods). None, with ``state`` untouched, when any of it does not fit."""
    spread = settings.gpu_strategy == "spread"
    gone = [units[i] for i in (*choice.evict, *choice.move)]
    for u in gone:
        for p in u.pods:
            state.release(p.uid)
    result = place_gangs(state, [g], scorer, extras=False, spread_devices=spread)
    placed = result.assignments
    ok = g.key in result.placed
    moved: list[PodAssignment] = []
    if ok:
        for i in sorted(choice.move):
            u = units[i]
            pods = tuple(sorted(u.pods, key=pod_size, reverse=True))
            again = place_gangs(
                state,
                [GangRequest(u.gang, u.queue, u.priority, True, pods)],
                scorer,
                extras=False,
                spread_devices=spread,
            )
            moved += again.assignments
            if u.gang not in again.placed:
                ok = False
                break
    if not ok:
        for a in reversed([*placed, *moved]):
            state.release(a.pod_uid)
        for u in reversed(gone):
            for p in u.pods:
                state.restore_bound(p)
        return None
    return placed, len(moved)


def _amount(resources: Sequence[str], values: Mapping[str, int]) -> str:
    return ", ".join(
        f"{format_queue_amount(r, values.get(r, 0))} {'GPUs' if r == 'gpu' else r}"
        for r in resources
    )


def eviction_records(
    snapshot: Snapshot,
    report: FairShareReport,
    book: QueueBook,
    g: GangRequest,
    u: Unit,
    action: EvictAction,
) -> list[Eviction]:
    """One :class:`Eviction` per pod of ``u``, with the sentence its Event carries."""
    tree = snapshot.queue_tree
    if action == "preempt" or (action == "shrink" and u.queue == g.queue):
        why = (
            f"preempted by gang {g.key} of priority {g.priority} (this gang has priority "
            f"{u.priority}) in queue {g.queue}"
        )
    elif action in ("reclaim", "shrink"):
        mine, theirs = branch_pair(tree, g.queue, u.queue)
        res = dominant(g.ask)
        why = (
            f"reclaimed by queue {g.queue} for gang {g.key}: {mine} is below its fair share "
            f"({_amount(res, used(report, book.charged, mine))} of "
            f"{_amount(res, fair(report, mine))}) and {theirs} above its own "
            f"({_amount(res, used(report, book.charged, theirs))} of "
            f"{_amount(res, fair(report, theirs))})"
        )
    else:
        why = f"moved to make room for gang {g.key}; it fits on other nodes and restarts there"
    if action == "shrink":
        why = f"elastic pod beyond minMember released: {why}"
    return [
        Eviction(p.uid, p.key, u.gang, u.queue, p.node_name or "", action, g.key, why)
        for p in u.pods
    ]
