"""The simulator with ResourceClaims: jobs whose pod templates use claims (named, shared) and
claim templates (one claim per pod) are placed on nodes with matching devices; a bound pod's
devices stay taken in later cycles and come free when it ends; mistakes name their field."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from scheduler.cluster.dra import ClaimAllocation, DeviceResult
from scheduler.simulate.backend import SimulatedCluster
from scheduler.simulate.engine import SimulationResult, simulate
from scheduler.simulate.scenario import ScenarioError, parse_scenario
from scheduler.solver.placement import ClaimGrant, PodAssignment

DRIVER = "gpu.example.com"


def _model(model: str) -> str:
    return f'device.attributes["{DRIVER}"].model == "{model}"'


def _request(selectors: list[str], count: int = 1) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER, "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def _job(name: str, count: int, claims: list[dict[str, str]], **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": "team",
        "queue": "team",
        "pods": {
            "count": count,
            "template": {
                "spec": {
                    "containers": [{"name": "m", "resources": {"requests": {"cpu": 1}}}],
                    "resourceClaims": claims,
                }
            },
        },
        **extra,
    }


BASE: dict[str, Any] = {
    "name": "claims",
    "settings": {"cyclePeriod": "10s", "solver": "greedy"},
    "nodes": [{"name": "dgx", "count": 2, "gpus": 0}],
    "queues": [{"metadata": {"name": "team"}, "spec": {"resources": {"gpu": {"quota": 4}}}}],
    "deviceClasses": [
        {
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        }
    ],
    "resourceSlices": [
        {
            "metadata": {"name": f"dgx-{n}-gpus"},
            "spec": {
                "driver": DRIVER,
                "nodeName": f"dgx-{n}",
                "pool": {"name": f"dgx-{n}"},
                "devices": [
                    {"name": f"gpu-{i}", "attributes": {"model": {"string": model}}}
                    for i in range(2)
                ],
            },
        }
        for n, model in ((0, "a100"), (1, "h100"))
    ],
    "resourceClaims": [
        {"metadata": {"name": "shared", "namespace": "team"}, "spec": _request([_model("a100")])}
    ],
    "resourceClaimTemplates": [
        {
            "metadata": {"name": "one-h100", "namespace": "team"},
            "spec": {"spec": _request([_model("h100")])},
        }
    ],
    "jobs": [],
}


def _scenario(*jobs: dict[str, Any], **changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    data["jobs"] = list(jobs)
    data.update(changes)
    return data


def _bound(result: SimulationResult) -> dict[str, tuple[str | None, float | None]]:
    """Pod name -> (node, bind time) of every pod that was bound."""
    return {
        r.pod.name: (r.pod.node_name, r.bound_at)
        for r in result.cluster.pods.values()
        if r.bound_at is not None
    }


TEMPLATE = [{"name": "gpu", "resourceClaimTemplateName": "one-h100"}]


def test_template_claims_take_devices_until_their_pods_end() -> None:
    """Two h100 devices, on dgx-1 only: two pods of 10 minutes take both; a third pod that
    arrives a minute later waits for one of them to end, then binds there."""
    result = simulate(
        parse_scenario(
            _scenario(
                _job("first", 2, TEMPLATE, duration="10m"),
                _job("later", 1, TEMPLATE, at="1m", duration="10m"),
            )
        )
    )
    bound = _bound(result)
    assert bound["first-0"][0] == bound["first-1"][0] == "dgx-1", bound
    node, at = bound["later"]
    assert node == "dgx-1"
    assert at is not None and at >= 600, bound  # only once a first pod ended
    claims = result.cluster.claims
    assert claims is not None
    # Every pod has ended: its claim went with it.
    assert not [k for k in claims.claims if k != "team/shared"], claims.claims


def test_the_devices_a_cycle_allocates_are_written_into_the_claims() -> None:
    result = simulate(parse_scenario(_scenario(_job("run", 2, TEMPLATE), settings={"end": "1m"})))
    claims = result.cluster.claims
    assert claims is not None
    made = {k: c for k, c in claims.claims.items() if k.startswith("team/run-")}
    assert set(made) == {"team/run-0-gpu", "team/run-1-gpu"}
    devices = []
    for key, claim in made.items():
        assert claim.allocation is not None, key
        devices += [(r.pool, r.device) for r in claim.allocation.results]
        pod = key.removeprefix("team/").removesuffix("-gpu")
        assert [r.name for r in claim.reserved_for] == [pod]
    assert sorted(devices) == [("dgx-1", "gpu-0"), ("dgx-1", "gpu-1")]


def test_a_shared_claim_is_allocated_once_and_freed_when_its_pods_end() -> None:
    shared = [{"name": "gpu", "resourceClaimName": "shared"}]
    result = simulate(
        parse_scenario(_scenario(_job("users", 3, shared, duration="5m"), settings={"end": "2m"}))
    )
    bound = _bound(result)
    assert {bound[f"users-{i}"][0] for i in range(3)} == {"dgx-0"}, bound
    claims = result.cluster.claims
    assert claims is not None
    claim = claims.claims["team/shared"]
    assert claim.allocation is not None and len(claim.allocation.results) == 1
    assert sorted(r.name for r in claim.reserved_for) == ["users-0", "users-1", "users-2"]

    done = simulate(parse_scenario(_scenario(_job("users", 3, shared, duration="5m"))))
    assert done.cluster.claims is not None
    after = done.cluster.claims.claims["team/shared"]
    assert after.allocation is None and after.reserved_for == ()


def test_a_running_job_holds_the_devices_of_its_allocated_claim() -> None:
    """A claim allocated to dgx-1's gpu-0 by a job running from the start: a pod needing
    both h100 devices waits until that job ends."""
    data = _scenario(
        _job(
            "old",
            1,
            [{"name": "gpu", "resourceClaimName": "held"}],
            running={"nodes": ["dgx-1"], "startTime": "0s"},
            duration="5m",
        ),
        _job("both", 1, [{"name": "gpu", "resourceClaimTemplateName": "two-h100"}]),
    )
    data["resourceClaims"].append(
        {
            "metadata": {"name": "held", "namespace": "team"},
            "spec": _request([_model("h100")]),
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "gpu", "driver": DRIVER, "pool": "dgx-1", "device": "gpu-0"}
                        ]
                    }
                }
            },
        }
    )
    data["resourceClaimTemplates"].append(
        {
            "metadata": {"name": "two-h100", "namespace": "team"},
            "spec": {"spec": _request([_model("h100")], count=2)},
        }
    )
    bound = _bound(simulate(parse_scenario(data)))
    node, at = bound["both"]
    assert node == "dgx-1" and at is not None and at >= 300, bound


@pytest.mark.parametrize(
    ("claims", "running", "field", "words"),
    [
        (
            [{"name": "gpu", "resourceClaimTemplateName": "nope"}],
            False,
            "jobs[0].pods.template.spec.resourceClaims[0].resourceClaimTemplateName",
            "add it to resourceClaimTemplates",
        ),
        (
            [{"name": "gpu", "resourceClaimName": "nope"}],
            False,
            "jobs[0].pods.template.spec.resourceClaims[0].resourceClaimName",
            "add it to resourceClaims",
        ),
        (
            [{"name": "gpu", "resourceClaimName": "shared", "resourceClaimTemplateName": "x"}],
            False,
            "jobs[0].pods.template.spec.resourceClaims[0]",
            "exactly one",
        ),
        (
            [{"name": "gpu", "resourceClaimName": "shared"}] * 2,
            False,
            "jobs[0].pods.template.spec.resourceClaims[1].name",
            "used twice",
        ),
        (
            TEMPLATE,
            True,
            "jobs[0].pods.template.spec.resourceClaims[0].resourceClaimTemplateName",
            "running from the start",
        ),
        (
            [{"name": "gpu", "resourceClaimName": "shared"}],
            True,
            "jobs[0].pods.template.spec.resourceClaims[0].resourceClaimName",
            "status.allocation",
        ),
    ],
)
def test_claim_mistakes_name_the_field(
    claims: list[dict[str, str]], running: bool, field: str, words: str
) -> None:
    extra: dict[str, Any] = {"running": {"nodes": ["dgx-0"]}} if running else {}
    with pytest.raises(ScenarioError) as err:
        parse_scenario(_scenario(_job("j", 1, claims, **extra)))
    assert err.value.field == field, err.value
    assert words in str(err.value)


def test_a_template_naming_a_missing_class_names_the_field() -> None:
    data = _scenario()
    spec = data["resourceClaimTemplates"][0]["spec"]["spec"]
    spec["devices"]["requests"][0]["exactly"]["deviceClassName"] = "nic.example.com"
    with pytest.raises(ScenarioError, match="add it to deviceClasses") as err:
        parse_scenario(data)
    assert err.value.field == (
        "resourceClaimTemplates[0].spec.spec.devices.requests[0].exactly.deviceClassName"
    )


def test_grants_that_no_longer_fit_the_claims_are_not_bound() -> None:
    """The backend refuses (BindFailed) a grant of a device another claim holds, a second
    allocation of an allocated claim, and a grant for a claim that does not exist."""
    sc = parse_scenario(_scenario(_job("a", 2, TEMPLATE)))
    cluster = SimulatedCluster(sc.nodes, sc.queues, dra=sc.dra, claim_templates=sc.claim_templates)
    (job,) = sc.jobs
    cluster.add_pods(job.pods, job.gangs, claims=job.claims)
    claims = cluster.claims
    assert claims is not None
    first, second = job.pods

    def grant(pod: str, device: str) -> PodAssignment:
        alloc = ClaimAllocation((DeviceResult("gpu", DRIVER, "dgx-1", device),))
        return PodAssignment(
            f"team/{pod}", f"team/{pod}", f"team/{pod}", "dgx-1",
            claims=(ClaimGrant(f"team/{pod}-gpu", alloc),),
        )  # fmt: skip

    assert claims.problem([grant("a-0", "gpu-0"), grant("a-1", "gpu-1")]) == ""
    assert "in use" in claims.problem([grant("a-0", "gpu-0"), grant("a-1", "gpu-0")])
    claims.bind(first, grant("a-0", "gpu-0").claims)
    assert "in use" in claims.problem([grant("a-1", "gpu-0")])
    assert "allocated already" in claims.problem([grant("a-0", "gpu-1")])
    missing = PodAssignment(
        "team/a-1", "team/a-1", "team/a-1", "dgx-1", claims=(ClaimGrant("team/nope"),)
    )
    assert "does not exist" in claims.problem([missing])
    # The pod ends: its template claim goes, and with it the device.
    claims.release(first)
    assert "team/a-0-gpu" not in claims.claims
    assert claims.problem([grant("a-1", "gpu-0")]) == ""
    assert second.uid in claims.pod_claims


def test_what_if_keeps_the_snapshots_devices_and_claims() -> None:
    """A live snapshot with devices (the DRA benchmark's, small): the replay starts from
    exactly its DRA view, places the claim pods, and never gives a device twice."""
    from scheduler.bench.dra import DraBenchSpec, dra_snapshot
    from scheduler.cluster.dra_alloc import allocated_devices
    from scheduler.simulate.whatif import SnapshotCluster, replay_snapshot

    snap, _ = dra_snapshot(DraBenchSpec(nodes=4, devices=4, pods=8, fill=0.25, seed=5))
    assert snap.dra is not None
    assert SnapshotCluster(snap).snapshot_now().dra == snap.dra
    run = replay_snapshot(snap, {"placement": {"solverWorkers": 1}}, cycles=2)
    first = run.decisions[0]
    assert first.placed, first.waiting
    cluster = run.result.cluster
    assert cluster.claims is not None
    claims = list(cluster.claims.claims.values())
    held = [r.device_id for c in claims if c.allocation for r in c.allocation.results]
    assert len(held) == len(set(held)) == len(allocated_devices(claims))
    placed = {p for gang in first.placed.values() for p in gang}
    for key in placed:
        uid = cluster.pods[key].pod.uid
        for claim_key in cluster.claims.pod_claims[uid]:
            claim = cluster.claims.claims[claim_key]
            assert claim.allocation is not None, claim_key
            assert uid in {r.uid for r in claim.reserved_for}


def test_extended_resources_backed_by_dra_take_devices_until_their_pods_end() -> None:
    """A DeviceClass serving example.com/gpu, nodes that do not advertise it: pods asking 2
    get a claim made for them at bind (2 devices of one node), which holds the devices in
    later cycles and goes with the pod; a third pod waits for one to end."""
    data = _scenario()
    data["deviceClasses"][0]["spec"]["extendedResourceName"] = "example.com/gpu"

    def ext_job(name: str, **extra: Any) -> dict[str, Any]:
        job = _job(name, 1, [], **extra)
        spec = job["pods"]["template"]["spec"]
        del spec["resourceClaims"]
        spec["containers"][0]["resources"] = {
            "requests": {"cpu": 1, "example.com/gpu": 2},
            "limits": {"example.com/gpu": 2},
        }
        return job

    data["jobs"] = [
        ext_job("a", duration="10m"),
        ext_job("b", duration="10m"),
        ext_job("c", at="1m", duration="10m"),
    ]
    result = simulate(parse_scenario(data))
    bound = _bound(result)
    assert {bound["a"][0], bound["b"][0]} == {"dgx-0", "dgx-1"}, bound
    _, at = bound["c"]
    assert at is not None and at >= 600, bound  # only once a or b ended
    claims = result.cluster.claims
    assert claims is not None
    assert [k for k in claims.claims if "extended" in k] == []  # gone with their pods

    mid = simulate(parse_scenario({**data, "settings": {**data["settings"], "end": "2m"}}))
    assert mid.cluster.claims is not None
    made = {k: c for k, c in mid.cluster.claims.claims.items() if "extended-resources" in k}
    assert len(made) == 2, mid.cluster.claims.claims
    for claim in made.values():
        assert claim.allocation is not None and len(claim.allocation.results) == 2
        assert len({r.pool for r in claim.allocation.results}) == 1
