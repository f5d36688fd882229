"""The end-of-run summary: per queue (requested, allocated, fair share), per gang (placed or
waiting, and why) and what was taken back (evictions per gang with action and reason, totals by
action and queue), as rich tables for people and as JSON for programs.

Reasons are the ones the solver attached to each :class:`~scheduler.solver.placement.GangOutcome`
and :class:`~scheduler.solver.placement.Eviction`, i.e. the same words the live scheduler
writes on PodGroup status and Events.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from scheduler.cluster.node import GPU_MILLI
from scheduler.cluster.pod import PodPhase
from scheduler.cluster.queue import QUEUE_RESOURCES, UNLIMITED
from scheduler.fairness import QueueStatus
from scheduler.simulate.engine import SimulationResult
from scheduler.simulate.evictions import (
    EVICT_ACTIONS,
    EvictionEvent,
    eviction_events,
    eviction_totals,
    group_evictions,
)
from scheduler.simulate.records import GangRecord

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


def format_time(seconds: float | None) -> str:
    """Simulated seconds as ``1h05m``, ``2m30s`` or ``45s`` ("-" for None; before the start,
    e.g. a job already running, ``-30m``)."""
    if seconds is None:
        return "-"
    if seconds < 0:
        return "-" + format_time(-seconds)
    total = round(seconds)
    h, rest = divmod(total, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h{m:02d}m" if not s else f"{h}h{m:02d}m{s:02d}s"
    if m:
        return f"{m}m" if not s else f"{m}m{s:02d}s"
    return f"{s}s"


def format_gpu(milli: int) -> str:
    """GPU thousandths as devices: ``8``, ``0.5``; -1 (unlimited) as ``∞``."""
    if milli == UNLIMITED:
        return "∞"
    whole, frac = divmod(milli, GPU_MILLI)
    return str(whole) if not frac else f"{milli / GPU_MILLI:.2f}".rstrip("0")


@dataclass(frozen=True)
class GangSummary:
    """One gang at the end of the run."""

    gang: str
    job: str
    queue: str
    implicit: bool
    min_member: int
    pods: int
    pending: int
    running: int
    finished: int
    arrived_at: float
    placed_at: float | None
    #: "running", "finished", "waiting" or "partly placed" (min members placed, extras wait).
    status: str
    reason_code: str
    reason: str
    #: Why it did not start when it arrived (first reason seen), for gangs placed later.
    waited_because: str
    waited_code: str = ""
    #: Pods of the gang evicted over the run, and how often that restarted the whole job.
    evicted: int = 0
    restarts: int = 0
    #: Since when it waits: its arrival, or its last restart.
    queued_at: float | None = None
    #: Pods held on their nodes while the pods evicted for them terminate.
    nominated: int = 0
    #: Its pods' evictions (grouped), and the evictions that made room for it.
    evictions: tuple[EvictionEvent, ...] = ()
    made_room: tuple[EvictionEvent, ...] = ()

    @property
    def waited(self) -> float | None:
        """Seconds between arrival (or the last restart) and placement (None while waiting)."""
        if self.placed_at is None:
            return None
        return self.placed_at - (self.arrived_at if self.queued_at is None else self.queued_at)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data."""
        return {
            "gang": self.gang,
            "job": self.job,
            "queue": self.queue,
            "implicit": self.implicit,
            "min_member": self.min_member,
            "pods": {
                "total": self.pods,
                "pending": self.pending,
                "running": self.running,
                "finished": self.finished,
            },
            "status": self.status,
            "arrived_at": self.arrived_at,
            "placed_at": self.placed_at,
            "waited_seconds": self.waited,
            "reason_code": self.reason_code,
            "reason": self.reason,
            "waited_code": self.waited_code,
            "waited_because": self.waited_because,
            "evicted_pods": self.evicted,
            "restarts": self.restarts,
            "nominated_pods": self.nominated,
            "evictions": [e.to_json() for e in self.evictions],
            "made_room_by": [e.to_json() for e in self.made_room],
        }


