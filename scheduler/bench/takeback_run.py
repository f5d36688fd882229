"""One ``takeback-diff`` scenario under the scheduler that runs
(:mod:`scheduler.bench.takeback_diff`): fresh nodes, namespace and queues; the first wave,
step by step; the second wave; then, once nothing changes, per gang the pods that run, wait
and were evicted, the eviction actions and the outcome (:func:`run_scenario`), all followed
by a pod watch (:class:`PodWatch`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from scheduler.bench.diff_plane import log
from scheduler.bench.e2e_cluster import (
    PODGROUPS,
    Api,
    ApiError,
    create_namespace,
    delete_namespace,
)
from scheduler.bench.takeback_manifests import (
    LABEL_GANG,
    LABEL_RUN,
    NAMESPACE_PREFIX,
    RunNames,
    budget_manifest,
    podgroup_manifest,
    queue_manifest,
    replicaset_manifest,
)
from scheduler.bench.takeback_scenarios import PODGROUPER, Scenario, Step, Workload
from testenv import ControlPlane, make_gpu_nodes

__all__ = [
    "OUTCOMES",
    "PodSeen",
    "PodWatch",
    "RunContext",
    "SchedulerDied",
    "outcome_of",
    "run_scenario",
]

QUEUES = "/apis/scheduling.run.ai/v2/queues"
REPLICASETS = "/apis/apps/v1/namespaces/{ns}/replicasets"
BUDGETS = "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"
#: What :func:`outcome_of` says (besides ``partial(<running>/<replicas>)``).
OUTCOMES = ("running", "pending", "evicted", "shrunk", "moved")

#: Event reasons of our evictions (scheduler/commit/evict.py) -> action.
_OURS_REASONS = {
    "Preempted": "preempt",
    "Reclaimed": "reclaim",
    "Consolidated": "consolidate",
    "Shrunk": "shrink",
}
#: KAI's ``evictor-action-type`` annotation of its ``Evict`` Event on the PodGroup -> action.
_KAI_ACTIONS = {
    "preempt": "preempt",
    "reclaim": "reclaim",
    "consolidation": "consolidate",
    "stalegangeviction": "stale-gang",
}


# ------------------------------------------------------------------------------ observing


@dataclass
class PodSeen:
    """What the watch saw of one pod."""

    uid: str
    name: str
    gang: str
    node: str | None = None
    phase: str = ""
    terminating: bool = False
    gone: bool = False
    #: Monotonic time it was first seen terminating or deleted.
    ended_at: float | None = None
    #: Every distinct ``DisruptionTarget=True`` condition seen on it, "reason: message", in
    #: order (the Eviction API replaces a scheduler's own with ``EvictionByEvictionAPI``).
    disruptions: list[str] = field(default_factory=list)

    @property
    def live(self) -> bool:
        """Neither terminating nor deleted."""
        return not (self.terminating or self.gone)

    @property
    def running(self) -> bool:
        """Live, bound and Running."""
        return self.live and bool(self.node) and self.phase == "Running"


class PodWatch:
    """Follows the pods of one namespace (list, then watch; resumes when the stream ends)."""

    def __init__(self, api: Api, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.pods: dict[str, PodSeen] = {}
        self.changed_at = time.monotonic()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """List, then follow in a background task."""
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        listing = await self.api.call("GET", path)
        for pod in listing.get("items", []):
            self._observe("ADDED", pod)
        version = str(listing["metadata"]["resourceVersion"])
        self._task = asyncio.create_task(self._follow(path, version), name="takeback-pod-watch")

    async def _follow(self, path: str, version: str) -> None:
        while True:
            async for event in self.api.watch(path, version):
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    raise ApiError("WATCH", path, int(obj.get("code", 0)), json.dumps(obj))
                version = str(obj.get("metadata", {}).get("resourceVersion", version))
                if event.get("type") != "BOOKMARK":
                    self._observe(str(event.get("type")), obj)

    def _observe(self, kind: str, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid"))
        seen = self.pods.get(uid)
        if seen is None:
            gang = str((meta.get("labels") or {}).get(LABEL_GANG, ""))
            seen = self.pods[uid] = PodSeen(uid, str(meta.get("name")), gang)
        status = pod.get("status") or {}
        seen.node = (pod.get("spec") or {}).get("nodeName") or seen.node
        seen.phase = str(status.get("phase", seen.phase))
        seen.terminating = seen.terminating or bool(meta.get("deletionTimestamp"))
        seen.gone = seen.gone or kind == "DELETED"
        for cond in status.get("conditions") or []:
            if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
                text = f"{cond.get('reason')}: {str(cond.get('message', ''))[:160]}"
                if text not in seen.disruptions:
                    seen.disruptions.append(text)
        if not seen.live and seen.ended_at is None:
            seen.ended_at = time.monotonic()
        self.changed_at = time.monotonic()
        self._changed.set()

    def of_gang(self, gang: str) -> list[PodSeen]:
        """Every pod of ``gang`` seen so far."""
        return [p for p in self.pods.values() if p.gang == gang]

    def signature(self) -> tuple[tuple[str, str, str, bool], ...]:
        """What must not change for the outcome to count as stable."""
        return tuple(
            sorted((p.uid, p.node or "", p.phase, p.live) for p in self.pods.values() if not p.gone)
        )

    async def until(self, done: Callable[[], bool], timeout: float, poll: float = 0.25) -> bool:
        """Wait until ``done()``; False on timeout. Re-raises if the watch failed."""
        deadline = time.monotonic() + timeout
        while not done():
            if self._task is not None and self._task.done():
                self._task.result()
                raise RuntimeError("the pod watch ended unexpectedly")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(poll, remaining))
        return True

    async def stop(self) -> None:
        """Cancel the watch."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


