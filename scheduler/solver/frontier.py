"""The greedy pass that stops at the frontier: the first priority tier that leaves a gang out.

Admission order runs tier by tier (highest priority first, :mod:`.problem`). When a tier
leaves a gang out, the stage after the greedy (:func:`scheduler.solver.hybrid.improve`)
looks for a better answer for that tier and the ones above it - the relaxation-guided
greedy, then CP-SAT - on a cluster without this cycle's placements, and when it finds one
it places every lower tier again below it. What the greedy did for the lower tiers was
then thrown away: on the 5,000-node benchmark (three gangs in four below the top tier,
which always leaves some out) most of the greedy pass, plus taking those pods off the state
and putting most of them back. So the greedy stops after that tier, and the lower tiers are
placed once, by the stage that needs them (0.88 x the cycle time side by side,
``scripts/bench_ab.py``).

When that stage keeps the greedy's answer (it found nothing better, or failed),
:func:`finish_greedy` places the lower tiers and the extras as the uninterrupted pass would
have. A pass that does not stop (no tier leaves a gang out, or the last one does) places the
extras itself, through the same class index: it is the very pass :func:`.greedy.place_gangs`
makes in one call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from scheduler.framework.scoring import NodeScorer
from scheduler.solver.greedy import (
    ClassIndex,
    GangRequest,
    GreedyResult,
    place_extra_pods,
    place_extras,
    place_gangs,
)
from scheduler.solver.placement import PodAssignment
from scheduler.solver.queues import QueueBook
from scheduler.solver.state import ClusterState

__all__ = ["finish_greedy", "place_to_frontier", "priority_tiers"]


def priority_tiers(order: Sequence[GangRequest]) -> list[list[GangRequest]]:
    """``order`` cut into runs of one priority (admission order has them highest first)."""
    tiers: list[list[GangRequest]] = []
    for g in order:
        if tiers and tiers[-1][0].priority == g.priority:
            tiers[-1].append(g)
        else:
            tiers.append([g])
    return tiers


def place_to_frontier(
    state: ClusterState,
    order: Sequence[GangRequest],
    scorer: NodeScorer,
    index: ClassIndex,
    book: QueueBook,
    *,
    spread_devices: bool = False,
    cycle: int | None = None,
) -> tuple[GreedyResult, list[GangRequest]]:
    """The greedy over ``order`` tier by tier until a tier leaves a gang with required pods
    out while lower tiers follow; (its result, the gangs of those lower tiers). Extras are
    placed only when it did not stop (then the result is that of one
    :func:`~.greedy.place_gangs` pass over ``order``)."""
    result = GreedyResult()
    tiers = priority_tiers(order)
    for i, tier in enumerate(tiers):
        part = place_gangs(
            state, tier, scorer, book=book, extras=False, spread_devices=spread_devices,
            cycle=cycle, index=index,
        )  # fmt: skip
        result.placed.update(part.placed)
        result.failed.update(part.failed)
        if i + 1 < len(tiers) and any(g.required and g.key not in part.placed for g in tier):
            return result, [g for lower in tiers[i + 1 :] for g in lower]
    _add(result, place_extras(index, order, set(result.placed), book))
    return result, []


def finish_greedy(
    state: ClusterState,
    greedy: GreedyResult,
    rest: Sequence[GangRequest],
    order: Sequence[GangRequest],
    scorer: NodeScorer,
    book: QueueBook,
    *,
    spread_devices: bool = False,
    cycle: int | None = None,
) -> GreedyResult:
    """``greedy`` (applied to ``state``, charged to ``book``) completed: the gangs of
    ``rest`` in order, then the extras of every gang of ``order``."""
    more = place_gangs(
        state, rest, scorer, book=book, extras=False, spread_devices=spread_devices, cycle=cycle
    )
    result = GreedyResult({**greedy.placed, **more.placed}, {**greedy.failed, **more.failed})
    extras = place_extra_pods(
        state, order, set(result.placed), scorer, book=book, spread_devices=spread_devices
    )
    _add(result, extras)
    return result


def _add(result: GreedyResult, extras: Mapping[str, list[PodAssignment]]) -> None:
    for key, more in extras.items():
        result.placed.setdefault(key, []).extend(more)
        result.failed.pop(key, None)
