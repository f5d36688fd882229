"""Partly bound gangs: how long they have been partial, and when to give their GPUs back.

A gang is *partial* when some of its members are bound and running but fewer than
``min_member`` are (binds that failed for good, members deleted or evicted). It keeps what it
holds for its grace period (``PodGroup spec.stalenessGracePeriod``, default 60 s) - long enough
for a controller to recreate a member or the next cycles to bind the rest - after which its
bound members are evicted and the gang starts over as a whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from scheduler.cluster.gang import Gang
from scheduler.cluster.pod import Pod, PodPhase
from scheduler.cluster.snapshot import Snapshot

__all__ = ["StaleGang", "StalenessTracker", "gang_progress"]


@dataclass(frozen=True)
class StaleGang:
    """A gang whose grace period ran out, with the members to evict."""

    gang: Gang
    bound: tuple[Pod, ...]
    partial_for: float
    grace: float

    @property
    def message(self) -> str:
        """Why its members are evicted, for Events and logs."""
        return (
            f"gang {self.gang.key} had only {len(self.bound)}/{self.gang.min_member} pods "
            f"running for {self.partial_for:.0f}s (grace period "
            f"{self.grace:.0f}s); evicting it so it can start again "
            "as a whole"
        )


def gang_progress(gang: Gang, pods: Iterable[Pod]) -> tuple[list[Pod], int]:
    """(bound active members, members that count toward min_member: bound or succeeded)."""
    bound = [p for p in pods if p.bound and p.active and not p.deleting]
    succeeded = sum(1 for p in pods if p.phase == PodPhase.SUCCEEDED)
    return bound, len(bound) + succeeded


class StalenessTracker:
    """Remembers since when each gang is partial (by the caller's clock)."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}

    def partial_since(self, gang: str) -> float | None:
        """When ``gang`` was first seen partial (None if it is not)."""
        return self._since.get(gang)

    def update(
        self,
        snapshot: Snapshot,
        now: float,
        *,
        placed: Iterable[str] = (),
        grace: Callable[[Gang], float] | None = None,
    ) -> list[StaleGang]:
        """Record partial gangs of ``snapshot``; return those whose grace period ran out.

        Gangs in ``placed`` (their missing members were bound this cycle) are not partial.
        ``grace`` gives a gang's grace period (default: ``Gang.staleness_grace_seconds``).
        """
        skip = set(placed)
        seen: set[str] = set()
        stale: list[StaleGang] = []
        for gang in snapshot.gangs:
            if gang.implicit or gang.key in skip:
                continue
            bound, counted = gang_progress(gang, snapshot.pods_by_gang.get(gang.key, ()))
            if not bound or counted >= gang.min_member:
                continue
            seen.add(gang.key)
            since = self._since.setdefault(gang.key, now)
            seconds = grace(gang) if grace is not None else gang.staleness_grace_seconds
            if now - since >= seconds:
                stale.append(StaleGang(gang, tuple(bound), now - since, seconds))
        for key in list(self._since):
            if key not in seen:
                del self._since[key]
        for s in stale:
            del self._since[s.gang.key]
        return stale
