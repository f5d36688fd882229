"""Gangs: groups of pods that run together or not at all (a PodGroup)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Gang"]


@dataclass(frozen=True, slots=True)
class Gang:
    """A PodGroup: ``min_member`` pods must be placed in the same cycle or none is.

    Pods beyond ``min_member`` are elastic extras: placed only after every admissible gang.
    A pod that names no PodGroup forms an implicit gang of one (``implicit=True``).
    """

    namespace: str
    name: str
    min_member: int = 1
    queue: str = ""
    priority: int = 0
    preemptible: bool = True
    creation_time: float = 0.0
    staleness_grace_seconds: float = 60.0
    implicit: bool = False
    #: A pending gang waits this long after creation before it may evict anyone
    #: (``PodGroup.spec.preemptionDelay`` / annotation ``kai.scheduler/preemption-delay``).
    preemption_delay_seconds: float = 0.0
    #: False when its PriorityClass says ``preemptionPolicy: Never``: it never evicts.
    may_preempt: bool = True
    #: PodGroup fields that affect placement and are not implemented yet (the gang waits
    #: with a reason naming them; see docs/constraints.md).
    unsupported: tuple[str, ...] = ()

    #: ``namespace/name``, the key pods use in :attr:`Pod.gang` (computed once: every pass
    #: of a cycle looks gangs up by it).
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", f"{self.namespace}/{self.name}")
