"""PodDisruptionBudgets as the scheduler sees them: which pods they cover, how many may go."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DisruptionBudget"]


@dataclass(frozen=True, slots=True)
class DisruptionBudget:
    """A PodDisruptionBudget resolved at the edge: the uids of the pods its selector matches
    and ``status.disruptionsAllowed``. An eviction plan may take at most ``allowed`` of
    ``pod_uids`` (the Eviction API would refuse the rest)."""

    namespace: str
    name: str
    pod_uids: tuple[str, ...] = ()
    allowed: int = 0

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"