# ------------------------------------------------------------------------------ one run


class SchedulerDied(RuntimeError):
    """A process of the scheduler under test exited during a run."""


@dataclass
class RunContext:
    """What one scenario run needs from its surroundings."""

    cp: ControlPlane
    scheduler: str
    scheduler_name: str
    #: Raises :class:`SchedulerDied` when a process of the scheduler has exited.
    check_alive: Callable[[], None] = lambda: None
    settle: float = 6.0
    step_timeout: float = 120.0
    wave_timeout: float = 90.0


def _log(message: str) -> None:
    log("takeback-diff", message)


async def _kubectl(cp: ControlPlane, *args: str, **kwargs: Any) -> Any:
    return await asyncio.to_thread(cp.kubectl, *args, **kwargs)


async def _create_workloads(
    api: Api, ctx: RunContext, names: RunNames, workloads: Sequence[Workload]
) -> None:
    ns = names.namespace
    for w in workloads:  # PodGroups first: no pod ever names a missing one
        if w.grouping != PODGROUPER:
            await api.call("POST", PODGROUPS.format(ns=ns), podgroup_manifest(w, names))
    for w in workloads:
        if w.budget_min_available is not None:
            await api.call("POST", BUDGETS.format(ns=ns), budget_manifest(w, names))
    for w in workloads:
        manifest = replicaset_manifest(w, names, ctx.scheduler_name)
        await api.call("POST", REPLICASETS.format(ns=ns), manifest)


def _all_running(watch: PodWatch, workloads: Sequence[Workload]) -> bool:
    return all(sum(p.running for p in watch.of_gang(w.name)) >= w.replicas for w in workloads)


async def _wait_steps(
    api: Api, ctx: RunContext, names: RunNames, scenario: Scenario, watch: PodWatch
) -> list[str]:
    """Run the first wave; the removed helpers' names."""
    removed: list[str] = []
    for i, step in enumerate(scenario.setup):
        if step.create:
            await _create_workloads(api, ctx, names, step.create)

            def ready(step: Step = step) -> bool:
                ctx.check_alive()
                return _all_running(watch, step.create)

            if not await watch.until(ready, ctx.step_timeout):
                state = {w.name: _counts(watch, w) for w in step.create}
                raise TimeoutError(
                    f"setup step {i + 1}: not all running after {ctx.step_timeout}s: {state}"
                )
        for name in step.remove:
            removed.append(name)
            await api.call(
                "DELETE",
                f"{REPLICASETS.format(ns=names.namespace)}/{name}",
                {"propagationPolicy": "Background"},
            )

        def gone(step: Step = step) -> bool:
            return not any(p.live for n in step.remove for p in watch.of_gang(n))

        if step.remove and not await watch.until(gone, ctx.step_timeout):
            raise TimeoutError(f"setup step {i + 1}: {step.remove} not gone")
    await _wait_budgets(api, names, scenario, ctx.step_timeout)
    return removed


async def _wait_budgets(api: Api, names: RunNames, scenario: Scenario, timeout: float) -> None:
    """Wait until the disruption controller has counted every first-wave budget's pods, so
    the second wave meets budgets with their real ``disruptionsAllowed``."""
    deadline = time.monotonic() + timeout
    for w in (w for s in scenario.setup for w in s.create if w.budget_min_available is not None):
        path = f"{BUDGETS.format(ns=names.namespace)}/{w.name}"
        while True:
            pdb = await api.call("GET", path)
            status = pdb.get("status") or {}
            if (
                status.get("observedGeneration") == pdb["metadata"].get("generation")
                and status.get("currentHealthy", 0) >= w.replicas
            ):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"budget {w.name} not counted after {timeout}s: {status}")
            await asyncio.sleep(0.2)


