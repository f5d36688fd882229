"""Per-gang outcomes of a simulated run (:class:`GangSummary`) and how the report writes
times and GPU amounts; shared by the report's tables, its JSON and the outcome totals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scheduler.cluster.node import GPU_MILLI
from scheduler.cluster.pod import PodPhase
from scheduler.cluster.queue import UNLIMITED
from scheduler.simulate.engine import SimulationResult
from scheduler.simulate.evictions import EvictionEvent, group_evictions
from scheduler.simulate.ordering import natural_key
from scheduler.simulate.records import GangRecord

__all__ = ["GangSummary", "format_gpu", "format_time", "gang_summaries"]


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
    records = sorted(
        result.cluster.gangs.values(), key=lambda r: (r.arrived_at, natural_key(r.gang.key))
    )
    return [_gang_summary(r, job_of.get(r.gang.key, r.gang.name), result) for r in records]
