"""A cycle's batch judged as a whole: what it leaves free, not pod by pod.

The greedy places gangs one after another in admission order, each where it raises
fragmentation least. Within a batch that order is arbitrary as far as placement goes: a
190-thousandths pod that comes before the 810 one it could sit beside lands elsewhere, and
a fractional pod may split the last whole device a multi-GPU pod of the same batch needed.
With the fragmentation scorer (:mod:`scheduler.plugins.fragmentation`) this module places
the batch a second time, largest first within each priority (whole and multi-GPU pods,
then shares from large to small, so small ones fill the leftovers beside large ones), and
keeps whichever answer is better:

1. more admitted work, tier by tier (:func:`scheduler.solver.hybrid.admission_key`, the
   CP-SAT stage's own admission measure: choosing which pods to leave out when the batch
   cannot all fit);
2. then lower *batch cost*: the fragmentation of every node the batch touched, after minus
   before, plus the model-scarcity cost of the thousandths taken
   (:func:`batch_cost`), i.e. the measure of the node states the whole batch leaves.

Ties keep the admission-order answer. The second pass reuses the scores the first one
cached, so it costs a fraction of it (measured on openb replays at batch 64: 0.04 s p50,
0.14 s p95, against 0.17 / 0.38 s for the first pass). It runs for batches of at most
:data:`MAX_BATCH_GANGS` gangs, so what it adds to a cycle is bounded, and it depends on the
batch, not on the machine's load (a replay gives the same answer on a busy machine). With
any other scorer (``packing``, the default) :func:`better_batch` returns at once.

The answer kept is the hint of the CP-SAT stage, whose quality term is the same measure
over the states its node patterns leave (:class:`scheduler.solver.quality.FragmentationQuality`),
so the model can go on where the two orders stop: any mix of the batch's pods per node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeGuard

import structlog

from scheduler.plugins.fragmentation import FragmentationScorer
from scheduler.solver.greedy import GangRequest, GreedyResult
from scheduler.solver.placement import PodAssignment
from scheduler.solver.quality import FragmentationQuality
from scheduler.solver.state import ClusterState

__all__ = ["batch_cost", "better_batch", "reorders", "size_order"]

log = structlog.get_logger(__name__)

#: Batch costs closer than this (thousandths) count as equal: keep the admission order.
COST_EPSILON = 1e-6
#: Larger batches keep the admission-order answer (the second pass would cost too much).
MAX_BATCH_GANGS = 128


def size_order(gangs: Sequence[GangRequest]) -> list[GangRequest]:
    """Restoring gangs first and then highest priority first (as admission order has
    them), then by GPU asked (thousandths) and CPU, largest first; stable, so equal gangs
    keep their admission order."""
    return sorted(
        gangs,
        key=lambda g: (not g.restoring, -g.priority, -g.ask.get("gpu", 0), -g.ask.get("cpu", 0)),
    )


def reorders(scorer: object, gangs: Sequence[GangRequest]) -> TypeGuard[FragmentationScorer]:
    """Whether :func:`better_batch` places ``gangs`` a second time with ``scorer``."""
    return isinstance(scorer, FragmentationScorer) and 2 <= len(gangs) <= MAX_BATCH_GANGS


def better_batch(
    state: ClusterState,
    gangs: Sequence[GangRequest],
    greedy: GreedyResult,
    scorer: object,
    place: Callable[[Sequence[GangRequest]], GreedyResult],
    admission: Callable[[set[str]], object],
    cycle: int | None = None,
) -> GreedyResult:
    """The better of ``greedy`` (applied to ``state``) and ``place(size_order(gangs))``; see
    the module docstring. ``state`` holds the returned answer. ``admission`` maps admitted
    gang keys to a comparable admission value (higher is better)."""
    if not reorders(scorer, gangs):
        if isinstance(scorer, FragmentationScorer) and len(gangs) > MAX_BATCH_GANGS:
            log.debug("batch_order_skipped", cycle=cycle, gangs=len(gangs))
        return greedy
    ordered = size_order(gangs)
    if [g.key for g in ordered] == [g.key for g in gangs]:
        return greedy
    first = greedy.assignments
    cost_first = batch_cost(state, scorer, first)
    second = place(ordered)
    cost_second = batch_cost(state, scorer, second.assignments)
    key_first, key_second = admission(set(greedy.placed)), admission(set(second.placed))
    take = key_second > key_first or (  # type: ignore[operator]
        key_second == key_first and cost_second < cost_first - COST_EPSILON
    )
    log.debug(
        "batch_order",
        cycle=cycle,
        gangs=len(gangs),
        kept="size" if take else "admission",
        cost_admission_order=round(cost_first, 1),
        cost_size_order=round(cost_second, 1),
        placed_admission_order=len(greedy.placed),
        placed_size_order=len(second.placed),
    )
    for a in (second if take else greedy).assignments:
        state.apply(a)
    return second if take else greedy


def batch_cost(
    state: ClusterState, scorer: FragmentationScorer, assignments: Sequence[PodAssignment]
) -> float:
    """What ``assignments`` (held by ``state``) leave: the fragmentation of every node they
    touched, after minus before, plus the model scarcity of the thousandths they take (the
    change of :class:`~scheduler.solver.quality.FragmentationQuality`'s cost, unrounded).
    They are released on return (``state`` is as before them)."""
    quality = FragmentationQuality(scorer)

    def cost(name: str) -> float:
        slot = state.nodes[name]
        return quality.exact_costs(slot.node, [(slot.free, slot.gpu_free)])[0]

    after = {a.node: cost(a.node) for a in assignments}
    for a in reversed(assignments):
        state.release(a.pod_uid)
    return sum(v - cost(n) for n, v in after.items())
