"""The end-of-run summary: per queue (requested, allocated, fair share), per gang (placed or
waiting, and why) and what was taken back (evictions per gang with action and reason, totals by
action and queue), as rich tables for people and as JSON for programs. ``summary_only`` (the
CLI's ``--summary``) keeps only the totals: per queue, per outcome and reason, per eviction
action, for runs too big to read gang by gang.

Reasons are the ones the solver attached to each :class:`~scheduler.solver.placement.GangOutcome`
and :class:`~scheduler.solver.placement.Eviction`, i.e. the same words the live scheduler
writes on PodGroup status and Events. Every listing is in a stable order (tree order, arrival
order, natural sort of names), so the same run prints the same bytes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from scheduler.cluster.node import GPU_MILLI
from scheduler.cluster.queue import QUEUE_RESOURCES, UNLIMITED
from scheduler.fairness import QueueStatus
from scheduler.simulate.engine import SimulationResult
from scheduler.simulate.evictions import (
    EVICT_ACTIONS,
    EvictionEvent,
    eviction_events,
    eviction_totals,
)
from scheduler.simulate.gang_rows import gang_rows
from scheduler.simulate.ordering import natural_key
from scheduler.simulate.outcomes import outcome_tables, outcome_totals
from scheduler.simulate.subtree import subtree_sums, tree_order
from scheduler.simulate.summaries import GangSummary, format_gpu, format_time, gang_summaries

__all__ = [
    "EVICT_ACTIONS",
    "EvictionEvent",
    "GangSummary",
    "eviction_events",
    "eviction_totals",
    "format_gpu",
    "format_time",
    "gang_summaries",
    "print_report",
    "summary",
]

#: Above this many gang rows the report says that ``--summary`` prints only the totals.
MANY_ROWS = 50


def _queue_order(queues: dict[str, QueueStatus]) -> Iterator[tuple[int, QueueStatus]]:
    """Depth-first through the tree (roots first, siblings in natural order)."""
    for depth, name in tree_order({name: s.parent for name, s in queues.items()}):
        yield depth, queues[name]


def _parents(result: SimulationResult) -> dict[str, str]:
    return {name: s.parent for name, s in result.final_report.queues.items()}


def _peaks(result: SimulationResult) -> dict[str, int]:
    """Per queue, the most GPU thousandths it held at any sample (parents sum children)."""
    parents = _parents(result)
    peak: dict[str, int] = defaultdict(int)
    for sample in result.samples:
        for q, milli in subtree_sums(sample.allocated_gpu, parents).items():
            peak[q] = max(peak[q], round(milli))
    return dict(peak)


def _gpu_hours(result: SimulationResult) -> dict[str, float]:
    """Per queue (parents sum children): GPU-hours held over the run (samples are steps)."""
    parents = _parents(result)
    hours: dict[str, float] = defaultdict(float)
    for here, nxt in pairwise(result.samples):
        span = (nxt.time - here.time) / 3600
        for q, milli in subtree_sums(here.allocated_gpu, parents).items():
            hours[q] += milli / GPU_MILLI * span
    return dict(hours)


def _by_name(values: dict[str, int]) -> dict[str, float]:
    return {q: values[q] / GPU_MILLI for q in sorted(values, key=natural_key)}


def _findings(result: SimulationResult) -> list[Any]:
    return sorted(
        result.final_report.findings, key=lambda f: (natural_key(f.queue), f.field, f.message)
    )


def summary(result: SimulationResult, *, summary_only: bool = False) -> dict[str, Any]:
    """The machine-readable summary printed by ``--json`` (units: GPU devices, CPU cores,
    memory bytes, times in simulated seconds). ``summary_only`` leaves out the per-gang,
    per-eviction and per-sample lists and keeps the totals."""
    report = result.final_report
    peaks = _peaks(result)
    hours = _gpu_hours(result)

    def units(values: dict[str, int]) -> dict[str, float | int]:
        out: dict[str, float | int] = {}
        for r in QUEUE_RESOURCES:
            v = values.get(r, 0)
            if v == UNLIMITED:
                out[r] = -1
            elif r in ("gpu", "cpu"):
                out[r] = v / 1000
            else:
                out[r] = v
        return out

    order = list(_queue_order(report.queues))
    queues = [
        {
            "name": s.name,
            "parent": s.parent,
            "depth": depth,
            "quota": units(s.quota),
            "limit": units(s.limit),
            "fair_share": units(s.fair_share),
            "requested": units(s.requested),
            "allocated": units(s.allocated),
            "peak_allocated_gpu": peaks.get(s.name, 0) / GPU_MILLI,
            "gpu_hours": round(hours.get(s.name, 0.0), 3),
        }
        for depth, s in order
    ]
    gangs = gang_summaries(result)
    data: dict[str, Any] = {
        "scenario": result.scenario.name,
        "end_time": result.end_time,
        "stopped": result.stopped,
        "cycles": result.cycles,
        "cycle_period": result.scenario.settings.cycle_period,
        "solver_status": dict(sorted(result.solver_status.items())),
        "wall_seconds": round(result.wall_seconds, 3),
        "capacity": {k: v / 1000 if k in ("gpu", "cpu") else v for k, v in report.capacity.items()},
        "queues": queues,
        "outcomes": outcome_totals(gangs, [s.name for _, s in order]),
        "gangs": [g.to_json() for g in gangs],
        "evictions": [e.to_json() for e in eviction_events(result)],
        "eviction_totals": eviction_totals(result),
        "timeline": [
            {
                "time": sample.time,
                "allocated_gpu": _by_name(sample.allocated_gpu),
                "waiting_gpu": _by_name(sample.waiting_gpu),
            }
            for sample in result.samples
        ],
        "queue_findings": [
            {"queue": f.queue, "field": f.field, "message": f.message} for f in _findings(result)
        ],
    }
    if summary_only:
        for key in ("gangs", "evictions", "timeline"):
            del data[key]
    return data


def _eviction_tables(result: SimulationResult, console: Console, *, per_event: bool) -> None:
    """Evictions per gang (with action and the reason message) unless not ``per_event``,
    then totals per queue."""
    events = eviction_events(result)
    if not events:
        return
    if per_event:
        _eviction_events_table(events, console)
    _eviction_totals_table(result, console)


def _eviction_events_table(events: list[EvictionEvent], console: Console) -> None:
    table = Table(title="Evictions", title_justify="left")
    for col in ("At", "Gang", "Queue", "Action", "Pods", "GPUs", "For"):
        table.add_column(col, no_wrap=col not in ("Gang", "For"), overflow="fold")
    table.add_column("Why", overflow="fold", ratio=1)
    for e in events:
        table.add_row(
            format_time(e.time),
            escape(e.gang),
            escape(e.queue),
            e.action,
            str(e.pods),
            format_gpu(e.gpu),
            escape(e.for_gang),
            escape(e.message),
        )
    console.print(table)


def _eviction_totals_table(result: SimulationResult, console: Console) -> None:
    totals = eviction_totals(result)
    used = [a for a in EVICT_ACTIONS if totals["by_action"][a]["pods"]]
    title = "Evicted pods (GPUs) by queue and action"
    per_queue = Table(title=title, title_justify="left", min_width=len(title))
    per_queue.add_column("Queue")
    for a in (*used, "total"):
        per_queue.add_column(a, justify="right")

    def cell(row: dict[str, float] | None) -> str:
        if not row or not row["pods"]:
            return "-"
        return f"{int(row['pods'])} ({format_gpu(round(row['gpus'] * GPU_MILLI))})"

    for queue, actions in totals["by_queue"].items():
        all_pods = sum(r["pods"] for r in actions.values())
        all_gpus = sum(r["gpus"] for r in actions.values())
        per_queue.add_row(
            escape(queue),
            *(cell(actions.get(a)) for a in used),
            cell({"pods": all_pods, "gpus": all_gpus}),
        )
    per_queue.add_row(
        "[bold]all[/]", *(cell(totals["by_action"][a]) for a in used), cell(totals["total"])
    )
    console.print(per_queue)


def print_report(
    result: SimulationResult, console: Console | None = None, *, summary_only: bool = False
) -> None:
    """Print the queue and gang tables (``summary_only``: the queue table and the totals per
    queue, outcome and eviction action, without a row per gang or eviction)."""
    console = console or Console()
    report = result.final_report
    cap = report.capacity
    console.print(
        f"[bold]Scenario {escape(result.scenario.name)}[/]: "
        f"simulated {format_time(result.end_time)} "
        f"in {result.cycles} cycles ({result.wall_seconds:.1f}s), "
        f"cluster {format_gpu(cap.get('gpu', 0))} GPUs, {cap.get('cpu', 0) // 1000} CPUs"
        + (" [dim](stopped at the cycle limit)[/]" if result.stopped == "limit" else "")
    )
    peaks = _peaks(result)
    hours = _gpu_hours(result)
    queues = Table(title=f"Queues at {format_time(result.end_time)} (GPUs)", title_justify="left")
    cols = ("Queue", "Quota", "Limit", "Fair share", "Requested", "Allocated", "Peak", "GPU-hours")
    for col in cols:
        queues.add_column(col, justify="left" if col == "Queue" else "right")
    order = list(_queue_order(report.queues))
    for depth, s in order:
        name = "  " * depth + escape(s.name) + ("" if s.healthy else " [red](invalid)[/]")
        quota = s.quota.get("gpu", 0)
        queues.add_row(
            name,
            "∞" if quota == UNLIMITED else format_gpu(quota),
            format_gpu(s.limit.get("gpu", UNLIMITED)),
            format_gpu(s.fair_share.get("gpu", 0)),
            format_gpu(s.requested.get("gpu", 0)),
            format_gpu(s.allocated.get("gpu", 0)),
            format_gpu(peaks.get(s.name, 0)) if s.name in peaks else "-",
            f"{hours.get(s.name, 0.0):.1f}",
        )
    console.print(queues)
    summaries = gang_summaries(result)
    if summary_only:
        for table in outcome_tables(outcome_totals(summaries, [s.name for _, s in order])):
            console.print(table)
    else:
        rows = gang_rows(summaries)
        caption = (
            f"{len(rows)} rows; --summary prints only the totals per queue and outcome"
            if len(rows) > MANY_ROWS
            else None
        )
        gangs = Table(title="Gangs", title_justify="left", caption=caption)
        for col in ("Gang", "Queue", "Pods", "Arrived", "Placed", "Status"):
            gangs.add_column(col, no_wrap=col != "Gang", overflow="fold")
        gangs.add_column("Why", overflow="fold", ratio=1)
        for row in rows:
            gangs.add_row(*row)
        console.print(gangs)
    _eviction_tables(result, console, per_event=not summary_only)
    for f in _findings(result):
        console.print(f"[red]queue {escape(f.queue)}[/] {escape(f.field)}: {escape(f.message)}")
