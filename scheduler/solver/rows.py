"""Rows shared by the CP-SAT stage model and its relaxation: gangs as the models see them,
queue limits and quota, and what is left of each queue's fair share."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler.cluster.queue import UNLIMITED, QueueTree
from scheduler.fairness import FairShareReport
from scheduler.solver.greedy import GangRequest

__all__ = [
    "UNITS",
    "ModelGang",
    "admission_value",
    "fair_rooms",
    "fair_weight",
    "queue_rows",
    "work_units",
]

#: Work and fair-share units: a tenth of a GPU, one CPU core.
UNITS = {"gpu": 100, "cpu": 1000}


@dataclass(frozen=True)
class ModelGang:
    """A gang in the model: fixed (must stay admitted) or free."""

    request: GangRequest
    fixed: bool
    work: int
    units: Mapping[str, int]
    ask: Mapping[str, int]


def work_units(ask: Mapping[str, int]) -> dict[str, int]:
    """Queue usage in objective units (rounded up, so any work counts)."""
    return {r: -(-ask.get(r, 0) // u) for r, u in UNITS.items()}


def queue_rows(
    gangs: Sequence[ModelGang],
    tree: QueueTree,
    report: FairShareReport,
    charged: Mapping[str, Mapping[str, int]],
    pinned: Mapping[str, Mapping[str, int]] | None = None,
) -> list[tuple[str, list[tuple[int, int]], int]]:
    """(name, [(gang index, amount)], capacity) rows for limits at every level, and for the
    quota of every level against non-preemptible gangs, where only non-preemptible usage
    counts (``pinned``: the non-preemptible part of ``charged``)."""
    rows: list[tuple[str, list[tuple[int, int]], int]] = []
    by_queue: dict[str, list[int]] = {}
    for i, g in enumerate(gangs):
        chain = tree.ancestors(g.request.queue) if g.request.queue in tree else []
        for q in chain:
            by_queue.setdefault(q, []).append(i)
    for q, idx in sorted(by_queue.items()):
        status = report.queues.get(q)
        if status is None:
            continue
        for r, limit in status.limit.items():
            if limit == UNLIMITED:
                continue
            terms = [(i, gangs[i].ask.get(r, 0)) for i in idx if gangs[i].ask.get(r, 0) > 0]
            if terms:
                used = status.allocated.get(r, 0) + charged.get(q, {}).get(r, 0)
                rows.append((f"limit_{q}_{r}", terms, limit - used))
        if q not in tree.queues:
            continue
        for r, settings in tree.queues[q].resources:
            if settings.quota == UNLIMITED:
                continue
            terms = [
                (i, gangs[i].ask.get(r, 0))
                for i in idx
                if not gangs[i].request.preemptible and gangs[i].ask.get(r, 0) > 0
            ]
            if terms:
                used = status.allocated_non_preemptible.get(r, 0)
                used += (pinned or {}).get(q, {}).get(r, 0)
                rows.append((f"quota_{q}_{r}", terms, settings.quota - used))
    return rows


def fair_rooms(
    gangs: Sequence[ModelGang],
    report: FairShareReport,
    charged: Mapping[str, Mapping[str, int]],
) -> dict[tuple[str, str], int]:
    """(leaf queue, resource) -> fair-share room left for the free gangs, in work units.

    Room is the queue's fair share minus what it holds, minus the fixed gangs of the model
    and what earlier stages admitted (``charged``); only queues with free gangs appear.
    """
    fixed_use: dict[str, Counter[str]] = {}
    for g in gangs:
        if g.fixed:
            fixed_use.setdefault(g.request.queue, Counter()).update(g.ask)
    out: dict[tuple[str, str], int] = {}
    for q in sorted({g.request.queue for g in gangs if not g.fixed}):
        qs = report.queues.get(q)
        if qs is None:
            continue
        for r, unit in UNITS.items():
            room = qs.fair_share.get(r, 0) - qs.allocated.get(r, 0)
            room -= fixed_use.get(q, Counter())[r] + charged.get(q, {}).get(r, 0)
            room = max(0, room) // unit
            if room > 0:
                out[(q, r)] = room
    return out


def fair_weight(gangs: Sequence[ModelGang]) -> int:
    """``K_F``: one unit of work within fair share outweighs all plain work of the model."""
    return sum(g.work for g in gangs if not g.fixed) + 1


def admission_value(
    gangs: Sequence[ModelGang],
    admitted: set[str],
    report: FairShareReport,
    charged: Mapping[str, Mapping[str, int]],
) -> int:
    """The model's admission value ``K_F * sum f + sum work`` of admitting ``admitted``."""
    got: Counter[tuple[str, str]] = Counter()
    work = 0
    for g in gangs:
        if g.fixed or g.request.key not in admitted:
            continue
        work += g.work
        for r in UNITS:
            got[(g.request.queue, r)] += g.units[r]
    fair = sum(min(room, got[key]) for key, room in fair_rooms(gangs, report, charged).items())
    return fair_weight(gangs) * fair + work