def _gang_summary(record: GangRecord, job: str, result: SimulationResult) -> GangSummary:
    every = [result.cluster.pods[uid] for uid in record.pod_uids]
    # An evicted pod's replacement stands for it: count each pod of the job once.
    pods = [p for p in every if p.replaced_by is None]
    finished = sum(1 for p in pods if p.pod.phase == PodPhase.SUCCEEDED)
    nominated = sum(1 for p in pods if p.pod.nominated and p.pod.active)
    running = sum(1 for p in pods if p.pod.bound and p.pod.active and not p.pod.nominated)
    pending = sum(1 for p in pods if p.pod.pending)
    code, reason = record.last_reason or ("", "")
    if record.placed_at is None:
        status = "nominated" if nominated else "waiting"
        if not code:
            code, reason = "NotConsidered", "no cycle has considered this gang yet"
    elif pending:
        status = "partly placed"
    elif running:
        status = "running"
    else:
        status = "finished"
    first_code, first = "", ""
    if record.placed_at is not None and record.first_reason:
        first_code, first = record.first_reason
    waiting = status in ("waiting", "partly placed", "nominated")
    return GangSummary(
        gang=record.gang.key,
        job=job,
        queue=record.gang.queue,
        implicit=record.gang.implicit,
        min_member=record.gang.min_member,
        pods=len(pods),
        pending=pending,
        running=running,
        finished=finished,
        arrived_at=record.arrived_at,
        placed_at=record.placed_at,
        status=status,
        reason_code=code if waiting else "",
        reason=reason if waiting else "",
        waited_because=first,
        waited_code=first_code,
        evicted=len(record.evictions),
        restarts=record.restarts,
        queued_at=record.queued_at,
        nominated=nominated,
        evictions=tuple(group_evictions(record.evictions)),
        made_room=tuple(group_evictions(record.made_room)),
    )


def gang_summaries(result: SimulationResult) -> list[GangSummary]:
    """Every gang that arrived, in arrival order."""
    job_of: dict[str, str] = {}
    for job in result.scenario.jobs:
        for gang in job.gangs:
            job_of.setdefault(gang.key, job.name)
    records = sorted(result.cluster.gangs.values(), key=lambda r: (r.arrived_at, r.gang.key))
    return [_gang_summary(r, job_of.get(r.gang.key, r.gang.name), result) for r in records]


def _queue_order(queues: dict[str, QueueStatus]) -> Iterator[tuple[int, QueueStatus]]:
    """Depth-first through the tree (roots first), so children sit under their parent."""
    children: dict[str, list[str]] = defaultdict(list)
    for name, s in queues.items():
        children[s.parent if s.parent in queues else ""].append(name)

    def walk(name: str, depth: int) -> Iterator[tuple[int, QueueStatus]]:
        yield depth, queues[name]
        for child in sorted(children.get(name, [])):
            yield from walk(child, depth + 1)

    for root in sorted(children.get("", [])):
        yield from walk(root, 0)


def _peaks(result: SimulationResult) -> dict[str, int]:
    """Per queue, the most GPU thousandths it held at any sample (parents sum children)."""
    parents = {name: s.parent for name, s in result.final_report.queues.items()}
    peak: dict[str, int] = defaultdict(int)
    for sample in result.samples:
        totals: dict[str, int] = defaultdict(int)
        for q, milli in sample.allocated_gpu.items():
            seen: set[str] = set()
            while q and q not in seen:  # walk up the tree; ``seen`` guards broken cycles
                seen.add(q)
                totals[q] += milli
                q = parents.get(q, "")
        for q, milli in totals.items():
            peak[q] = max(peak[q], milli)
    return dict(peak)


def _gpu_hours(result: SimulationResult) -> dict[str, float]:
    """Per queue (parents sum children): GPU-hours held over the run (samples are steps)."""
    parents = {name: s.parent for name, s in result.final_report.queues.items()}
    hours: dict[str, float] = defaultdict(float)
    samples = result.samples
    for here, nxt in pairwise(samples):
        span = (nxt.time - here.time) / 3600
        for q, milli in here.allocated_gpu.items():
            seen: set[str] = set()
            while q and q not in seen:
                seen.add(q)
                hours[q] += milli / GPU_MILLI * span
                q = parents.get(q, "")
    return dict(hours)


