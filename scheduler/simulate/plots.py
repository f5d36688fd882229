"""PNG plots of a simulation run (matplotlib, headless Agg backend).

- ``allocation_per_queue.png``: one panel per queue (in tree order; a parent queue's panel
  sums its whole subtree, as its fair share does): GPUs allocated over time, its fair share
  (dashed) and what its arrived pods ask for (allocated + waiting, dotted);
- ``gpu_allocation_vs_workload.png``: GPUs allocated in the whole cluster against the GPUs the
  arrived workload asks for (allocated + waiting), and the cluster's GPU capacity;
- ``evictions_over_time.png`` (only when something was evicted): GPUs evicted at each cycle,
  stacked by action (reclaim, preempt, consolidate, shrink), and the GPUs each queue lost so
  far.

The time axis is in seconds, minutes, hours or days, whichever suits the run's length
(:func:`time_axis`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: never needs a display, safe in CI and over SSH

import matplotlib.pyplot as plt  # the backend must be chosen before pyplot loads

from scheduler.cluster.node import GPU_MILLI
from scheduler.simulate.engine import SimulationResult
from scheduler.simulate.evictions import EVICT_ACTIONS, eviction_events
from scheduler.simulate.ordering import natural_key
from scheduler.simulate.subtree import subtree_sums, tree_order

__all__ = ["MAX_QUEUE_PANELS", "TimeAxis", "time_axis", "write_plots"]


@dataclass(frozen=True)
class TimeAxis:
    """Simulated seconds per axis unit, and the unit's name for the label."""

    seconds: float
    unit: str

    @property
    def label(self) -> str:
        """The axis label, e.g. ``simulated time (hours)``."""
        return f"simulated time ({self.unit})"

    def scale(self, times: Iterable[float]) -> list[float]:
        """Simulated seconds in this unit."""
        return [t / self.seconds for t in times]


#: Runs up to this many seconds are shown in a unit, longer ones in the next (2-3 ticks at
#: least of the smaller unit would be unreadable fractions of the larger one).
_UNITS = ((180.0, 1.0, "seconds"), (3 * 3600.0, 60.0, "minutes"), (3 * 86400.0, 3600.0, "hours"))


def time_axis(span_seconds: float) -> TimeAxis:
    """The unit for a run of ``span_seconds``: seconds up to 3 minutes, minutes up to 3
    hours, hours up to 3 days, days beyond."""
    for upto, seconds, unit in _UNITS:
        if span_seconds <= upto:
            return TimeAxis(seconds, unit)
    return TimeAxis(86400.0, "days")


def _axis(result: SimulationResult) -> TimeAxis:
    return time_axis(max(result.end_time, *(s.time for s in result.samples), 0.0))


#: More panels than this would be unreadable; the busiest queues are shown.
MAX_QUEUE_PANELS = 12


def _parents(result: SimulationResult) -> dict[str, str]:
    return {name: st.parent for name, st in result.final_report.queues.items()}


def _panel_queues(result: SimulationResult) -> list[str]:
    """Every queue in tree order if they fit; else the busiest leaf queues (and queues whose
    own pods held or asked for GPUs), in natural order."""
    statuses = result.final_report.queues
    used = {q for s in result.samples for q in (*s.allocated_gpu, *s.waiting_gpu)}
    ordered = [name for _, name in tree_order(_parents(result))]
    ordered += sorted(used - set(ordered), key=natural_key)
    if len(ordered) <= MAX_QUEUE_PANELS:
        return ordered
    names = {n for n, st in statuses.items() if not st.children} | used

    def peak(q: str) -> int:
        return max(s.allocated_gpu.get(q, 0) + s.waiting_gpu.get(q, 0) for s in result.samples)

    busiest = sorted(sorted(names, key=natural_key), key=peak, reverse=True)[:MAX_QUEUE_PANELS]
    return sorted(busiest, key=natural_key)


