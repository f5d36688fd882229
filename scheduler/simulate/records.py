"""What the simulator remembers about pods, gangs, evictions and nominations over a run.

Mutable records owned by :class:`scheduler.simulate.backend.SimulatedCluster`; the report and
the plots read them after the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.cluster.gang import Gang
from scheduler.cluster.pod import Pod
from scheduler.solver.placement import Eviction, PodAssignment

__all__ = ["EvictionRecord", "GangRecord", "Nomination", "PodRecord"]


@dataclass
class PodRecord:
    """One pod's life in the simulation."""

    pod: Pod
    arrived_at: float
    #: Seconds the pod runs once bound; None = until the simulation ends.
    duration: float | None = None
    bound_at: float | None = None
    finished_at: float | None = None
    #: Termination grace period if evicted (None: the cluster's default).
    grace: float | None = None
    #: Set when the pod was evicted: why, and when it leaves (the end of its grace period).
    eviction: Eviction | None = None
    leaves_at: float | None = None
    #: Uid of the pod that replaced this one after its eviction (and the reverse link).
    replaced_by: str | None = None
    replaces: str | None = None
    #: The scenario's pod name, and how many replacements stand between it and this pod.
    base_name: str = ""
    generation: int = 0

    @property
    def finishes_at(self) -> float | None:
        """When a running pod completes (None if unbound, held, or endless)."""
        if self.bound_at is None or self.duration is None or self.finished_at is not None:
            return None
        return self.bound_at + self.duration

    @property
    def terminating(self) -> bool:
        """Evicted but still holding its resources (within its grace period)."""
        return self.eviction is not None and self.finished_at is None


@dataclass(frozen=True)
class EvictionRecord:
    """One pod evicted at one time (what the report and the plots count)."""

    time: float
    eviction: Eviction
    #: GPU thousandths the pod held.
    gpu: int


@dataclass
class Nomination:
    """A placed gang held on its nodes until the pods evicted for it are gone."""

    gang: str
    assignments: list[PodAssignment]
    #: Uids of the evicted pods it waits for.
    victims: tuple[str, ...]
    since: float


@dataclass
class GangRecord:
    """One gang's story: when it arrived, when it was placed, why it waited."""

    gang: Gang
    arrived_at: float
    pod_uids: list[str] = field(default_factory=list)
    #: When the gang was last placed (None while it waits, also again after a restart).
    placed_at: float | None = None
    #: The first reason the scheduler gave while the gang waited (why it did not start at once).
    first_reason: tuple[str, str] | None = None
    #: The latest reason; cleared when the gang is placed.
    last_reason: tuple[str, str] | None = None
    #: Cycles in which the gang was considered but not placed.
    waited_cycles: int = 0
    #: Cycles in which the backend could not bind a placed gang (rolled back).
    failed_binds: int = 0
    #: Times every running pod of the gang was evicted, so the job started over.
    restarts: int = 0
    #: When the last restart happened (the gang waits again from then on).
    restarted_at: float | None = None
    #: When the gang was first placed (kept across restarts).
    first_placed_at: float | None = None
    #: Pods of this gang evicted over the run.
    evictions: list[EvictionRecord] = field(default_factory=list)
    #: Pods evicted elsewhere to make room for this gang.
    made_room: list[EvictionRecord] = field(default_factory=list)

    @property
    def queued_at(self) -> float:
        """Since when the gang waits (its arrival, or its last restart)."""
        return self.arrived_at if self.restarted_at is None else self.restarted_at