def summary(result: SimulationResult) -> dict[str, Any]:
    """The machine-readable summary printed by ``--json`` (units: GPU devices, CPU cores,
    memory bytes, times in simulated seconds)."""
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
        for depth, s in _queue_order(report.queues)
    ]
    return {
        "scenario": result.scenario.name,
        "end_time": result.end_time,
        "stopped": result.stopped,
        "cycles": result.cycles,
        "cycle_period": result.scenario.settings.cycle_period,
        "solver_status": dict(result.solver_status),
        "wall_seconds": round(result.wall_seconds, 3),
        "capacity": {k: v / 1000 if k in ("gpu", "cpu") else v for k, v in report.capacity.items()},
        "queues": queues,
        "gangs": [g.to_json() for g in gang_summaries(result)],
        "evictions": [e.to_json() for e in eviction_events(result)],
        "eviction_totals": eviction_totals(result),
        "timeline": [
            {
                "time": sample.time,
                "allocated_gpu": {
                    q: v / GPU_MILLI for q, v in sorted(sample.allocated_gpu.items())
                },
                "waiting_gpu": {q: v / GPU_MILLI for q, v in sorted(sample.waiting_gpu.items())},
            }
            for sample in result.samples
        ],
        "queue_findings": [
            {"queue": f.queue, "field": f.field, "message": f.message} for f in report.findings
        ],
    }


def _gang_rows(gangs: list[GangSummary]) -> list[tuple[str, ...]]:
    """Table rows; pods of one job without a PodGroup that share an outcome share a row (the
    same reason code: their messages differ only in the pod they name; the first is shown)."""
    grouped: dict[tuple[str, str, str, str, float | None, int], list[GangSummary]] = {}
    for g in gangs:
        name = f"{g.gang.split('/', 1)[0]}/{g.job}" if g.implicit else g.gang
        reason = g.reason_code if g.implicit else g.reason
        key = (name, g.status, reason, g.queue, g.placed_at, g.restarts)
        grouped.setdefault(key, []).append(g)
    rows: list[tuple[str, ...]] = []
    for (name, *_), members in grouped.items():
        g = members[0]
        if g.implicit:
            n = len(members)
            label = f"{escape(name)} [dim]({n} pod{'s' if n > 1 else ''}, no PodGroup)[/]"
            pods = str(sum(m.pods for m in members))
        else:
            label = escape(name)
            pods = f"{g.pods} (min {g.min_member})" if g.pods != g.min_member else str(g.pods)
        reason = f"[bold]{escape(g.reason_code)}[/]" + (f": {escape(g.reason)}" if g.reason else "")
        if g.status == "waiting":
            status, why = "[yellow]waiting[/]", reason
        elif g.status == "nominated":
            status, why = "[yellow]nominated[/]", reason
        elif g.status == "partly placed":
            status, why = "[yellow]partly placed[/]", f"{g.pending} extra pod(s) wait: {reason}"
        else:
            status = "[green]running[/]" if g.status == "running" else "[blue]finished[/]"
            waited = g.waited or 0.0
            why = (
                f"waited {format_time(waited)} ([bold]{escape(g.waited_code)}[/]): "
                f"{escape(g.waited_because)}"
                if g.waited_because and waited > 0
                else "placed when it arrived"
            )
            if g.made_room:
                took = sum(e.pods for e in g.made_room)
                actions = ", ".join(sorted({e.action for e in g.made_room}))
                if g.waited_because:
                    why += f"; then took back {took} pod(s) ({actions})"
                else:
                    why = f"took back {took} pod(s) ({actions})" + (
                        f"; bound {format_time(waited)} later, once they were gone"
                        if waited > 0
                        else ""
                    )
        if g.evictions:
            lost = ", ".join(sorted({e.action for e in g.evictions}))
            times = f"{g.restarts}x restarted" if g.restarts else f"{g.evicted} pod(s)"
            why += f" [red](evicted: {lost}; {times})[/]"
        placed = format_time(g.placed_at)
        rows.append((label, escape(g.queue), pods, format_time(g.arrived_at), placed, status, why))
    return rows


def _eviction_tables(result: SimulationResult, console: Console) -> None:
    """Evictions per gang (with action and the reason message), then totals per queue."""
    events = eviction_events(result)
    if not events:
        return
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


def print_report(result: SimulationResult, console: Console | None = None) -> None:
    """Print the queue and gang tables."""
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
    for depth, s in _queue_order(report.queues):
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
    gangs = Table(title="Gangs", title_justify="left")
    for col in ("Gang", "Queue", "Pods", "Arrived", "Placed", "Status"):
        gangs.add_column(col, no_wrap=col != "Gang", overflow="fold")
    gangs.add_column("Why", overflow="fold", ratio=1)
    for row in _gang_rows(gang_summaries(result)):
        gangs.add_row(*row)
    console.print(gangs)
    _eviction_tables(result, console)
    for f in report.findings:
        console.print(f"[red]queue {escape(f.queue)}[/] {escape(f.field)}: {escape(f.message)}")
