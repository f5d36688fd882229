"""The outcome of one doctor check, and the exit code of a whole run.

Every check ends as ``ok``, ``warn`` or ``fail`` with a one-line message, and - unless it is
``ok`` - a one-line fix. ``warn`` is something to look at that does not stop scheduling (or
that doctor could not verify); ``fail`` means the scheduler cannot work as installed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = ["EXIT_FAIL", "EXIT_OK", "CheckResult", "Status", "exit_code", "worst"]

EXIT_OK = 0
EXIT_FAIL = 1


class Status(StrEnum):
    """How a check came out, from best to worst."""

    OK = "ok"
    WARN = "warn"
    FAIL = "fail"

    @property
    def rank(self) -> int:
        """0 for ok, 1 for warn, 2 for fail."""
        return (Status.OK, Status.WARN, Status.FAIL).index(self)


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict."""

    #: Stable identifier (``deployment``, ``leader``, ``cycle``, ``crds``, ...).
    name: str
    #: What was checked, for people.
    title: str
    status: Status
    #: One line: what doctor found.
    message: str
    #: One line: what to do about it ("" when ok).
    fix: str = ""
    #: Extra lines (one per stuck pod, per missing permission, ...).
    details: tuple[str, ...] = field(default_factory=tuple)
    #: Where the finding came from when there is a choice (the cycle age: ``metrics`` or
    #: ``lease``), else "".
    source: str = ""

    def __post_init__(self) -> None:
        if self.status is not Status.OK and not self.fix:
            raise ValueError(f"check {self.name}: a {self.status} result needs a fix")

    def to_json(self) -> dict[str, Any]:
        """The JSON form (``--output json``)."""
        out: dict[str, Any] = {
            "name": self.name,
            "title": self.title,
            "status": str(self.status),
            "message": self.message,
            "fix": self.fix,
            "details": list(self.details),
        }
        if self.source:
            out["source"] = self.source
        return out


def worst(results: Iterable[CheckResult]) -> Status:
    """The worst status among ``results`` (ok when there are none)."""
    return max((r.status for r in results), key=lambda s: s.rank, default=Status.OK)


def exit_code(results: Iterable[CheckResult]) -> int:
    """1 when any check failed, else 0 (warnings do not fail the run)."""
    return EXIT_FAIL if worst(results) is Status.FAIL else EXIT_OK