def _counts(watch: PodWatch, w: Workload) -> dict[str, int]:
    pods = watch.of_gang(w.name)
    live = [p for p in pods if p.live]
    return {
        "running": sum(p.running for p in live),
        "pending": sum(not p.node for p in live),
        "live": len(live),
    }


async def _wait_stable(ctx: RunContext, scenario: Scenario, watch: PodWatch) -> tuple[bool, float]:
    """Wait until nothing changed for ``settle`` seconds with no pod terminating and every
    ReplicaSet caught up; (stable, seconds from now to the last change)."""
    began = time.monotonic()
    workloads = scenario.reported()
    last: Any = None
    since = began

    def quiet() -> bool:
        nonlocal last, since
        ctx.check_alive()
        now = time.monotonic()
        sig = watch.signature()
        busy = any(p.terminating and not p.gone for p in watch.pods.values()) or any(
            _counts(watch, w)["live"] != w.replicas for w in workloads
        )
        if sig != last or busy:
            last, since = sig, now
            return False
        return now - since >= ctx.settle

    stable = await watch.until(quiet, ctx.wave_timeout)
    return stable, round(since - began, 2)


async def _events(api: Api, namespace: str) -> list[dict[str, Any]]:
    out = await api.call("GET", f"/api/v1/namespaces/{namespace}/events")
    return list(out.get("items", []))


async def _podgroup_gangs(api: Api, namespace: str) -> dict[str, str]:
    """PodGroup name -> gang (KAI's podgrouper names its PodGroups after the ReplicaSet)."""
    out = await api.call("GET", PODGROUPS.format(ns=namespace), allow=(404,))
    gangs: dict[str, str] = {}
    for pg in out.get("items", []):
        meta = pg["metadata"]
        owners = [o["name"] for o in meta.get("ownerReferences") or [] if o["kind"] == "ReplicaSet"]
        gangs[meta["name"]] = owners[0] if owners else meta["name"]
    return gangs


def _eviction_evidence(
    events: Sequence[Mapping[str, Any]], pod_gangs: Mapping[str, str], pg_gangs: Mapping[str, str]
) -> dict[str, dict[str, Any]]:
    """Per gang: eviction actions and messages from ours' and KAI's Events."""
    out: dict[str, dict[str, Any]] = {}
    for ev in events:
        obj = ev.get("involvedObject") or {}
        reason = str(ev.get("reason", ""))
        annotations = (ev.get("metadata") or {}).get("annotations") or {}
        if reason in _OURS_REASONS:
            action = _OURS_REASONS[reason]
        elif reason == "Evict" and "evictor-action-type" in annotations:
            kind = str(annotations["evictor-action-type"])
            action = _KAI_ACTIONS.get(kind, kind)
        else:
            continue
        if obj.get("kind") == "Pod":
            gang = pod_gangs.get(str(obj.get("name")), "")
        else:
            gang = pg_gangs.get(str(obj.get("name")), str(obj.get("name")))
        entry = out.setdefault(gang, {"actions": set(), "messages": []})
        entry["actions"].add(action)
        message = f"{obj.get('kind')} {reason}: {ev.get('message', '')}"[:240]
        if message not in entry["messages"] and len(entry["messages"]) < 3:
            entry["messages"].append(message)
    return out


def outcome_of(running: int, evicted: int, replicas: int, minimum: int) -> str:
    """The outcome vocabulary of :mod:`scheduler.bench.takeback_diff`'s docstring."""
    if evicted == 0:
        if running >= replicas:
            return "running"
        return "pending" if running == 0 else f"partial({running}/{replicas})"
    if running >= replicas:
        return "moved"
    return "shrunk" if running >= minimum else "evicted"


async def _cleanup(api: Api, ctx: RunContext, names: RunNames, kai_crds: bool) -> None:
    ns = names.namespace
    # ReplicaSets first, so nothing recreates the pods deleted next.
    await api.call(
        "DELETE", REPLICASETS.format(ns=ns), {"propagationPolicy": "Background"}, allow=(404,)
    )
    await delete_namespace(api, ns, kai_crds=kai_crds, timeout=120)
    await api.call("DELETE", QUEUES, params={"labelSelector": f"{LABEL_RUN}={names.rid}"})
    if names.nodes:
        await _kubectl(ctx.cp, "delete", "--ignore-not-found", *(f"node/{n}" for n in names.nodes))


