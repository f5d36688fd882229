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

A tier that cannot be placed whole on any account (:func:`surely_short`: its pods ask for
more whole devices than the nodes with room for them have free) is not placed by the greedy
at all: it is the frontier whatever the greedy does, and the stage after it places it from
scratch (the relaxation-guided pass). That stage asks for the greedy's answer for the tier
only when it needs it, to compare (:attr:`Frontier.skipped`): on the 5,000-node benchmark
the guided pass reached the relaxation's bound in every cycle, so the greedy's pass over the
top tier was never needed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from scheduler.cluster.node import GPU_MILLI
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

__all__ = ["Frontier", "finish_greedy", "place_to_frontier", "priority_tiers", "surely_short"]


def priority_tiers(order: Sequence[GangRequest]) -> list[list[GangRequest]]:
    """``order`` cut into runs of one priority (admission order has them highest first)."""
    tiers: list[list[GangRequest]] = []
    for g in order:
        if tiers and tiers[-1][0].priority == g.priority:
            tiers[-1].append(g)
        else:
            tiers.append([g])
    return tiers


class Frontier(NamedTuple):
    """Where :func:`place_to_frontier` stopped."""

    #: What it placed (applied to the state, charged to the book).
    greedy: GreedyResult
    #: The gangs it did not place, in admission order (the tier it skipped, then the lower
    #: tiers); empty when it did not stop.
    rest: list[GangRequest]
    #: The tier it did not place because :func:`surely_short` (a prefix of ``rest``).
    skipped: list[GangRequest]


def surely_short(state: ClusterState, tier: Sequence[GangRequest]) -> bool:
    """True when not every gang of ``tier`` can be placed on ``state``, whatever goes where.

    A count over whole devices: for each device count ``k`` its required pods ask for, the
    pods asking for ``k`` or more need at least that many devices, on nodes that have ``k``
    or more whole devices free. Where placeable nodes have fewer, some pod of the tier finds
    no room (nodes' rules, CPU and shares only take more away), so a gang of it is left out.
    """
    asks: Counter[int] = Counter()
    for g in tier:
        for p in g.required:
            gpu = p.gpu
            if gpu is not None and gpu.whole and gpu.count and gpu.memory_mib is None:
                asks[gpu.count] += gpu.count
    if not asks:
        return False
    free: Counter[int] = Counter()  # whole free devices -> placeable nodes with that many
    for key, members in state.classes.items():
        whole = sum(1 for f in key[2] if f >= GPU_MILLI)
        if whole:
            free[whole] += len(members)
    need = 0
    for k in sorted(asks, reverse=True):
        need += asks[k]
        if need > sum(w * n for w, n in free.items() if w >= k):
            return True
    return False


def place_to_frontier(
    state: ClusterState,
    order: Sequence[GangRequest],
    scorer: NodeScorer,
    index: ClassIndex,
    book: QueueBook,
    *,
    spread_devices: bool = False,
    cycle: int | None = None,
    skip_short: bool = True,
) -> Frontier:
    """The greedy over ``order`` tier by tier until a tier leaves a gang with required pods
    out while lower tiers follow, or (``skip_short``) before a tier that :func:`surely_short`.
    Extras are placed only when it did not stop (then the result is that of one
    :func:`~.greedy.place_gangs` pass over ``order``)."""
    result = GreedyResult()
    tiers = priority_tiers(order)
    for i, tier in enumerate(tiers):
        if skip_short and surely_short(state, tier):
            return Frontier(result, [g for t in tiers[i:] for g in t], list(tier))
        part = place_gangs(
            state, tier, scorer, book=book, extras=False, spread_devices=spread_devices,
            cycle=cycle, index=index,
        )  # fmt: skip
        result.placed.update(part.placed)
        result.failed.update(part.failed)
        if i + 1 < len(tiers) and any(g.required and g.key not in part.placed for g in tier):
            return Frontier(result, [g for lower in tiers[i + 1 :] for g in lower], [])
    _add(result, place_extras(index, order, set(result.placed), book))
    return Frontier(result, [], [])


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
