"""Problems: objects the scheduler skipped, as data the status writer turns into Events."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Problem"]


@dataclass(frozen=True, slots=True)
class Problem:
    """Something wrong with one API object that keeps it (or its pods) from being scheduled.

    ``field`` names the offending field (``metadata.annotations[gpu-fraction]``) and ``message``
    says what to change. ``uid``/``api_version``/``kind``/``namespace``/``name`` identify the
    involved object for an Event. ``reason`` is a short CamelCase code for the Event reason.
    """

    kind: str
    namespace: str
    name: str
    field: str
    message: str
    uid: str = ""
    api_version: str = ""
    reason: str = "InvalidSpec"

    @property
    def key(self) -> str:
        """``namespace/name`` (just ``name`` for cluster-scoped objects)."""
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    def describe(self) -> str:
        """One line for logs and Event notes: ``field: message``."""
        return f"{self.field}: {self.message}" if self.field else self.message
