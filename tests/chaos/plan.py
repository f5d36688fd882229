"""The seeded fault schedule of a chaos run.

A plan is a list of :class:`Fault` drawn from ``random.Random(seed)`` before the run starts and
logged, so a failing run is repeated with the same seed. Faults run one after another, each
``after`` seconds of calm following the end of the previous one (the first after the
warm-up), so a slow recovery (an API server that takes long to start) shifts the rest instead
of piling faults on top of each other. Every kind appears at least once, in a seeded order;
more are drawn while the estimated end stays within the run's duration. Bind failures are not
in the plan: the admission webhook denies its share of binds the whole time.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = ["DEFAULT_SECONDS", "Fault", "FaultKind", "estimated_length", "plan_faults"]


class FaultKind(StrEnum):
    """The faults a chaos run injects."""

    #: kill -9 the scheduler; start a new process after ``seconds``.
    SCHEDULER_KILL = "scheduler_kill"
    #: Stop kube-apiserver, keep it down ``seconds``, start it again (etcd keeps the data).
    APISERVER_RESTART = "apiserver_restart"
    #: Abort every connection between the scheduler and the API server (watches included).
    WATCH_CUT = "watch_cut"
    #: Forward no bytes between the scheduler and the API server for ``seconds``.
    RELAY_STALL = "relay_stall"
    #: Forward no bytes on the watch connections (open, client quiet) for ``seconds``, while
    #: request connections and new ones work: a half-open watch.
    WATCH_FREEZE = "watch_freeze"


#: (shortest, longest) ``seconds`` per kind; a cut is instant. A freeze outlasts 30 s, the
#: time an unconfirmed assumption used to live: the fault that made it expire under a watch
#: that had silently stopped.
DEFAULT_SECONDS: dict[FaultKind, tuple[float, float]] = {
    FaultKind.SCHEDULER_KILL: (0.5, 3.0),
    FaultKind.APISERVER_RESTART: (1.0, 4.0),
    FaultKind.WATCH_CUT: (0.0, 0.0),
    FaultKind.RELAY_STALL: (2.0, 8.0),
    FaultKind.WATCH_FREEZE: (32.0, 40.0),
}
#: Seconds a fault takes beyond its own ``seconds`` (a restart's start-up), for the estimate.
_RECOVERY = {FaultKind.SCHEDULER_KILL: 3.0, FaultKind.APISERVER_RESTART: 8.0}


@dataclass(frozen=True)
class Fault:
    """One planned fault: ``after`` seconds of calm, then ``kind`` lasting ``seconds``."""

    after: float
    kind: FaultKind
    seconds: float

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"after": round(self.after, 2), "kind": str(self.kind), "seconds": self.seconds}


def _estimate(fault: Fault) -> float:
    return fault.after + fault.seconds + _RECOVERY.get(fault.kind, 0.0)


def estimated_length(faults: Sequence[Fault]) -> float:
    """Seconds from the start of the run to the end of the last fault, roughly."""
    return sum(_estimate(f) for f in faults)


def plan_faults(
    seed: int,
    duration: float,
    *,
    warmup: float = 8.0,
    mean_gap: float = 8.0,
    quiet_end: float = 5.0,
    seconds: Mapping[FaultKind, tuple[float, float]] | None = None,
) -> list[Fault]:
    """Faults for a run of about ``duration`` seconds (module docstring): the first after
    ``warmup``, then calm gaps around ``mean_gap``; extra faults only while the estimated end
    stays ``quiet_end`` before ``duration``. ``seconds`` overrides :data:`DEFAULT_SECONDS`."""
    rng = random.Random(seed)
    ranges = {**DEFAULT_SECONDS, **(seconds or {})}
    every = list(FaultKind)
    rng.shuffle(every)
    faults: list[Fault] = []
    elapsed = 0.0
    while True:
        must = len(faults) < len(every)
        kind = every[len(faults)] if must else rng.choice(list(FaultKind))
        after = warmup if not faults else round(rng.uniform(0.5, 1.5) * mean_gap, 2)
        low, high = ranges[kind]
        fault = Fault(after, kind, round(rng.uniform(low, high), 2))
        if not must and elapsed + _estimate(fault) > duration - quiet_end:
            return faults
        faults.append(fault)
        elapsed += _estimate(fault)