def _allocation_per_queue(result: SimulationResult, path: Path) -> None:
    """One panel per queue: allocated (filled), fair share (dashed), waiting demand (dotted).

    A parent queue's fair share is its subtree's, so its lines are its subtree's too."""
    queues = _panel_queues(result) or ["(none)"]
    parents = _parents(result)
    fig, axes = plt.subplots(
        len(queues), 1, figsize=(9, 1.2 + 1.9 * len(queues)), dpi=100, sharex=True, squeeze=False
    )
    axis = _axis(result)
    x = axis.scale(s.time for s in result.samples)
    allocated = [subtree_sums(s.allocated_gpu, parents) for s in result.samples]
    waiting = [subtree_sums(s.waiting_gpu, parents) for s in result.samples]
    statuses = result.final_report.queues
    for ax, queue in zip(axes[:, 0], queues, strict=True):
        alloc = [a.get(queue, 0) / GPU_MILLI for a in allocated]
        fair = [s.fair_share_gpu.get(queue, 0) / GPU_MILLI for s in result.samples]
        asked = [
            (a.get(queue, 0) + w.get(queue, 0)) / GPU_MILLI
            for a, w in zip(allocated, waiting, strict=True)
        ]
        ax.step(x, asked, where="post", linestyle=":", color="C1", label="allocated + waiting")
        ax.step(x, alloc, where="post", color="C0", linewidth=2, label="allocated")
        ax.fill_between(x, alloc, step="post", alpha=0.2, color="C0")
        ax.step(x, fair, where="post", linestyle="--", color="C2", label="fair share")
        parent = queue in statuses and bool(statuses[queue].children)
        ax.set_ylabel(f"{queue}\n{'subtree ' if parent else ''}GPUs")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(loc="upper right", fontsize="small", ncol=3)
    axes[0, 0].set_title(f"{result.scenario.name}: GPU allocation per queue")
    axes[-1, 0].set_xlabel(axis.label)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _allocation_vs_workload(result: SimulationResult, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=100)
    axis = _axis(result)
    x = axis.scale(s.time for s in result.samples)
    alloc = [sum(s.allocated_gpu.values()) / GPU_MILLI for s in result.samples]
    asked = [
        (sum(s.allocated_gpu.values()) + sum(s.waiting_gpu.values())) / GPU_MILLI
        for s in result.samples
    ]
    capacity = result.final_report.capacity.get("gpu", 0) / GPU_MILLI
    ax.step(x, asked, where="post", label="arrived workload (allocated + waiting)", color="C1")
    ax.step(x, alloc, where="post", label="allocated", color="C0", linewidth=2)
    ax.fill_between(x, alloc, step="post", alpha=0.2, color="C0")
    ax.axhline(capacity, linestyle=":", color="gray", label=f"capacity ({capacity:g} GPUs)")
    ax.set_xlabel(axis.label)
    ax.set_ylabel("GPUs")
    ax.set_title(f"{result.scenario.name}: GPU allocation vs arrived workload")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


_ACTION_COLORS = {"reclaim": "C3", "preempt": "C4", "consolidate": "C5", "shrink": "C6"}


def _evictions_over_time(result: SimulationResult, path: Path) -> None:
    """Top: GPUs evicted per cycle, stacked by action. Bottom: GPUs each queue lost so far."""
    events = eviction_events(result)
    times = sorted({e.time for e in events})
    axis = _axis(result)
    x = axis.scale(times)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), dpi=100, sharex=True)
    width = max(result.scenario.settings.cycle_period, result.end_time / 150) / axis.seconds
    base = [0.0] * len(times)
    for action in EVICT_ACTIONS:
        gpus = [
            sum(e.gpu for e in events if e.time == t and e.action == action) / GPU_MILLI
            for t in times
        ]
        if not any(gpus):
            continue
        top.bar(x, gpus, width=width, bottom=base, color=_ACTION_COLORS[action], label=action)
        base = [b + g for b, g in zip(base, gpus, strict=True)]
    top.set_ylabel("GPUs evicted")
    top.set_title(f"{result.scenario.name}: evictions over time")
    top.legend(loc="upper right", fontsize="small")
    top.grid(alpha=0.3)
    end = result.end_time / axis.seconds
    for i, queue in enumerate(sorted({e.queue for e in events}, key=natural_key)):
        lost, total = [0.0], 0.0
        steps = [0.0]
        for t in times:
            total += sum(e.gpu for e in events if e.time == t and e.queue == queue) / GPU_MILLI
            steps.append(t / axis.seconds)
            lost.append(total)
        steps.append(max(end, steps[-1]))
        lost.append(total)
        bottom.step(steps, lost, where="post", color=f"C{i % 10}", label=queue)
    bottom.set_ylabel("GPUs evicted so far")
    bottom.set_xlabel(axis.label)
    bottom.set_ylim(bottom=0)
    bottom.legend(loc="upper left", fontsize="small", title="victim queue")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_plots(result: SimulationResult, out_dir: str | Path) -> list[Path]:
    """Write the PNG plots into ``out_dir`` (created if needed); returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    per_queue = out / "allocation_per_queue.png"
    vs_workload = out / "gpu_allocation_vs_workload.png"
    _allocation_per_queue(result, per_queue)
    _allocation_vs_workload(result, vs_workload)
    written = [per_queue, vs_workload]
    if result.cluster.evictions:
        evictions = out / "evictions_over_time.png"
        _evictions_over_time(result, evictions)
        written.append(evictions)
    return written
