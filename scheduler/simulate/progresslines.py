"""Progress as plain lines, for when stderr is not a terminal (CI logs, ``2> run.log``).

The rich bar of :mod:`scheduler.simulate.cli` only draws on a terminal; piped, a long run
would print nothing for minutes. :class:`LineProgress` writes one line every
:attr:`LineProgress.every` seconds of wall time instead, and never on short runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["LineProgress", "fan_out"]

Describe = Callable[[float, float], str]


class LineProgress:
    """Call :meth:`update` as often as you like; it prints at most one line per ``every``."""

    def __init__(
        self,
        stream: TextIO,
        describe: Describe,
        *,
        every: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        prefix: str = "kai-scheduler simulate: ",
    ) -> None:
        self.every = every
        self._stream = stream
        self._describe = describe
        self._clock = clock
        self._prefix = prefix
        self._started = clock()
        self._next = self._started + every

    def update(self, done: float, total: float) -> None:
        """Report ``done`` of ``total`` (simulated seconds, or pods) when a line is due."""
        now = self._clock()
        if now < self._next:
            return
        self._next = now + self.every
        elapsed = now - self._started
        line = f"{self._prefix}{self._describe(done, total)}, {elapsed:.0f} s elapsed"
        print(line, file=self._stream, flush=True)


def fan_out(*targets: Callable[[float, float], None] | None) -> Callable[[float, float], None]:
    """One progress callback calling each of ``targets`` (None entries are skipped)."""
    live = [t for t in targets if t is not None]

    def call(done: float, total: float) -> None:
        for target in live:
            target(done, total)

    return call
