"""Reading scenario YAML field by field: each reader names the field path in its errors.

A :class:`ScenarioError` carries the path (``jobs[2].pods.count``) and what to change, so the
CLI can print one line and exit 2 instead of a traceback.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from scheduler.cluster.queuespec import SpecError, parse_duration

__all__ = [
    "ScenarioError",
    "check_known",
    "read_choice",
    "read_count",
    "read_list",
    "read_mapping",
    "read_name",
    "read_seconds",
    "read_string_map",
]


class ScenarioError(ValueError):
    """A scenario field that cannot be used; ``field`` is its path in the file."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def read_mapping(value: Any, path: str) -> Mapping[str, Any]:
    """A mapping (None reads as empty)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ScenarioError(path, f"must be a mapping (key: value), got {type(value).__name__}")
    return value


def read_list(value: Any, path: str) -> list[Any]:
    """A list (None reads as empty)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ScenarioError(path, f"must be a list, got {type(value).__name__}")
    return value


def check_known(data: Mapping[str, Any], path: str, allowed: tuple[str, ...]) -> None:
    """Reject keys outside ``allowed`` (typos would otherwise be silently ignored)."""
    for key in data:
        if key not in allowed:
            prefix = f"{path}." if path else ""
            raise ScenarioError(
                f"{prefix}{key}", f"unknown field; expected one of {', '.join(allowed)}"
            )


def read_name(value: Any, path: str) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise ScenarioError(path, "must be a non-empty name")
    return value


def read_count(value: Any, path: str, *, allow_zero: bool = False) -> int:
    """A whole number, at least 1 (or 0 with ``allow_zero``)."""
    ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok or value < (0 if allow_zero else 1):
        what = "a whole number >= 0" if allow_zero else "a positive whole number"
        raise ScenarioError(path, f"must be {what}, got {value!r}")
    return int(value)


def read_seconds(value: Any, path: str) -> float:
    """A duration such as ``30s``, ``10m``, ``1h30m`` or a number of seconds."""
    try:
        seconds = parse_duration(value, path)
    except SpecError as e:
        raise ScenarioError(path, e.message) from e
    if not math.isfinite(seconds) or seconds < 0:
        raise ScenarioError(path, f"{value!r} must be a finite duration >= 0, e.g. 30s or 10m")
    return seconds


def read_choice(value: Any, path: str, choices: tuple[str, ...]) -> str:
    """One of ``choices``."""
    if value not in choices:
        raise ScenarioError(path, f"{value!r} must be one of {', '.join(choices)}")
    return str(value)


def read_string_map(value: Any, path: str) -> dict[str, str]:
    """A mapping of strings (labels, annotations, nodeSelector)."""
    out: dict[str, str] = {}
    for k, v in read_mapping(value, path).items():
        if isinstance(v, bool) or v is None:
            raise ScenarioError(f"{path}.{k}", 'must be a string (quote it, e.g. "true")')
        out[str(k)] = str(v)
    return out
