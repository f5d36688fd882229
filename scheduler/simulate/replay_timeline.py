"""What a trace replay looked like after every cycle: arrived and allocated GPU, where the
unallocated GPU is (whole idle devices or fragments of devices in use), and what was left
unplaced. Read by :mod:`scheduler.simulate.replay_plots`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.cluster.node import GPU_MILLI
from scheduler.simulate.trace import TraceNode

__all__ = ["DeviceLedger", "ReplaySample"]


@dataclass(frozen=True, slots=True)
class ReplaySample:
    """The cluster after one replay cycle (GPU amounts in thousandths)."""

    cycle: int
    pods_arrived: int
    arrived_milli: int
    allocated_milli: int
    #: Pods not placed so far (dropped, or pending and never retried) and what they ask.
    unplaced_pods: int
    unplaced_milli: int
    #: Unallocated GPU on devices nothing uses, and the free parts of devices in use.
    idle_milli: int
    fragment_milli: int

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data (GPUs in devices)."""
        return {
            "cycle": self.cycle,
            "pods_arrived": self.pods_arrived,
            "arrived_gpu": self.arrived_milli / GPU_MILLI,
            "allocated_gpu": self.allocated_milli / GPU_MILLI,
            "unplaced_pods": self.unplaced_pods,
            "unplaced_gpu": self.unplaced_milli / GPU_MILLI,
            "idle_gpu": self.idle_milli / GPU_MILLI,
            "fragment_gpu": self.fragment_milli / GPU_MILLI,
        }


class DeviceLedger:
    """Free thousandths per GPU device, with running totals of idle and fragmented GPU."""

    def __init__(self, nodes: Sequence[TraceNode]) -> None:
        self._free = {n.name: [GPU_MILLI] * n.gpus for n in nodes}
        self.idle_milli = sum(n.gpus for n in nodes) * GPU_MILLI
        self.fragment_milli = 0

    def _count(self, free: int, sign: int) -> None:
        if free == GPU_MILLI:
            self.idle_milli += sign * free
        elif free > 0:
            self.fragment_milli += sign * free

    def take(self, node: str, grant: Sequence[tuple[int, int]]) -> None:
        """A pod placed on ``node`` took ``grant`` (device index -> thousandths)."""
        devices = self._free[node]
        for index, milli in grant:
            self._count(devices[index], -1)
            devices[index] -= milli
            self._count(devices[index], +1)
