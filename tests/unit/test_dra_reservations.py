"""In-flight device reservations (scheduler/cache/dra_reservations.py)."""

from __future__ import annotations

from scheduler.cache.dra_reservations import DraReservations
from scheduler.cluster.dra import ClaimAllocation, DeviceResult


def alloc(*devices: str, pool: str = "n1", admin: bool = False) -> ClaimAllocation:
    return ClaimAllocation(
        tuple(DeviceResult("gpu", "gpu.example.com", pool, d, admin_access=admin) for d in devices)
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_reserve_release_settle() -> None:
    r = DraReservations()
    assert r.devices() == frozenset()
    assert r.reserve("ns/a", alloc("gpu-0", "gpu-1")) is None
    assert r.devices() == {("gpu.example.com", "n1", "gpu-0"), ("gpu.example.com", "n1", "gpu-1")}
    assert r.allocation("ns/a") == alloc("gpu-0", "gpu-1")
    assert "ns/a" in r and len(r) == 1
    r.release("ns/a")
    assert r.devices() == frozenset() and "ns/a" not in r
    assert r.reserve("ns/a", alloc("gpu-0")) is None
    r.settle("ns/a")
    assert r.devices() == frozenset() and r.allocation("ns/a") is None
    r.settle("ns/a")  # settling or releasing what is not held is a no-op
    r.release("ns/a")


def test_a_device_is_never_reserved_for_two_claims() -> None:
    r = DraReservations()
    assert r.reserve("ns/a", alloc("gpu-0")) is None
    why = r.reserve("ns/b", alloc("gpu-1", "gpu-0"))
    assert why == (
        "device gpu.example.com/n1/gpu-0 is being allocated to ResourceClaim ns/a by a commit "
        "in flight, so ResourceClaim ns/b cannot have it"
    )
    # Nothing of the refused reservation was kept.
    assert r.devices() == {("gpu.example.com", "n1", "gpu-0")}
    assert "ns/b" not in r
    # The same device name in another pool is another device.
    assert r.reserve("ns/b", alloc("gpu-0", pool="n2")) is None


def test_a_claim_is_held_with_one_allocation_counted_per_commit() -> None:
    r = DraReservations()
    assert r.reserve("ns/a", alloc("gpu-0")) is None
    assert r.reserve("ns/a", alloc("gpu-1")) == (
        "ResourceClaim ns/a is being allocated other devices by a commit in flight"
    )
    assert r.reserve("ns/a", alloc("gpu-0")) is None  # a second commit, same devices
    r.release("ns/a")
    assert r.devices() == {("gpu.example.com", "n1", "gpu-0")}  # the other commit holds it
    r.release("ns/a")
    assert r.devices() == frozenset()


def test_reserve_all_is_all_or_nothing() -> None:
    r = DraReservations()
    assert r.reserve("ns/x", alloc("gpu-3")) is None
    why = r.reserve_all([("ns/a", alloc("gpu-0")), ("ns/b", alloc("gpu-3"))])
    assert why is not None and "ResourceClaim ns/x" in why
    assert r.devices() == {("gpu.example.com", "n1", "gpu-3")}
    why = r.reserve_all([("ns/a", alloc("gpu-0")), ("ns/b", alloc("gpu-0"))])
    assert why == (
        "device gpu.example.com/n1/gpu-0 was chosen for both ResourceClaim ns/a and "
        "ResourceClaim ns/b"
    )
    why = r.reserve_all([("ns/a", alloc("gpu-0")), ("ns/a", alloc("gpu-1"))])
    assert why == "ResourceClaim ns/a was given two different allocations"
    assert r.reserve_all([("ns/a", alloc("gpu-0")), ("ns/b", alloc("gpu-1"))]) is None
    assert len(r) == 3


def test_admin_access_holds_no_device() -> None:
    r = DraReservations()
    assert r.reserve("ns/monitor", alloc("gpu-0", admin=True)) is None
    assert r.devices() == frozenset()
    assert r.reserve("ns/a", alloc("gpu-0")) is None


def test_reservations_expire() -> None:
    clock = Clock()
    r = DraReservations(ttl=10, clock=clock)
    assert r.reserve("ns/a", alloc("gpu-0")) is None
    clock.now = 8
    assert r.reserve("ns/b", alloc("gpu-1")) is None
    clock.now = 10.5
    assert r.devices() == {("gpu.example.com", "n1", "gpu-1")}
    assert "ns/a" not in r
    clock.now = 100
    assert r.expire() == ["ns/b"]
    assert r.devices() == frozenset()


def test_forbidden_writes_come_back_only_with_the_latest_token() -> None:
    r = DraReservations()
    assert r.forbidden is None
    first = r.forbid_writes("no")
    second = r.forbid_writes("still no")
    r.allow_writes(first)
    assert r.forbidden == "still no"
    r.allow_writes(second)
    assert r.forbidden is None


def test_a_created_claim_is_renamed_from_its_stand_in_key() -> None:
    r = DraReservations()
    assert r.reserve("ns/<extended-resources:p>", alloc("gpu-0")) is None
    r.rename("ns/<extended-resources:p>", "ns/p-extended-resources-x1")
    assert "ns/<extended-resources:p>" not in r
    assert r.allocation("ns/p-extended-resources-x1") == alloc("gpu-0")
    why = r.reserve("ns/other", alloc("gpu-0"))
    assert why is not None and "ResourceClaim ns/p-extended-resources-x1" in why
    r.settle("ns/p-extended-resources-x1")
    assert r.devices() == frozenset()
    r.rename("ns/missing", "ns/x")  # nothing held: nothing happens
    assert len(r) == 0
