"""The DRA benchmark (``python -m scheduler.bench dra``): its snapshot and its independent
device check, which must catch what a wrong placement does with devices."""

from __future__ import annotations

import dataclasses
import json

import pytest

from scheduler.bench.__main__ import main
from scheduler.bench.dra import DRIVER, DraBenchSpec, check_devices, dra_snapshot
from scheduler.cluster.dra import ClaimAllocation, DeviceResult
from scheduler.cluster.snapshot import Snapshot
from scheduler.solver import PlacementSettings, solve
from scheduler.solver.placement import ClaimGrant, PodAssignment

SPEC = DraBenchSpec(nodes=6, devices=4, pods=10, fill=0.25, seed=3)


def _solved() -> tuple[Snapshot, list[PodAssignment]]:
    snap, _ = dra_snapshot(SPEC)
    placement = solve(snap, PlacementSettings(greedy_only=True, workers=1))
    return snap, list(placement.assignments)


def test_the_snapshot_has_devices_claims_and_pending_claim_pods() -> None:
    snap, mix = dra_snapshot(SPEC)
    assert snap.dra is not None
    assert len(snap.dra.slices) == 6
    assert all(len(s.devices) == 4 and s.driver == DRIVER for s in snap.dra.slices)
    pending = [p for p in snap.pods if p.node_name is None]
    assert len(pending) == sum(mix.values()) == 10
    for pod in pending:
        keys = snap.dra.claim_keys_by_pod[pod.uid]
        assert pod.resource_claims == len(keys) >= 1
        assert all(k in snap.dra.claim_by_key for k in keys)
    # fill 0.25: one device of every node is held by a running pod's allocated claim
    assert len(snap.dra.busy) == 6
    assert snap.to_json() == dra_snapshot(SPEC)[0].to_json()  # the seed decides everything


def test_a_valid_placement_passes_the_device_check() -> None:
    snap, assignments = _solved()
    assert [a for a in assignments if a.claims], "the placement allocates no claim"
    assert check_devices(snap, assignments) == []


def _first_with_allocation(assignments: list[PodAssignment]) -> tuple[int, int]:
    for i, a in enumerate(assignments):
        for j, g in enumerate(a.claims):
            if g.allocation is not None and g.allocation.results:
                return i, j
    raise AssertionError("no grant with devices")


def _replace_grant(
    assignments: list[PodAssignment], i: int, j: int, allocation: ClaimAllocation
) -> list[PodAssignment]:
    grants = list(assignments[i].claims)
    grants[j] = ClaimGrant(grants[j].claim, allocation)
    out = list(assignments)
    out[i] = dataclasses.replace(assignments[i], claims=tuple(grants))
    return out


def test_the_device_check_catches_a_device_in_use() -> None:
    snap, assignments = _solved()
    assert snap.dra is not None
    i, j = _first_with_allocation(assignments)
    busy = next(d for d in sorted(snap.dra.busy) if d[1] == assignments[i].node)
    alloc = assignments[i].claims[j].allocation
    assert alloc is not None
    results = (dataclasses.replace(alloc.results[0], device=busy[2]), *alloc.results[1:])
    wrong = _replace_grant(assignments, i, j, dataclasses.replace(alloc, results=results))
    assert any("in use" in p for p in check_devices(snap, wrong))


def test_the_device_check_catches_a_device_of_another_node() -> None:
    snap, assignments = _solved()
    i, j = _first_with_allocation(assignments)
    alloc = assignments[i].claims[j].allocation
    assert alloc is not None
    other = next(n.name for n in snap.nodes if n.name != assignments[i].node)
    r = alloc.results[0]
    moved = DeviceResult(r.request, r.driver, other, "gpu-3")
    wrong = _replace_grant(
        assignments, i, j, dataclasses.replace(alloc, results=(moved, *alloc.results[1:]))
    )
    assert any("is not on node" in p for p in check_devices(snap, wrong))


def test_the_device_check_catches_a_missing_grant_and_a_short_count() -> None:
    snap, assignments = _solved()
    i, j = _first_with_allocation(assignments)
    no_grants = list(assignments)
    no_grants[i] = dataclasses.replace(assignments[i], claims=())
    assert any("grants" in p for p in check_devices(snap, no_grants))
    alloc = assignments[i].claims[j].allocation
    assert alloc is not None
    short = _replace_grant(assignments, i, j, dataclasses.replace(alloc, results=()))
    assert any("got 0 devices" in p for p in check_devices(snap, short))


def test_the_command_prints_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["dra", "--nodes", "8", "--devices", "4", "--pods", "6", "--cycles", "1"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["bench"] == "dra"
    assert out["validator"] == out["device_check"] == "ok"
    assert out["claim_pods_placed"] == [6]
    assert out["claim_pods_without_grants"] == [0]
    assert out["devices_allocated"][0] >= 6
