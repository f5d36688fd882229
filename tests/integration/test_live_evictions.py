"""Taking back on the live path, against a real API server: evictions through the Eviction API
(DisruptionTarget first, PodDisruptionBudgets honoured), nominated gangs held on their nodes
and bound only once their victims are gone, and no write from a replica that does not lead.

The placements that evict are built by hand (the solver's part is tested on its own); every
cycle that only places runs the real solver with taking back off, so nothing but the test's
plan evicts anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from scheduler.cache import Cache
from scheduler.cluster.snapshot import Snapshot
from scheduler.commit import LiveBackend
from scheduler.cycle import run_cycle
from scheduler.fairness import compute_fair_shares
from scheduler.k8s.client import ClientSettings, make_api_client, open_stream, request_json
from scheduler.k8s.resources import POD
from scheduler.k8s.watch import Watcher
from scheduler.k8s.writer import Writer
from scheduler.metrics import SchedulerMetrics
from scheduler.solver import PlacementSettings
from scheduler.solver.placement import EvictAction, Eviction, GangOutcome, Placement, PodAssignment
from testenv.controlplane import ControlPlane
from tests.integration.support import FAST_WATCH, eventually, kubectl, watched

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

#: Nobody else schedules these pods: only what the tests run binds or evicts them.
SCHED = "kai-scheduler-live-evictions"
#: Cycles that only place (taking back is what the tests plan by hand).
PLACE_ONLY = PlacementSettings(take_back=False)
FAST = FAST_WATCH


def gpu_pod(
    name: str,
    *,
    node: str | None = None,
    group: str | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": SCHED,
        "containers": [
            {
                "name": "main",
                "image": "registry.invalid/fake:1",
                "resources": {
                    "requests": {"cpu": "1", "nvidia.com/gpu": "1"},
                    "limits": {"cpu": "1", "nvidia.com/gpu": "1"},
                },
            }
        ],
    }
    if node:
        spec["nodeName"] = node  # created bound: kwok runs it
    meta: dict[str, Any] = {"name": name, "labels": labels or {}}
    if group:
        meta["annotations"] = {"pod-group-name": group}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def podgroup(name: str, min_member: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"minMember": min_member, "queue": "default-queue"},
    }


async def create(cp: ControlPlane, namespace: str, *objs: dict[str, Any]) -> None:
    docs = {"apiVersion": "v1", "kind": "List", "items": list(objs)}
    await kubectl(cp, "apply", "-n", namespace, "-f", "-", input=json.dumps(docs))


async def get_pod(api: ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    return await Writer(api).get_pod(namespace, name)


async def running(api: ApiClient, namespace: str, *names: str) -> dict[str, dict[str, Any]]:
    """Wait until kwok runs every named pod; the pods."""
    pods: dict[str, dict[str, Any]] = {}

    async def all_running() -> bool:
        for name in names:
            pod = await get_pod(api, namespace, name)
            if pod is None or (pod.get("status") or {}).get("phase") != "Running":
                return False
            pods[name] = pod
        return True

    for _ in range(300):
        if await all_running():
            return pods
        await asyncio.sleep(0.1)
    raise AssertionError(f"pods {names} never ran: {pods}")


async def gone(api: ApiClient, namespace: str, name: str, timeout: float = 30.0) -> None:
    for _ in range(int(timeout * 10)):
        if await get_pod(api, namespace, name) is None:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"pod {namespace}/{name} still exists after {timeout}s")


def condition(pod: dict[str, Any], kind: str) -> dict[str, Any] | None:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), None)


async def events(api: ApiClient, namespace: str) -> list[dict[str, Any]]:
    body = await request_json(api, "GET", f"/api/v1/namespaces/{namespace}/events")
    return list((body or {}).get("items") or [])


async def event_with(api: ApiClient, namespace: str, obj: str, reason: str) -> dict[str, Any]:
    for _ in range(100):
        for e in await events(api, namespace):
            if e["involvedObject"]["name"] == obj and e["reason"] == reason:
                return e
        await asyncio.sleep(0.1)
    raise AssertionError(f"no {reason} Event on {obj}: {await events(api, namespace)}")


def eviction(
    victim: dict[str, Any], for_gang: str, action: EvictAction = "preempt", gang: str = ""
) -> Eviction:
    meta = victim["metadata"]
    key = f"{meta['namespace']}/{meta['name']}"
    return Eviction(
        pod_uid=meta["uid"],
        pod_key=key,
        gang=gang or key,
        queue="default-queue",
        node=victim["spec"]["nodeName"],
        action=action,
        for_gang=for_gang,
        message=f"{action} for {for_gang}, which has a higher priority",
    )


def take_back(
    snapshot: Snapshot, places: dict[str, tuple[str, dict[int, int]]], evictions: list[Eviction]
) -> Placement:
    """A placement that puts ``places`` (pod key -> node, grant) and evicts ``evictions``,
    each placed gang waiting for every victim."""
    pods = {p.key: p for p in snapshot.pods}
    assignments = tuple(
        PodAssignment(pods[k].uid, k, pods[k].gang, node, tuple(sorted(grant.items())))
        for k, (node, grant) in places.items()
    )
    outcomes: dict[str, GangOutcome] = {}
    for a in assignments:
        queue = snapshot.gang_by_key[a.gang].queue
        previous = outcomes.get(a.gang)
        members = (previous.pods if previous else ()) + (a,)
        outcomes[a.gang] = GangOutcome(a.gang, queue, True, members)
    victims = tuple(e.pod_uid for e in evictions)
    return Placement(
        assignments=assignments,
        outcomes=outcomes,
        evictions=tuple(evictions),
        waits_for=dict.fromkeys(outcomes, victims),
    )


async def commit(backend: LiveBackend, snapshot: Snapshot, placement: Placement) -> None:
    await backend.commit(snapshot, placement, compute_fair_shares(snapshot))
    await backend.flush()


# --- the writer ----------------------------------------------------------------------------


async def test_evict_marks_disruption_target_then_deletes_the_pod(
    control_plane: ControlPlane, api: ApiClient, namespace: str, make_gpu_nodes: Any
) -> None:
    (node,) = await asyncio.to_thread(make_gpu_nodes, 1, gpus=1)
    await create(control_plane, namespace, gpu_pod("victim", node=node))
    victim = (await running(api, namespace, "victim"))["victim"]
    uid = victim["metadata"]["uid"]
    # Record every state the pod goes through: the eviction replaces our condition's reason
    # with its own (EvictionByEvictionAPI), and kwok removes the pod right after.
    seen: list[dict[str, Any]] = []
    query = {
        "watch": True,
        "resourceVersion": victim["metadata"]["resourceVersion"],
        "fieldSelector": "metadata.name=victim",
    }
    stream = await open_stream(api, POD.list_path(namespace), query=query)

    async def record() -> None:
        async with stream:
            while line := await stream.content.readline():
                event = json.loads(line)
                seen.append(event)
                if event["type"] == "DELETED":
                    return

    recorder = asyncio.create_task(record())
    try:
        outcome = await Writer(api).evict(namespace, "victim", uid, message="made room for ns/x")
        assert outcome.status == "evicted" and outcome, outcome
        await asyncio.wait_for(recorder, 30)
    finally:
        recorder.cancel()
        await asyncio.gather(recorder, return_exceptions=True)
    marked = [condition(e["object"], "DisruptionTarget") for e in seen]
    first_marked = next(i for i, m in enumerate(marked) if m is not None)
    assert {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "PreemptionByScheduler",
        "message": "made room for ns/x",
    }.items() <= (marked[first_marked] or {}).items(), seen
    # The condition was there before the pod started terminating.
    first_deleting = next(
        i for i, e in enumerate(seen) if e["object"]["metadata"].get("deletionTimestamp")
    )
    assert first_marked < first_deleting, seen
    assert all(m is not None for m in marked[first_marked : first_deleting + 1])
    assert seen[-1]["type"] == "DELETED"
    assert await get_pod(api, namespace, "victim") is None
    # Evicting it again: already gone, which is what the caller wanted.
    again = await Writer(api).evict(namespace, "victim", uid, message="again")
    assert again.status == "gone" and again


async def test_a_terminating_victim_says_who_evicted_it(
    control_plane: ControlPlane, api: ApiClient, namespace: str
) -> None:
    """The Eviction API writes its own reason over the scheduler's; the scheduler says it
    again, so a pod that takes its time to terminate shows why it goes. (Bound to a node no
    kubelet serves, the pod stays Terminating.)"""
    cp = control_plane
    await create(cp, namespace, gpu_pod("slow", node=f"nowhere-{namespace}"))
    pod = await get_pod(api, namespace, "slow")
    assert pod is not None
    try:
        outcome = await Writer(api).evict(
            namespace, "slow", pod["metadata"]["uid"], message="reclaimed for team-b/job-1"
        )
        assert outcome.status == "evicted", outcome
        after = await get_pod(api, namespace, "slow")
        assert after is not None and after["metadata"].get("deletionTimestamp")
        marked = condition(after, "DisruptionTarget")
        assert marked is not None, after["status"]
        assert (marked["status"], marked["reason"], marked["message"]) == (
            "True", "PreemptionByScheduler", "reclaimed for team-b/job-1"
        )  # fmt: skip
    finally:
        await kubectl(cp, "delete", "pod", "slow", "-n", namespace, "--grace-period=0",
                      "--force", "--ignore-not-found")  # fmt: skip


async def test_a_replica_that_does_not_lead_evicts_nothing(
    control_plane: ControlPlane, api: ApiClient, namespace: str, make_gpu_nodes: Any
) -> None:
    (node,) = await asyncio.to_thread(make_gpu_nodes, 1, gpus=1)
    await create(
        control_plane, namespace, gpu_pod("victim", node=node), gpu_pod("urgent")
    )  # fmt: skip
    victim = (await running(api, namespace, "victim"))["victim"]
    uid = victim["metadata"]["uid"]
    follower = Writer(api, may_write=lambda: False)
    outcome = await follower.evict(namespace, "victim", uid, message="not sent")
    assert outcome.status == "not_leader" and not outcome

    # The whole commit path too: nothing nominated, evicted or bound.
    async with watched(api, SCHED) as cache:
        await eventually("the cache sees both pods", lambda: cache.raw("Pod", namespace, "urgent"))
        snapshot = cache.snapshot()
        placement = take_back(
            snapshot, {f"{namespace}/urgent": (node, {0: 1000})}, [eviction(victim, "x")]
        )
        backend = LiveBackend(cache, follower, is_leader=lambda: False)
        await commit(backend, snapshot, placement)
        assert cache.nominated() == {} and len(backend.nominations) == 0
    after = await get_pod(api, namespace, "victim")
    assert after is not None and not after["metadata"].get("deletionTimestamp")
    assert condition(after, "DisruptionTarget") is None
    urgent = await get_pod(api, namespace, "urgent")
    assert urgent is not None and not urgent["spec"].get("nodeName")


# --- budgets and nominations -------------------------------------------------------------


async def test_a_budget_that_allows_nothing_refuses_and_the_nomination_is_dropped(
    control_plane: ControlPlane, api: ApiClient, namespace: str, make_gpu_nodes: Any
) -> None:
    cp = control_plane
    (node,) = await asyncio.to_thread(make_gpu_nodes, 1, gpus=1)
    await create(cp, namespace, gpu_pod("guarded", node=node, labels={"app": "guarded"}))
    victim = (await running(api, namespace, "guarded"))["guarded"]
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "keep-one"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
    }
    await create(cp, namespace, budget, gpu_pod("urgent"))
    metrics = SchedulerMetrics()
    async with watched(api, SCHED) as cache:

        def budget_seen() -> Any:
            # The disruption controller has counted the healthy pod: nothing may go.
            return [
                b
                for b in cache.snapshot().budgets
                if b.key == f"{namespace}/keep-one"
                and b.pod_uids == (victim["metadata"]["uid"],)
                and (cache.raw("PodDisruptionBudget", namespace, "keep-one") or {})
                .get("status", {})
                .get("currentHealthy")
                == 1
            ]

        (seen,) = await eventually("the budget resolved to the guarded pod", budget_seen)
        assert seen.allowed == 0
        await eventually("the cache sees urgent", lambda: cache.raw("Pod", namespace, "urgent"))
        snapshot = cache.snapshot()
        urgent_key = f"{namespace}/urgent"
        placement = take_back(
            snapshot, {urgent_key: (node, {0: 1000})}, [eviction(victim, urgent_key)]
        )
        backend = LiveBackend(cache, Writer(api), metrics=metrics)
        await backend.commit(snapshot, placement, compute_fair_shares(snapshot))
        urgent_uid = snapshot.pods[[p.key for p in snapshot.pods].index(urgent_key)].uid
        assert cache.nominated() == {urgent_uid: node}  # held while the eviction is tried
        await backend.flush()

        # Refused: the plan is dropped, the pod is pending again for the next cycle.
        assert cache.nominated() == {} and urgent_key not in backend.nominations
        pending = {p.key: p for p in cache.snapshot().pods}[urgent_key]
        assert pending.pending and not pending.nominated
        assert not {p.key: p for p in cache.snapshot().pods}[f"{namespace}/guarded"].deleting
    assert (
        metrics.registry.get_sample_value("kai_eviction_failures_total", {"reason": "pdb"}) == 1.0
    )
    assert not metrics.registry.get_sample_value(
        "kai_evictions_total", {"action": "preempt", "queue": "default-queue"}
    )
    guarded = await get_pod(api, namespace, "guarded")
    assert guarded is not None and not guarded["metadata"].get("deletionTimestamp")
    # The DisruptionTarget written before the refused eviction was taken back.
    marked = condition(guarded, "DisruptionTarget")
    assert marked is not None and marked["status"] == "False", marked
    assert marked["reason"] == "EvictionRefused" and "disruption budget" in marked["message"]
    urgent = await get_pod(api, namespace, "urgent")
    assert urgent is not None and not urgent["spec"].get("nodeName")
    dropped = await event_with(api, namespace, "urgent", "NominationDropped")
    assert "keep-one" in dropped["message"] or "disruption budget" in dropped["message"]
    # The node it was held on was shown, then cleared with the nomination.
    assert not (urgent.get("status") or {}).get("nominatedNodeName"), urgent["status"]


async def test_a_nominated_gang_is_bound_only_after_its_victims_are_gone(
    control_plane: ControlPlane, api: ApiClient, namespace: str, make_gpu_nodes: Any
) -> None:
    """The watch is stalled (one list, then the test hands the cache what it should hear), so
    the window between eviction and the victims leaving the cache is as long as the test
    wants: nothing may be bound into the held space meanwhile."""
    cp = control_plane
    (node,) = await asyncio.to_thread(make_gpu_nodes, 1, gpus=2)
    await create(
        cp, namespace, podgroup("old", 2), podgroup("new", 2),
        gpu_pod("old-0", node=node, group="old"), gpu_pod("old-1", node=node, group="old"),
        gpu_pod("new-0", group="new"), gpu_pod("new-1", group="new"),
    )  # fmt: skip
    victims = await running(api, namespace, "old-0", "old-1")
    cache = Cache(SCHED, "default-queue")
    await Watcher(api, cache).run(iterations=1)
    metrics = SchedulerMetrics()
    backend = LiveBackend(cache, Writer(api), metrics=metrics)
    snapshot = cache.snapshot()
    old, new = f"{namespace}/old", f"{namespace}/new"
    placement = take_back(
        snapshot,
        {f"{namespace}/new-0": (node, {0: 1000}), f"{namespace}/new-1": (node, {1: 1000})},
        [eviction(victims[n], new, "reclaim", gang=old) for n in ("old-0", "old-1")],
    )
    await commit(backend, snapshot, placement)

    # Evicted for real (kwok then deletes them); each victim told why, and its PodGroup too.
    for name in ("old-0", "old-1"):
        await gone(api, namespace, name)
        told = await event_with(api, namespace, name, "Reclaimed")
        assert told["message"] == f"reclaim for {new}, which has a higher priority"
    await event_with(api, namespace, "old", "Reclaimed")
    assert (
        metrics.registry.get_sample_value(
            "kai_evictions_total", {"action": "reclaim", "queue": "default-queue"}
        )
        == 2.0
    )
    # The waiting gang says what it waits for.
    waiting = await event_with(api, namespace, "new", "WaitingForEvictions")
    assert waiting["message"] == (f"waiting for 2 evicted pods of {old} to terminate on {node}")
    pg = json.loads(await kubectl(cp, "get", "podgroup", "new", "-n", namespace, "-o", "json"))
    assert pg["status"]["phase"] == "Pending"
    assert pg["status"]["conditions"][0]["reason"] == "WaitingForEvictions"
    for name in ("new-0", "new-1"):  # held on the node, as kube-scheduler shows preemptors
        pod = await get_pod(api, namespace, name)
        assert pod is not None and pod["status"].get("nominatedNodeName") == node, name

    # The cache has not heard of the deletions yet: victims terminating, gang held.
    held = {p.name: p for p in cache.snapshot().pods}
    assert held["old-0"].deleting and held["old-1"].deleting
    assert held["new-0"].nominated and held["new-1"].nominated
    assert len(cache.nominated()) == 2

    # A newcomer arrives, and one victim is gone: without the nomination the newcomer would
    # fit on the device that victim left. It must not get it, and nothing is bound yet.
    await create(cp, namespace, gpu_pod("newcomer"))
    cache.apply("Pod", "ADDED", await get_pod(api, namespace, "newcomer") or {})
    cache.apply("Pod", "DELETED", victims["old-0"])
    for number in (2, 3):
        report = await run_cycle(backend, PLACE_ONLY, number)
        await backend.flush()
        assert report.placement.evictions == ()
        assert report.commit.dispatched_pods == 0, report.placement.outcomes
        assert max(report.snapshot.node_states()[node].gpu_free) <= 0
    for name in ("new-0", "new-1", "newcomer"):
        pod = await get_pod(api, namespace, name)
        assert pod is not None and not pod["spec"].get("nodeName"), name

    # The last victim is gone: the next cycle binds the whole gang where it was held.
    cache.apply("Pod", "DELETED", victims["old-1"])
    report = await run_cycle(backend, PLACE_ONLY, 4)
    assert report.commit.dispatched_pods == 2
    await backend.flush()
    grants = {}
    for name in ("new-0", "new-1"):
        pod = await get_pod(api, namespace, name)
        assert pod is not None and pod["spec"].get("nodeName") == node, name
        grants[name] = json.loads(pod["metadata"]["annotations"]["kai.scheduler/gpu-grant"])
    assert sorted(map(str, grants.values())) == ["{'0': 1000}", "{'1': 1000}"]
    newcomer = await get_pod(api, namespace, "newcomer")
    assert newcomer is not None and not newcomer["spec"].get("nodeName")
    assert cache.nominated() == {} and len(backend.nominations) == 0
    assert metrics.registry.get_sample_value("kai_nominated_pods") == 0


async def test_with_a_live_watch_the_gang_is_bound_once_its_victim_is_gone(
    control_plane: ControlPlane, api: ApiClient, namespace: str, make_gpu_nodes: Any
) -> None:
    cp = control_plane
    (node,) = await asyncio.to_thread(make_gpu_nodes, 1, gpus=1)
    await create(cp, namespace, gpu_pod("low", node=node), gpu_pod("high"))
    victim = (await running(api, namespace, "low"))["low"]
    async with watched(api, SCHED) as cache:
        await eventually("the cache sees high", lambda: cache.raw("Pod", namespace, "high"))
        backend = LiveBackend(cache, Writer(api), nomination_timeout=60.0)
        snapshot = cache.snapshot()
        high = f"{namespace}/high"
        placement = take_back(snapshot, {high: (node, {0: 1000})}, [eviction(victim, high)])
        await commit(backend, snapshot, placement)
        preempted = await event_with(api, namespace, "low", "Preempted")
        assert high in preempted["message"]
        # Cycles run as the runner runs them: whenever the cache says something changed.
        for number in range(2, 60):
            bound = await get_pod(api, namespace, "high")
            if bound is not None and bound["spec"].get("nodeName"):
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(cache.pending_changed.wait(), 1.0)
            cache.pending_changed.clear()
            await run_cycle(backend, PLACE_ONLY, number)
            await backend.flush()
        assert bound is not None and bound["spec"].get("nodeName") == node
        assert await get_pod(api, namespace, "low") is None
        assert cache.nominated() == {}


# --- a role without PodDisruptionBudgets -----------------------------------------------------


async def test_a_forbidden_budget_list_does_not_hold_up_scheduling(
    control_plane: ControlPlane, namespace: str
) -> None:
    """An RBAC role from before budgets were watched: the cache syncs without them (and keeps
    asking); once the role grants them, they appear."""
    cp = control_plane
    role = f"no-pdbs-{namespace}"
    await kubectl(cp, "create", "clusterrole", role, "--verb=list,watch", "--resource=pods,nodes")
    await kubectl(cp, "create", "clusterrolebinding", role, f"--clusterrole={role}",
                  f"--serviceaccount={namespace}:default")  # fmt: skip
    token = await asyncio.to_thread(cp.service_account_token, namespace, "default")
    path = await asyncio.to_thread(cp.kubeconfig_for_token, token, f"sa-{namespace}")
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "keep"},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "a"}}},
    }
    pod = gpu_pod("a", labels={"app": "a"})
    await create(cp, namespace, budget, pod)
    api = await make_api_client(ClientSettings(kube_config=str(path)))
    cache = Cache(SCHED, "default-queue")
    watcher = Watcher(api, cache, ["Pod", "Node", "PodDisruptionBudget"], settings=FAST)
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.wait_for(watcher.synced.wait(), 30)
        assert watcher.absent == {"PodDisruptionBudget"}
        assert cache.raw("Pod", namespace, "a") is not None
        assert cache.snapshot().budgets == ()
        # Granted later: the retried list picks the budgets up.
        grant = f"{role}-pdb"
        await kubectl(cp, "create", "clusterrole", grant, "--verb=list,watch",
                      "--resource=poddisruptionbudgets.policy")  # fmt: skip
        await kubectl(cp, "create", "clusterrolebinding", grant, f"--clusterrole={grant}",
                      f"--serviceaccount={namespace}:default")  # fmt: skip
        await eventually(
            "the budget in the snapshot",
            lambda: [b for b in cache.snapshot().budgets if b.key == f"{namespace}/keep"],
            timeout=60,
        )
        assert watcher.absent == set()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()
        for name in (role, f"{role}-pdb"):
            await kubectl(cp, "delete", "clusterrolebinding,clusterrole", name,
                          "--ignore-not-found")  # fmt: skip
