"""PNG plots of a simulation run (matplotlib, headless Agg backend).

- ``allocation_per_queue.png``: one panel per leaf queue: GPUs allocated over time, its fair
  share (dashed) and what its arrived pods ask for (allocated + waiting, dotted);
- ``gpu_allocation_vs_workload.png``: GPUs allocated in the whole cluster against the GPUs the
  arrived workload asks for (allocated + waiting), and the cluster's GPU capacity;
- ``evictions_over_time.png`` (only when something was evicted): GPUs evicted at each cycle,
  stacked by action (reclaim, preempt, consolidate, shrink), and the GPUs each queue lost so
  far.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: never needs a display, safe in CI and over SSH

import matplotlib.pyplot as plt  # the backend must be chosen before pyplot loads

from scheduler.cluster.node import GPU_MILLI
from scheduler.simulate.engine import SimulationResult
from scheduler.simulate.evictions import EVICT_ACTIONS, eviction_events

__all__ = ["MAX_QUEUE_PANELS", "write_plots"]


def _minutes(result: SimulationResult) -> list[float]:
    return [s.time / 60 for s in result.samples]


#: More panels than this would be unreadable; the busiest queues are shown.
MAX_QUEUE_PANELS = 12


def _leaf_queues(result: SimulationResult) -> list[str]:
    """Leaf queues (and any queue that held or asked for GPUs), busiest first if too many."""
    statuses = result.final_report.queues
    used = {q for s in result.samples for q in (*s.allocated_gpu, *s.waiting_gpu)}
    names = sorted({n for n, s in statuses.items() if not s.children} | used)
    if len(names) <= MAX_QUEUE_PANELS:
        return names

    def peak(q: str) -> int:
        return max(s.allocated_gpu.get(q, 0) + s.waiting_gpu.get(q, 0) for s in result.samples)

    return sorted(sorted(names, key=peak, reverse=True)[:MAX_QUEUE_PANELS])


def _allocation_per_queue(result: SimulationResult, path: Path) -> None:
    """One panel per queue: allocated (filled), fair share (dashed), waiting demand (dotted)."""
    queues = _leaf_queues(result) or ["(none)"]
    fig, axes = plt.subplots(
        len(queues), 1, figsize=(9, 1.2 + 1.9 * len(queues)), dpi=100, sharex=True, squeeze=False
    )
    x = _minutes(result)
    for ax, queue in zip(axes[:, 0], queues, strict=True):
        alloc = [s.allocated_gpu.get(queue, 0) / GPU_MILLI for s in result.samples]
        fair = [s.fair_share_gpu.get(queue, 0) / GPU_MILLI for s in result.samples]
        asked = [
            (s.allocated_gpu.get(queue, 0) + s.waiting_gpu.get(queue, 0)) / GPU_MILLI
            for s in result.samples
        ]
        ax.step(x, asked, where="post", linestyle=":", color="C1", label="allocated + waiting")
        ax.step(x, alloc, where="post", color="C0", linewidth=2, label="allocated")
        ax.fill_between(x, alloc, step="post", alpha=0.2, color="C0")
        ax.step(x, fair, where="post", linestyle="--", color="C2", label="fair share")
        ax.set_ylabel(f"{queue}\nGPUs")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(loc="upper right", fontsize="small", ncol=3)
    axes[0, 0].set_title(f"{result.scenario.name}: GPU allocation per queue")
    axes[-1, 0].set_xlabel("simulated time (minutes)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _allocation_vs_workload(result: SimulationResult, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=100)
    x = _minutes(result)
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
    ax.set_xlabel("simulated time (minutes)")
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
    x = [t / 60 for t in times]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), dpi=100, sharex=True)
    width = max(result.scenario.settings.cycle_period / 60, (result.end_time / 60) / 150)
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
    end = result.end_time / 60
    for i, queue in enumerate(sorted({e.queue for e in events})):
        lost, total = [0.0], 0.0
        steps = [0.0]
        for t in times:
            total += sum(e.gpu for e in events if e.time == t and e.queue == queue) / GPU_MILLI
            steps.append(t / 60)
            lost.append(total)
        steps.append(max(end, steps[-1]))
        lost.append(total)
        bottom.step(steps, lost, where="post", color=f"C{i % 10}", label=queue)
    bottom.set_ylabel("GPUs evicted so far")
    bottom.set_xlabel("simulated time (minutes)")
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
