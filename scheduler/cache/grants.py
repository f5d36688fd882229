"""The GPU device grant a pod was bound with, kept in a pod annotation.

When the scheduler binds a GPU pod it records which devices it took, as
``kai.scheduler/gpu-grant: {"<device index>": <thousandths>, ...}``, so a restarted scheduler
rebuilds exact per-device accounting from the pods alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from scheduler.cluster.node import GPU_MILLI

__all__ = [
    "GPU_GRANT_ANNOTATION",
    "GpuGrant",
    "GrantError",
    "format_gpu_grant",
    "normalize_grant",
    "parse_gpu_grant",
]

GPU_GRANT_ANNOTATION = "kai.scheduler/gpu-grant"

#: Device index -> thousandths, sorted by index (the form :attr:`Pod.gpu_grant` uses).
GpuGrant = tuple[tuple[int, int], ...]


class GrantError(ValueError):
    """An annotation value that is not a valid grant; the message says the expected form."""


def normalize_grant(grant: Mapping[int, int] | Iterable[tuple[int, int]]) -> GpuGrant:
    """Sorted ``((index, milli), ...)`` from a mapping or pairs."""
    pairs = grant.items() if isinstance(grant, Mapping) else grant
    return tuple(sorted((int(i), int(m)) for i, m in pairs))


def format_gpu_grant(grant: Mapping[int, int] | Iterable[tuple[int, int]]) -> str:
    """The annotation value for ``grant`` (compact JSON object, keys are device indexes)."""
    return json.dumps({str(i): m for i, m in normalize_grant(grant)}, separators=(",", ":"))


def parse_gpu_grant(raw: str) -> GpuGrant:
    """Parse an annotation value; raises :class:`GrantError` naming what is wrong."""
    expected = 'expected a JSON object of device index to thousandths, e.g. {"0": 500}'
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise GrantError(f"{raw!r} is not JSON; {expected}") from e
    if not isinstance(data, dict):
        raise GrantError(f"{raw!r}: {expected}")
    out: dict[int, int] = {}
    for key, value in data.items():
        try:
            index = int(key)
        except ValueError:
            raise GrantError(f"device index {key!r} is not a whole number; {expected}") from None
        if index < 0:
            raise GrantError(f"device index {index} is negative; {expected}")
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= GPU_MILLI:
            raise GrantError(
                f"device {index}: {value!r} must be whole thousandths between 1 and {GPU_MILLI}"
            )
        out[index] = value
    return normalize_grant(out)
