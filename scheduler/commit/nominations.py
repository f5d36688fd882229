"""Gangs whose placement waits for evicted pods to terminate: their nominations.

A placement that evicts names, in ``Placement.waits_for``, the victims each preempting gang
waits for. Such a gang is not bound at once: its pods are *nominated* (held on their nodes in
the cache, see :mod:`scheduler.cache.holds`) and this book remembers, per gang, the
assignments, the victims and a deadline. Each commit then asks :meth:`Nominations.review`:

- every victim gone (deleted, or finished) -> *ready*: bind the gang through the normal bind
  path (assume, bind with the uid precondition), so nothing is ever bound twice;
- the deadline passed -> *expired*: drop the nomination; the gang is pending again and the
  next cycle re-plans (the victims may be stuck terminating, e.g. on a dead node);
- otherwise it keeps waiting, with a message saying for what.

Nothing here survives a restart, and nothing needs to: a new leader sees the victims
terminating, and places the gang again once they are gone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from scheduler.solver.placement import GangOutcome

__all__ = ["DEFAULT_NOMINATION_TIMEOUT", "NominatedGang", "Nominations"]

#: Seconds a nominated gang waits for its victims before the plan is dropped. Pods get 30 s
#: of termination grace by default; this leaves room for longer grace periods and slow nodes.
DEFAULT_NOMINATION_TIMEOUT = 120.0


@dataclass
class NominatedGang:
    """One gang held on its nodes until its victims are gone."""

    outcome: GangOutcome
    #: Uids of the evicted pods it waits for.
    victims: tuple[str, ...]
    #: Victim uid -> (its gang, its node), for messages.
    where: dict[str, tuple[str, str]] = field(default_factory=dict)
    since: float = 0.0
    deadline: float = 0.0
    #: An implicit gang (a lone pod) is told through its pod, others through their PodGroup.
    implicit: bool = False

    @property
    def gang(self) -> str:
        """Key of the waiting gang."""
        return self.outcome.gang

    @property
    def queue(self) -> str:
        """Its queue."""
        return self.outcome.queue

    @property
    def pod_uids(self) -> tuple[str, ...]:
        """Its nominated pods."""
        return tuple(a.pod_uid for a in self.outcome.pods)

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes its pods are held on."""
        return tuple(sorted({a.node for a in self.outcome.pods}))

    def remaining(self, gone: Callable[[str], bool]) -> list[str]:
        """Victims not gone yet."""
        return [uid for uid in self.victims if not gone(uid)]

    def waiting_message(self, gone: Callable[[str], bool]) -> str:
        """``waiting for 3 evicted pods of team-a/job-7 to terminate on node-4, node-5``."""
        left = self.remaining(gone)
        gangs = sorted({self.where[u][0] for u in left if u in self.where and self.where[u][0]})
        nodes = sorted({self.where[u][1] for u in left if u in self.where and self.where[u][1]})
        text = f"waiting for {len(left)} evicted pod{'s' if len(left) != 1 else ''}"
        if gangs:
            text += f" of {', '.join(gangs)}"
        text += " to terminate"
        if nodes:
            text += f" on {', '.join(nodes)}"
        return text


class Nominations:
    """Nominated gangs by key (see the module docstring); ``timeout`` in seconds."""

    def __init__(self, timeout: float = DEFAULT_NOMINATION_TIMEOUT) -> None:
        self.timeout = timeout
        self._gangs: dict[str, NominatedGang] = {}

    def __contains__(self, gang: object) -> bool:
        return gang in self._gangs

    def __len__(self) -> int:
        return len(self._gangs)

    def __iter__(self) -> Iterator[NominatedGang]:
        return iter(list(self._gangs.values()))

    def get(self, gang: str) -> NominatedGang | None:
        """The nominated gang ``gang``, if any."""
        return self._gangs.get(gang)

    def add(
        self,
        outcome: GangOutcome,
        victims: Iterable[str],
        now: float,
        where: Mapping[str, tuple[str, str]] | None = None,
        *,
        implicit: bool = False,
    ) -> NominatedGang:
        """Remember that ``outcome``'s gang waits for ``victims`` from ``now`` on."""
        nominated = NominatedGang(
            outcome,
            tuple(dict.fromkeys(victims)),
            dict(where or {}),
            since=now,
            deadline=now + self.timeout,
            implicit=implicit,
        )
        self._gangs[outcome.gang] = nominated
        return nominated

    def pop(self, gang: str) -> NominatedGang | None:
        """Forget ``gang`` (bound, dropped); the nominated gang, if it was one."""
        return self._gangs.pop(gang, None)

    def waiting_on(self, victims: Iterable[str]) -> list[NominatedGang]:
        """The nominated gangs that wait for any of ``victims``."""
        wanted = set(victims)
        return [g for g in self._gangs.values() if wanted.intersection(g.victims)]

    def review(
        self, gone: Callable[[str], bool], now: float
    ) -> tuple[list[NominatedGang], list[tuple[NominatedGang, str]]]:
        """(gangs whose victims are all gone, (gangs past their deadline, why)); both stay
        in the book until :meth:`pop`."""
        ready: list[NominatedGang] = []
        expired: list[tuple[NominatedGang, str]] = []
        for g in self._gangs.values():
            left = g.remaining(gone)
            if not left:
                ready.append(g)
            elif now >= g.deadline:
                expired.append(
                    (
                        g,
                        f"{len(left)} evicted pod{'s' if len(left) != 1 else ''} still not "
                        f"gone after {now - g.since:.0f}s (timeout {self.timeout:.0f}s)",
                    )
                )
        return ready, expired

    def messages(self, gone: Callable[[str], bool]) -> dict[str, str]:
        """Gang key -> what it waits for, for every nominated gang."""
        return {key: g.waiting_message(gone) for key, g in self._gangs.items()}
