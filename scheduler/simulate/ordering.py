"""Display order for the simulator's listings: natural sort (``l-2`` before ``l-13``).

Every table, JSON list and plot legend that lists names sorts them with :func:`natural_key`,
so a listing reads the way people number things and does not depend on dict or set order
(the same scenario prints the same bytes on every run, whatever ``PYTHONHASHSEED`` is).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import TypeVar

__all__ = ["natural_key", "natural_sorted"]

T = TypeVar("T")

_DIGITS = re.compile(r"(\d+)")


def natural_key(text: str) -> tuple[tuple[int, int, str], ...]:
    """A sort key that orders the digit runs in ``text`` by value: ``l-2`` < ``l-13``.

    Each part is ``(kind, number, text)`` so numbers and words never compare with each other
    (numbers first); the text breaks ties such as ``a-01`` vs ``a-1`` so the order is total.
    """
    parts: list[tuple[int, int, str]] = []
    for i, part in enumerate(_DIGITS.split(text)):
        if not part:
            continue
        if i % 2:  # split() puts the captured digit runs at odd positions
            parts.append((0, int(part), part))
        else:
            parts.append((1, 0, part))
    return tuple(parts)


def natural_sorted(items: Iterable[T], key: Callable[[T], str] | None = None) -> list[T]:
    """``items`` sorted by :func:`natural_key` of ``key(item)`` (the item itself by default)."""
    if key is None:
        return sorted(items, key=lambda item: natural_key(str(item)))
    pick = key
    return sorted(items, key=lambda item: natural_key(pick(item)))
