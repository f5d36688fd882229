"""Gangs that consolidation moved, until they run again.

Consolidation evicts a running gang only when the same cycle finds it a new place; the pods
restart there once their controllers recreate them. Between the eviction and the restart the
room planned for them is free, and without a mark any other pending gang (a victim of the same
cycle restarting, a new arrival) could take it first: the moved gang would then have lost its
place, and take it back by reclaim or preemption - eviction after eviction, cycle after
cycle. So the backend notes every moved gang here, the snapshot lists the ones still waiting
(:attr:`Snapshot.restoring`), and the solver admits them before anything else.

A mark ends when the gang is bound again or after ``window`` seconds (a controller that never
recreates its pods must not keep a claim on the ordering forever).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["DEFAULT_RESTORE_WINDOW", "RestoringGangs"]

#: Seconds a moved gang keeps its place at the head of the admission order.
DEFAULT_RESTORE_WINDOW = 600.0


class RestoringGangs:
    """Moved gang keys and when they were moved."""

    def __init__(self, window: float = DEFAULT_RESTORE_WINDOW) -> None:
        self.window = window
        self._moved: dict[str, float] = {}

    def moved(self, gangs: Iterable[str], now: float) -> None:
        """``gangs`` were evicted by consolidation at ``now``."""
        for g in gangs:
            self._moved[g] = now

    def bound(self, gang: str) -> None:
        """``gang`` was placed again: it no longer needs its head start."""
        self._moved.pop(gang, None)

    def current(self, now: float) -> frozenset[str]:
        """Gangs moved within the window (older marks are dropped)."""
        for g in [g for g, t in self._moved.items() if now - t > self.window]:
            del self._moved[g]
        return frozenset(self._moved)
