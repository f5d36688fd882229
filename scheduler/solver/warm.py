"""The solver's warm-up: one solve of a one-pod cluster before the first real cycle."""

from __future__ import annotations

import time

import structlog

from scheduler.cluster import CPU, GPU, PODS, GpuRequest, Node, Pod, Queue, Resources, Snapshot
from scheduler.cluster.gang import Gang
from scheduler.solver.placement import PlacementSettings
from scheduler.solver.solve import solve

__all__ = ["warm_up"]

log = structlog.get_logger(__name__)


def warm_up(settings: PlacementSettings) -> None:
    """Solve a one-pod cluster once, before the loop serves anything.

    The first solve of a process pays one-time set-up (importing OR-Tools, which is deferred
    until a model is built, and its initialisation: 25 ms against 3 ms for the next solve on
    an idle core); paying it here, while the watches list, keeps it out of the first cycle.
    """
    started = time.monotonic()
    node = Node("warm-up", Resources({CPU: 1000, GPU: 1, PODS: 1}))
    pod = Pod(
        "warm-up",
        "warm-up",
        "p",
        Resources({CPU: 100, GPU: 1}),
        gpu=GpuRequest(1),
        gang="warm-up/p",
        queue="q",
    )
    snapshot = Snapshot(
        nodes=(node,), pods=(pod,), gangs=(Gang("warm-up", "p", queue="q"),), queues=(Queue("q"),)
    )
    placement = solve(snapshot, settings)
    log.debug("warmed_up", seconds=round(time.monotonic() - started, 3), status=placement.status)
