"""PNG plots of a trace replay (``kai-scheduler simulate --trace openb --out DIR``).

A replay has no clock (pods arrive one batch per cycle and never leave), so the x axis is
the number of pods arrived so far:

- ``replay_allocation.png``: GPUs allocated against the GPUs the arrived pods ask for and the
  cluster's capacity, with the allocation ratio marked where arrivals reach 100 % of it;
- ``replay_unallocated_gpu.png``: the GPUs not allocated, split into whole idle devices and
  the free parts of devices in use (fragments too small for the pods that arrive);
- ``replay_pending.png``: pods left unplaced so far (dropped, or pending and never retried)
  and the GPUs they asked for.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: never needs a display, safe in CI and over SSH

import matplotlib.pyplot as plt  # the backend must be chosen before pyplot loads

from scheduler.cluster.node import GPU_MILLI
from scheduler.simulate.replay import ReplayResult

__all__ = ["write_replay_plots"]

_X_LABEL = "pods arrived"


def _gpus(values: list[int]) -> list[float]:
    return [v / GPU_MILLI for v in values]


def _allocation(result: ReplayResult, title: str, path: Path) -> None:
    t = result.timeline
    x = [s.pods_arrived for s in t]
    alloc = _gpus([s.allocated_milli for s in t])
    capacity = result.capacity_milli / GPU_MILLI
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=100)
    ax.step(x, _gpus([s.arrived_milli for s in t]), where="post", color="C1", label="arrived")
    ax.step(x, alloc, where="post", color="C0", linewidth=2, label="allocated")
    ax.fill_between(x, alloc, step="post", alpha=0.2, color="C0")
    ax.axhline(capacity, linestyle=":", color="gray", label=f"capacity ({capacity:g} GPUs)")
    full = next((s for s in t if s.arrived_milli >= result.capacity_milli), None)
    if full is not None and result.capacity_milli:
        ratio = 100 * full.allocated_milli / result.capacity_milli
        ax.axvline(full.pods_arrived, linestyle="--", color="C2", alpha=0.7)
        ax.annotate(
            f"arrived = capacity:\n{ratio:.1f} % allocated",
            (full.pods_arrived, full.allocated_milli / GPU_MILLI),
            xytext=(8, -36),
            textcoords="offset points",
            fontsize="small",
            color="C2",
        )
    ax.set_xlabel(_X_LABEL)
    ax.set_ylabel("GPUs")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{title}: GPU allocation as pods arrive")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _unallocated(result: ReplayResult, title: str, path: Path) -> None:
    t = result.timeline
    x = [s.pods_arrived for s in t]
    idle = _gpus([s.idle_milli for s in t])
    frag = _gpus([s.fragment_milli for s in t])
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=100)
    ax.stackplot(
        x,
        idle,
        frag,
        step="post",
        colors=("C0", "C3"),
        alpha=0.6,
        labels=("idle GPUs (whole devices)", "fragments (free parts of devices in use)"),
    )
    ax.set_xlabel(_X_LABEL)
    ax.set_ylabel("unallocated GPUs")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{title}: unallocated GPU as pods arrive")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _pending(result: ReplayResult, title: str, path: Path, *, dropped: bool) -> None:
    t = result.timeline
    x = [s.pods_arrived for s in t]
    word = "dropped" if dropped else "pending (not retried)"
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), dpi=100, sharex=True)
    top.step(x, [s.unplaced_pods for s in t], where="post", color="C3")
    top.set_ylabel(f"pods {word.split(' ')[0]}")
    top.set_ylim(bottom=0)
    top.set_title(f"{title}: pods not placed ({word}) as pods arrive")
    top.grid(alpha=0.3)
    gpus = _gpus([s.unplaced_milli for s in t])
    bottom.step(x, gpus, where="post", color="C1")
    bottom.fill_between(x, gpus, step="post", alpha=0.2, color="C1")
    bottom.set_ylabel("GPUs they ask for")
    bottom.set_ylim(bottom=0)
    bottom.set_xlabel(_X_LABEL)
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_replay_plots(
    result: ReplayResult, out_dir: str | Path, *, title: str = "openb replay", dropped: bool = True
) -> list[Path]:
    """Write the replay's PNG plots into ``out_dir`` (created if needed); returns their paths.
    ``dropped``: unplaced pods were dropped (``--drop-unplaced``), else they stayed pending."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [
        out / "replay_allocation.png",
        out / "replay_unallocated_gpu.png",
        out / "replay_pending.png",
    ]
    _allocation(result, title, paths[0])
    _unallocated(result, title, paths[1])
    _pending(result, title, paths[2], dropped=dropped)
    return paths
