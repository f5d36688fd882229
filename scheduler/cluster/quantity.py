"""Kubernetes resource quantities, parsed exactly (no floating point).

Kubernetes accepts ``<number><suffix>`` where the suffix is binary SI (``Ki`` … ``Ei``),
decimal SI (``n u m k M G T P E``) or a decimal exponent (``e3``, ``E-2``). We parse into a
:class:`fractions.Fraction` so ``0.1`` + ``0.2`` is exactly ``300m`` and rounding happens once,
upward, when a value is converted to the integer unit the scheduler works in (the same
rounding Kubernetes applies when it stores milli-values).
"""

from __future__ import annotations

import functools
import math
import re
from fractions import Fraction

__all__ = [
    "QuantityError",
    "format_milli",
    "parse_quantity",
    "to_int_units",
    "to_milli",
]

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_PATTERN = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)


class QuantityError(ValueError):
    """A string that is not a valid Kubernetes quantity."""


def parse_quantity(value: str | int | float | Fraction) -> Fraction:
    """Parse a Kubernetes quantity (``"500m"``, ``"1.5"``, ``"16Gi"``, ``"1e3"``) exactly.

    Integers and fractions are taken as they are; floats are accepted for YAML convenience
    (``gpu: 0.5``) and converted through their shortest decimal repr so ``0.1`` means 1/10.
    """
    if isinstance(value, bool):
        raise QuantityError(f"quantity {value!r} is a boolean; use a number such as 1 or '500m'")
    if isinstance(value, int | Fraction):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"quantity {value!r} is not a finite number")
        return Fraction(repr(value))
    if not isinstance(value, str):
        raise QuantityError(f"quantity {value!r} must be a string or a number")
    text = value.strip()
    match = _PATTERN.match(text)
    if match is None:
        raise QuantityError(
            f"quantity {value!r} is not valid: expected a number with an optional suffix "
            "such as 500m, 2, 1.5, 16Gi or 1e3"
        )
    number = Fraction(match.group("num"))
    suffix = match.group("suffix") or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    return number * Fraction(10) ** int(suffix[1:])


# A cluster uses a few dozen distinct quantity strings ("4", "32Gi", "100m") across all of
# its pods; exact Fraction parsing was the largest cost of a watch event, so strings are
# converted once. Only strings are cached (an int or Fraction is already cheap).
@functools.lru_cache(maxsize=8192)
def _milli_of(text: str) -> int:
    return math.ceil(parse_quantity(text) * 1000)


@functools.lru_cache(maxsize=8192)
def _units_of(text: str) -> int:
    return math.ceil(parse_quantity(text))


def to_milli(value: str | int | float | Fraction) -> int:
    """Quantity in thousandths, rounded up (``"500m"`` -> 500, ``"1.5"`` -> 1500)."""
    if isinstance(value, str):
        return _milli_of(value)
    return math.ceil(parse_quantity(value) * 1000)


def to_int_units(value: str | int | float | Fraction) -> int:
    """Quantity in whole units, rounded up (``"16Gi"`` -> 17179869184)."""
    if isinstance(value, str):
        return _units_of(value)
    return math.ceil(parse_quantity(value))


def format_milli(milli: int) -> str:
    """Render thousandths compactly for messages: 1500 -> ``"1.5"``, 250 -> ``"0.25"``."""
    # Exact decimal digits: float formatting would round 1234567 to "1234.57".
    sign = "-" if milli < 0 else ""
    whole, rest = divmod(abs(milli), 1000)
    if rest == 0:
        return f"{sign}{whole}"
    return f"{sign}{whole}.{rest:03d}".rstrip("0")
