"""The pod grouper's settings, grouped by concern (the ``podgrouper`` flags fill them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.podgrouper.keys import DEFAULT_QUEUE

__all__ = ["GrouperSettings", "OperatorSettings"]


@dataclass(frozen=True)
class GrouperSettings:
    """How the controller groups pods."""

    #: Pods with one of these ``spec.schedulerName`` values are grouped.
    scheduler_names: frozenset[str] = frozenset({"kai-scheduler"})
    #: Queue written for a workload that names none.
    default_queue: str = DEFAULT_QUEUE
    #: First retry delay after a failed request, in seconds; doubles per attempt.
    retry_base: float = 1.0
    #: Longest retry delay, in seconds.
    retry_max: float = 60.0
    #: A pod already in a known PodGroup is reconciled again at most this often (seconds);
    #: its other events (status changes) cost nothing in between.
    resync_period: float = 60.0


@dataclass(frozen=True)
class OperatorSettings:
    """The process around the controller."""

    #: What the controller does.
    grouper: GrouperSettings = field(default_factory=GrouperSettings)
    #: Serve /healthz, /readyz and /metrics here (``:8081``, ``127.0.0.1:0``).
    metrics_address: str = ":8081"
    #: Objects kopf processes at once.
    worker_limit: int = 32
    #: API requests of the controller in flight at once.
    max_in_flight: int = 16
    #: Seconds an owner read from the API is reused.
    owner_ttl: float = 10.0
    #: Event reporter name (``source.component``).
    component: str = "kai-podgrouper"
    #: This process, for Events (``reportingInstance``).
    identity: str = ""
