"""CEL device selectors in Kubernetes' DRA environment: a table of selectors in the shapes the
Kubernetes DRA documentation and API reference use, each with devices it must and must not
match; plus the errors a user can cause (reported as values, never raised)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from scheduler.cluster.dracel import DeviceEnv, Semver, compile_selector

GI = 2**30


def gpu(
    model: str = "a100",
    memory_gi: int = 80,
    *,
    driver: str = "gpu.example.com",
    index: int = 0,
    healthy: bool = True,
    version: str = "1.2.3",
    family: str | None = None,
) -> DeviceEnv:
    """A device of the test driver: attributes model/index/healthy/driverVersion, capacity
    memory; ``family`` is published under another domain (``ext.example.com/family``)."""
    attrs: dict[str, bool | int | str | Semver] = {
        "model": model,
        "index": index,
        "healthy": healthy,
        "driverVersion": Semver(version),
    }
    if family is not None:
        attrs["ext.example.com/family"] = family
    return DeviceEnv(driver, attrs, {"memory": Fraction(memory_gi * GI)})


# (selector, devices that must match, devices that must not match)
TABLE: list[tuple[str, list[DeviceEnv], list[DeviceEnv]]] = [
    # A DeviceClass selecting one driver's devices.
    (
        'device.driver == "gpu.example.com"',
        [gpu()],
        [gpu(driver="nic.example.com")],
    ),
    # String attribute in the driver's domain (unqualified name).
    (
        'device.attributes["gpu.example.com"].model == "a100"',
        [gpu("a100")],
        [gpu("h100"), gpu(driver="nic.example.com")],
    ),
    # Single quotes, as the driver examples write them.
    (
        "device.attributes['gpu.example.com'].model.startsWith('h')",
        [gpu("h100"), gpu("h200")],
        [gpu("a100")],
    ),
    # Bool attribute.
    (
        'device.attributes["gpu.example.com"].healthy',
        [gpu(healthy=True)],
        [gpu(healthy=False)],
    ),
    # Int attribute comparison.
    (
        'device.attributes["gpu.example.com"].index < 4',
        [gpu(index=0), gpu(index=3)],
        [gpu(index=4), gpu(index=7)],
    ),
    # Capacity as a quantity: at least 40Gi.
    (
        'device.capacity["gpu.example.com"].memory.compareTo(quantity("40Gi")) >= 0',
        [gpu(memory_gi=40), gpu(memory_gi=80)],
        [gpu(memory_gi=24)],
    ),
    # Quantity equality across units (the docs' ``== quantity("64Gi")`` form).
    (
        'device.capacity["gpu.example.com"].memory == quantity("65536Mi")',
        [gpu(memory_gi=64)],
        [gpu(memory_gi=80)],
    ),
    (
        'device.capacity["gpu.example.com"].memory.isGreaterThan(quantity("40G"))',
        [gpu(memory_gi=40)],  # 40Gi > 40G
        [gpu(memory_gi=32)],
    ),
    (
        'device.capacity["gpu.example.com"].memory.isLessThan(quantity("1Ti"))',
        [gpu(memory_gi=80)],
        [gpu(memory_gi=1024)],
    ),
    # Version attribute compared as semver, not as text ("1.10.0" > "1.9.0").
    (
        'device.attributes["gpu.example.com"].driverVersion.compareTo(semver("1.9.0")) > 0',
        [gpu(version="1.10.0"), gpu(version="2.0.0")],
        [gpu(version="1.9.0"), gpu(version="1.2.3")],
    ),
    (
        'device.attributes["gpu.example.com"].driverVersion.isGreaterThan(semver("1.0.0"))',
        [gpu(version="1.0.1")],
        [gpu(version="1.0.0-rc.1"), gpu(version="1.0.0")],
    ),
    (
        'device.attributes["gpu.example.com"].driverVersion.major() == 2',
        [gpu(version="2.5.0")],
        [gpu(version="1.5.0")],
    ),
    # An attribute published under another domain.
    (
        'device.attributes["ext.example.com"].family == "hopper"',
        [gpu(family="hopper")],
        [gpu(family="ampere"), gpu()],  # gpu(): no such attribute -> no match
    ),
    # The robust form the API reference recommends: check before reading.
    (
        '"family" in device.attributes["ext.example.com"] && '
        'device.attributes["ext.example.com"].family == "hopper"',
        [gpu(family="hopper")],
        [gpu(), gpu(family="ampere")],
    ),
    # Several clauses, several drivers.
    (
        '(device.driver == "gpu.example.com"'
        ' && device.attributes["gpu.example.com"].index % 2 == 0)'
        ' || device.driver == "nic.example.com"',
        [gpu(index=2), gpu(driver="nic.example.com")],
        [gpu(index=1)],
    ),
    # A missing attribute: a runtime error, which is "no match".
    (
        'device.attributes["gpu.example.com"].numa == 0',
        [],
        [gpu()],
    ),
]


@pytest.mark.parametrize(("expression", "good", "bad"), TABLE, ids=[row[0][:60] for row in TABLE])
def test_selector_table(expression: str, good: list[DeviceEnv], bad: list[DeviceEnv]) -> None:
    selector = compile_selector(expression)
    assert selector.ok, selector.error
    for device in good:
        result = device.evaluate(selector)
        assert result.matched, (expression, result.error)
    for device in bad:
        assert not device.evaluate(selector).matched, expression


def test_unknown_domain_is_an_empty_map() -> None:
    # Kubernetes: an unknown prefix reads as an empty map, so `in` and has() are false, and
    # neither is an error.
    for expression in (
        '"x" in device.attributes["other.example.com"]',
        'has(device.capacity["other.example.com"].x)',
        'size(device.attributes["other.example.com"]) == 0',
    ):
        result = gpu().evaluate(compile_selector(expression))
        if expression.startswith("size"):
            assert result.matched, result.error
        else:
            assert result.error is None and not result.matched, (expression, result)


def test_missing_attribute_is_no_match_with_reason() -> None:
    result = gpu().evaluate(compile_selector('device.attributes["gpu.example.com"].numa == 0'))
    assert not result.matched
    assert result.error is not None and "numa" in result.error


@pytest.mark.parametrize(
    "expression",
    [
        'device.driver == "gpu.example.com" &&',
        'device.attributes["gpu.example.com"].model == "a100',
        "",
        "   ",
        "x" * (10 * 1024 + 1),
    ],
)
def test_unparsable_selector_is_reported(expression: str) -> None:
    selector = compile_selector(expression)
    assert not selector.ok and selector.error
    result = gpu().evaluate(selector)
    assert not result.matched and result.error == selector.error


def test_cel_bind_is_reported_not_silently_false() -> None:
    selector = compile_selector(
        'cel.bind(g, device.attributes["gpu.example.com"], g.model == "a100")'
    )
    assert selector.error is not None and "cel.bind" in selector.error


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ('device.attributes["gpu.example.com"].index', "int, not bool"),
        ('device.attributes["gpu.example.com"].model', "str, not bool"),
        ('device.capacity["gpu.example.com"].memory', "not bool"),
        ('device.attributes["gpu.example.com"].model > 3', "runtime error"),
        ('device.capacity["gpu.example.com"].memory.compareTo(quantity("lots")) > 0', "error"),
        ('device.attributes["gpu.example.com"].model.compareTo(semver("1.0.0")) > 0', "error"),
    ],
)
def test_non_boolean_and_runtime_errors_are_no_match(expression: str, words: str) -> None:
    selector = compile_selector(expression)
    assert selector.ok, selector.error
    result = gpu().evaluate(selector)
    assert not result.matched
    assert result.error is not None and words in result.error


def test_compiled_selectors_are_cached() -> None:
    expression = 'device.attributes["gpu.example.com"].index == 5'
    assert compile_selector(expression) is compile_selector(expression)


def test_quantity_functions() -> None:
    dev = gpu(memory_gi=80)
    for expression in (
        'device.capacity["gpu.example.com"].memory.asInteger() == 85899345920',
        'device.capacity["gpu.example.com"].memory.sub(quantity("16Gi")) == quantity("64Gi")',
        'device.capacity["gpu.example.com"].memory.add(1).isInteger()',
        'device.capacity["gpu.example.com"].memory.sign() == 1',
        'isQuantity("10Gi") && !isQuantity("ten")',
        'isSemver("1.2.3-rc.1") && !isSemver("1.2")',
        'semver("1.2.3+build.5") == semver("1.2.3")',
        'quantity("500m").asApproximateFloat() == 0.5',
    ):
        result = dev.evaluate(compile_selector(expression))
        assert result.matched, (expression, result.error)


def test_bad_version_attribute_is_a_selector_error_not_a_crash() -> None:
    dev = DeviceEnv("gpu.example.com", {"driverVersion": Semver("one")}, {})
    result = dev.evaluate(
        compile_selector(
            'device.attributes["gpu.example.com"].driverVersion.isGreaterThan(semver("1.0.0"))'
        )
    )
    assert not result.matched and result.error