async def run_scenario(ctx: RunContext, scenario: Scenario) -> dict[str, Any]:
    """One scenario under the running scheduler; its result (gang -> counts and outcome)."""
    rid = uuid.uuid4().hex[:6]
    namespace = f"{NAMESPACE_PREFIX}{scenario.name}-{ctx.scheduler}-{rid}"
    result: dict[str, Any] = {
        "scenario": scenario.name,
        "scheduler": ctx.scheduler,
        "namespace": namespace,
        "stable": False,
        "error": None,
    }
    began = time.monotonic()
    prefix = f"td-{rid}-n"
    # make_gpu_nodes names them so; known up front, so a failed creation is cleaned up too.
    names = RunNames(rid, namespace, tuple(f"{prefix}-{i}" for i in range(scenario.nodes)))
    async with Api(ctx.cp.server, ctx.cp.admin_token, ctx.cp.ca_file, connections=8) as api:
        watch: PodWatch | None = None
        try:
            nodes = await asyncio.to_thread(
                make_gpu_nodes,
                ctx.cp,
                scenario.nodes,
                gpus=scenario.gpus_per_node,
                labels={LABEL_RUN: rid},
                name_prefix=prefix,
            )
            if tuple(nodes) != names.nodes:
                raise RuntimeError(f"unexpected node names {nodes}, wanted {names.nodes}")
            await create_namespace(api, namespace)
            for q in scenario.queues:  # parents first (the tuple lists them first)
                await api.call("POST", QUEUES, queue_manifest(q, names))
            watch = PodWatch(api, namespace)
            await watch.start()
            removed = await _wait_steps(api, ctx, names, scenario, watch)
            result["setup_seconds"] = round(time.monotonic() - began, 2)
            wave2_at = time.monotonic()
            await _create_workloads(api, ctx, names, scenario.wave2)
            stable, last_change = await _wait_stable(ctx, scenario, watch)
            result["stable"] = stable
            result["seconds_to_last_change"] = last_change
            events = await _events(api, namespace)
            pg_gangs = await _podgroup_gangs(api, namespace)
            pod_gangs = {p.name: p.gang for p in watch.pods.values()}
            evidence = _eviction_evidence(events, pod_gangs, pg_gangs)
            result["gangs"] = _gang_results(scenario, watch, names, wave2_at, evidence)
            result["setup_evictions"] = sorted(
                p.name
                for p in watch.pods.values()
                if p.ended_at is not None and p.ended_at < wave2_at and p.gang not in removed
            )
        except Exception as e:  # recorded; the comparison shows the run as incomplete
            result["error"] = f"{type(e).__name__}: {e}"
            _log(f"{ctx.scheduler}/{scenario.name}: {result['error']}")
        finally:
            if watch is not None:
                await watch.stop()
            try:
                await _cleanup(api, ctx, names, kai_crds=ctx.scheduler == "kai")
            except (ApiError, TimeoutError, aiohttp.ClientError, RuntimeError) as e:
                result["cleanup_error"] = f"{type(e).__name__}: {e}"
    result["seconds"] = round(time.monotonic() - began, 2)
    return result


def _gang_results(
    scenario: Scenario,
    watch: PodWatch,
    names: RunNames,
    wave2_at: float,
    evidence: Mapping[str, Mapping[str, Any]],
) -> dict[str, dict[str, Any]]:
    first_wave = {w.name for s in scenario.setup for w in s.create}
    out: dict[str, dict[str, Any]] = {}
    for w in scenario.reported():
        pods = watch.of_gang(w.name)
        counts = _counts(watch, w)
        evicted = [p for p in pods if p.ended_at is not None and p.ended_at >= wave2_at]
        nodes: dict[str, int] = {}
        for p in pods:
            if p.running:
                key = names.logical_node(p.node) or "?"
                nodes[key] = nodes.get(key, 0) + 1
        conditions: list[str] = []
        for p in evicted:
            conditions += [c for c in p.disruptions if c not in conditions]
        ev = evidence.get(w.name, {})
        out[w.name] = {
            "wave": 1 if w.name in first_wave else 2,
            "queue": w.queue,
            "priority_class": w.priority_class,
            "replicas": w.replicas,
            "min_member": w.minimum,
            "running": counts["running"],
            "pending": counts["pending"],
            "evicted_pods": len(evicted),
            "outcome": outcome_of(counts["running"], len(evicted), w.replicas, w.minimum),
            "nodes": dict(sorted(nodes.items())),
            "actions": sorted(ev.get("actions", ())),
            "disruption_conditions": conditions[:4],
            "disruption_reasons": sorted({c.split(":", 1)[0] for c in conditions}),
            "event_messages": list(ev.get("messages", [])),
        }
    return out
