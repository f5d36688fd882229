"""Leader election against the real API server, in-process, with the scheduler's own
ServiceAccount (so the Lease permissions of manifests/ are what is tested)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio.client import ApiClient

from scheduler.config import LeaderElectionSettings
from scheduler.k8s.client import ClientSettings, make_api_client
from scheduler.k8s.errors import Forbidden
from scheduler.k8s.lease import LeaderElector
from tests.e2e.scheduler_process import KaiCluster, kai_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]
__all__ = ["kai_cluster"]  # fixture used by this module


@pytest.fixture
async def api(kai_cluster: KaiCluster) -> AsyncIterator[ApiClient]:
    client = await make_api_client(ClientSettings(kube_config=str(kai_cluster.kubeconfig)))
    try:
        yield client
    finally:
        await client.close()


def _settings(**overrides: object) -> LeaderElectionSettings:
    base = {
        "lease_name": f"lease-test-{uuid.uuid4().hex[:8]}",
        "lease_duration": 2.0,
        "renew_deadline": 1.5,
        "retry_period": 0.2,
    }
    base.update(overrides)
    return LeaderElectionSettings(**base)  # type: ignore[arg-type]


async def test_exactly_one_of_two_candidates_leads(api: ApiClient) -> None:
    settings = _settings()
    a, b = LeaderElector(api, settings, "a"), LeaderElector(api, settings, "b")
    results = await asyncio.gather(a.try_acquire_or_renew(), b.try_acquire_or_renew())
    assert sorted(results) == [False, True]
    for _ in range(3):  # renewals keep it that way
        await a.try_acquire_or_renew()
        await b.try_acquire_or_renew()
    assert [a.is_leader(), b.is_leader()].count(True) == 1


async def test_standby_waits_for_expiry_and_silent_leader_steps_down(api: ApiClient) -> None:
    settings = _settings()
    a, b = LeaderElector(api, settings, "a"), LeaderElector(api, settings, "b")
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    started = time.monotonic()
    # a stops renewing (as if partitioned); b keeps trying.
    while not await b.try_acquire_or_renew():
        assert time.monotonic() - started < 10, "standby never took over"
        await asyncio.sleep(0.1)
    waited = time.monotonic() - started
    assert waited >= settings.lease_duration - 0.2, f"took over after only {waited:.2f}s"
    # The silent leader stopped acting after renew_deadline, before b could take over.
    assert not a.is_leader()
    assert b.is_leader()
    assert not await a.try_acquire_or_renew()


async def test_release_hands_over_at_once(api: ApiClient) -> None:
    settings = _settings(lease_duration=30.0, renew_deadline=20.0, retry_period=1.0)
    a, b = LeaderElector(api, settings, "a"), LeaderElector(api, settings, "b")
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    await a.release()
    assert not a.is_leader()
    assert await b.try_acquire_or_renew()


async def test_run_loop_leads_until_stopped_then_releases(api: ApiClient) -> None:
    settings = _settings()
    changes: list[bool] = []
    a = LeaderElector(api, settings, "a", on_change=changes.append)
    stop = asyncio.Event()
    task = asyncio.create_task(a.run(stop))
    for _ in range(50):
        if a.is_leader():
            break
        await asyncio.sleep(0.05)
    assert a.is_leader()
    stop.set()
    await asyncio.wait_for(task, timeout=5)
    assert changes == [True, False]
    b = LeaderElector(api, settings, "b")
    assert await b.try_acquire_or_renew()  # released, so no waiting for expiry


async def test_rbac_allows_leases_only_in_the_scheduler_namespace(api: ApiClient) -> None:
    elector = LeaderElector(api, _settings(lease_namespace="default"), "a")
    with pytest.raises(Forbidden):
        await elector.try_acquire_or_renew()
    assert not elector.is_leader()
