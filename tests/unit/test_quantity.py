"""Kubernetes quantities: exact parsing, unit conversion, errors, and the resource list type."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.cluster.quantity import (
    QuantityError,
    format_milli,
    parse_quantity,
    to_int_units,
    to_milli,
)
from scheduler.cluster.resources import Resources


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("500m", Fraction(1, 2)),
        ("1.5", Fraction(3, 2)),
        ("16Gi", 16 * 2**30),
        ("1Ki", 1024),
        ("2M", 2_000_000),
        ("1e3", 1000),
        ("1E-3", Fraction(1, 1000)),
        ("1E3", 1000),
        (".5", Fraction(1, 2)),
        ("+.5", Fraction(1, 2)),
        ("5.", 5),
        ("-1", -1),
        ("100n", Fraction(1, 10**7)),
        ("3u", Fraction(3, 10**6)),
        ("1E", 10**18),  # E alone is the exa suffix, not an exponent
        (" 2 ", 2),
        ("0.1", Fraction(1, 10)),
    ],
)
def test_parse_quantity_exact(text: str, expected: Fraction | int) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    "text", ["", ".", "1e", "e3", "1..2", "1 Gi", "0x10", "1ki", "abc", "1Gib", "--1", "1.2.3"]
)
def test_parse_quantity_rejects_invalid_strings(text: str) -> None:
    with pytest.raises(QuantityError, match="not valid"):
        parse_quantity(text)


@pytest.mark.parametrize("value", [True, None, [1], float("inf"), float("nan")])
def test_parse_quantity_rejects_non_quantities(value: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(value)  # type: ignore[arg-type]


def test_numbers_pass_through_exactly() -> None:
    assert parse_quantity(3) == 3
    assert parse_quantity(0.1) == Fraction(1, 10)  # shortest repr, not the binary float
    assert parse_quantity(Fraction(2, 3)) == Fraction(2, 3)


def test_decimal_sums_are_exact() -> None:
    assert to_milli(parse_quantity("0.1") + parse_quantity("0.2")) == 300


@pytest.mark.parametrize(
    ("text", "milli"),
    [("500m", 500), ("1.5", 1500), ("2", 2000), ("0.0001", 1), ("1u", 1), ("1e-3", 1)],
)
def test_to_milli_rounds_up(text: str, milli: int) -> None:
    assert to_milli(text) == milli


@pytest.mark.parametrize(
    ("text", "units"), [("16Gi", 17179869184), ("1.5", 2), ("1k", 1000), ("100m", 1)]
)
def test_to_int_units_rounds_up(text: str, units: int) -> None:
    assert to_int_units(text) == units


@pytest.mark.parametrize(
    ("milli", "text"),
    [
        (1500, "1.5"),
        (250, "0.25"),
        (2000, "2"),
        (1, "0.001"),
        (0, "0"),
        (1234567, "1234.567"),
        (-1500, "-1.5"),
    ],
)
def test_format_milli(milli: int, text: str) -> None:
    assert format_milli(milli) == text


@given(st.integers(min_value=-(10**12), max_value=10**12))
def test_format_milli_round_trips(milli: int) -> None:
    assert to_milli(format_milli(milli)) == milli


def test_resources_from_k8s_units_and_errors() -> None:
    res = Resources.from_k8s({"cpu": "250m", "memory": "1Gi", "nvidia.com/gpu": "2"})
    assert res == {"cpu": 250, "memory": 2**30, "nvidia.com/gpu": 2}
    with pytest.raises(QuantityError, match=r"spec\.x\.memory"):
        Resources.from_k8s({"memory": "lots"}, field="spec.x")
    with pytest.raises(QuantityError, match="must not be negative"):
        Resources.from_k8s({"cpu": "-1"})


def test_resources_arithmetic_drops_zeros() -> None:
    a = Resources({"cpu": 1000, "memory": 0})
    assert a == Resources({"cpu": 1000})
    assert hash(a) == hash(Resources({"cpu": 1000}))
    assert (a - {"cpu": 1000}) == Resources()
    assert (a + {"memory": 5})["memory"] == 5
    assert a.scaled(3)["cpu"] == 3000
    assert a.fits_in({"cpu": 1000}) and not a.fits_in({"cpu": 999})
    assert a.shortfall({"cpu": 400}) == {"cpu": 600}
    assert Resources({"b": 1, "a": 2}).to_dict() == {"a": 2, "b": 1}
