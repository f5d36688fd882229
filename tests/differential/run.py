"""Run differential cases on one control plane: kube-scheduler and ours, side by side.

:class:`Harness` prepares a started control plane (our CRDs and default queues), starts both
schedulers once (ours as the bench runs it, :func:`scheduler.bench.e2e_peers.ours`, with take
back off; kube-scheduler as the bench runs it, :func:`scheduler.bench.e2e_peers.kube_scheduler`,
unthrottled, with a 1 s retry backoff so pods that become schedulable settle fast), and runs
cases in batches. For each batch:

1. both copies of every case (:mod:`tests.differential.cases`) get their namespace and nodes
   (created Ready; kwok keeps them so); pods are created only once every node is Ready and
   without the API server's not-ready taint;
2. the pods of each copy are created one after the other in the case's order (copies in
   parallel);
3. one watch of all pods follows binds and ``PodScheduled`` conditions until every pod of a
   copy is bound or has ``PodScheduled=False`` with a reason, and nothing in the copy changed
   for ``stable`` seconds - for ours also at least two of its cycles (``kai_cycles_total``),
   since a cycle can outlast ``stable`` under load - or the batch's timeout passes;
4. each case is judged (:func:`judge`), then its pods and nodes are deleted (its namespaces at
   the end of the run).

The checks, per case:

- ``a``: every pod ours bound passes :func:`tests.differential.checker.check`;
- ``checker``: every pod kube-scheduler bound passes it too (a failure here means the checker,
  not ours, is wrong; the run fails all the same);
- ``b``: every pod ours left unbound has ``PodScheduled=False`` with a non-empty message (for
  the pods kube-scheduler left unschedulable too, this is the issue's check (b); ours leaving a
  pod without a reason is a failure wherever it happens);
- ``c``: ours bound at least as many pods as kube-scheduler;
- ``harness``: a pod was deleted during the run, kube-scheduler neither bound a pod nor
  marked it unschedulable in time, or the node controller tainted a case's node.

Each failure carries the case's seed: ``python -m tests.differential --seed S --cases 1``
replays it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp

from scheduler.bench import e2e_peers as peers
from scheduler.bench.e2e_cluster import Api, ApiError
from testenv import ControlPlane, find_bin_dir

from . import checker
from .cases import CASE_LABEL, CaseCopy, case_seeds, generate

__all__ = [
    "CaseResult",
    "Failure",
    "Harness",
    "Settings",
    "differential_control_plane",
    "judge",
    "summary",
]

REPO = Path(__file__).resolve().parents[2]
KUBE, OURS = "k", "o"
#: Ours, as the differential test runs it: the shipped config (what users get), except take
#: back (which would evict bare pods that nobody recreates; kube-scheduler only preempts for
#: higher priority, and every pod here has the same), a shorter cycle, and CPU-only pods
#: placed as kube-scheduler's default scores place them (``cpu: spread``: LeastAllocated and
#: BalancedAllocation over CPU and memory, :mod:`scheduler.plugins.leastallocated`): check
#: (c) counts pods placed, which depends on where earlier pods went as much as on the rules.
#: ``KAI_DIFF_CPU=binpack`` runs the shipped packing (measured at seed 1, 200 cases: ours
#: placed more pods in 12 cases and fewer in 13; with spread, on 2026-12-05, more in 10-19 and
#: fewer in 0-4 over 3 runs).
OURS_CONFIG: dict[str, Any] = {
    "cyclePeriod": "500ms",
    "placement": {
        "gpu": "binpack",
        "cpu": os.environ.get("KAI_DIFF_CPU", "spread"),
        "scoring": "packing",
        "takeBack": False,
    },
}
QUEUE_LABEL = "kai.scheduler/queue"


@dataclass(frozen=True)
class Settings:
    """How cases are run."""

    #: Cases per batch (both copies of each are on the control plane at once).
    batch_size: int = 50
    #: A copy is settled when nothing changed in it for this long.
    stable: float = 3.0
    #: Longest wait for a batch to settle, from its first pod.
    timeout: float = 90.0
    #: Concurrent API requests of the harness.
    concurrency: int = 32


@dataclass(frozen=True)
class Failure:
    """One failed check of one case."""

    seed: int
    index: int
    check: str
    pod: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with the command that replays the case."""
        return {
            "seed": self.seed,
            "case": self.index,
            "check": self.check,
            "pod": self.pod,
            "detail": self.detail,
            "replay": f"python -m tests.differential --seed {self.seed} --cases 1",
        }


@dataclass
class CopyOutcome:
    """What one scheduler did with one copy."""

    copy: CaseCopy
    #: The pods as the API server last showed them, in creation order.
    pods: list[dict[str, Any]]
    #: The case's Nodes as the API server showed them after the copy settled.
    server_nodes: list[dict[str, Any]]
    deleted: list[str]
    settled: bool

    @property
    def nodes(self) -> list[dict[str, Any]]:
        """The nodes as the case made them: what the checker judges against. (The server's
        copies add only kwok's status; a taint the node controller might add later, should a
        node miss its heartbeats, is a harness failure of its own, not a placement error.)"""
        return self.copy.nodes

    def bound(self) -> dict[str, str]:
        """Pod name -> node."""
        return {
            p["metadata"]["name"]: p["spec"]["nodeName"]
            for p in self.pods
            if p.get("spec", {}).get("nodeName")
        }

    def condition(self, name: str) -> dict[str, Any]:
        """The pod's PodScheduled condition ({} if none)."""
        for p in self.pods:
            if p["metadata"]["name"] == name:
                return _scheduled_condition(p)
        return {}


@dataclass
class CaseResult:
    """One case: both outcomes and the failed checks."""

    seed: int
    index: int
    features: list[str]
    kube: CopyOutcome
    ours: CopyOutcome
    failures: list[Failure] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (pods' states, not the whole objects)."""

        def side(o: CopyOutcome) -> dict[str, Any]:
            bound = o.bound()
            return {
                "bound": len(bound),
                "pods": len(o.pods),
                "settled": o.settled,
                "placements": bound,
                "unbound": {
                    p["metadata"]["name"]: _scheduled_condition(p).get("message", "")
                    for p in o.pods
                    if p["metadata"]["name"] not in bound
                },
            }

        return {
            "seed": self.seed,
            "case": self.index,
            "features": self.features,
            "kube-scheduler": side(self.kube),
            "ours": side(self.ours),
            "failures": [f.to_dict() for f in self.failures],
        }


def _scheduled_condition(pod: Mapping[str, Any]) -> dict[str, Any]:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled":
            return dict(c)
    return {}


def _resolved(pod: Mapping[str, Any]) -> bool:
    """Bound, or marked unschedulable with a reason."""
    if (pod.get("spec") or {}).get("nodeName"):
        return True
    cond = _scheduled_condition(pod)
    return cond.get("status") == "False" and bool(cond.get("reason"))


# ------------------------------------------------------------------------------- judging


def judge(seed: int, index: int, kube: CopyOutcome, ours: CopyOutcome) -> list[Failure]:
    """Checks (a), (b), (c), the checker's self-test on kube-scheduler, and the harness's."""
    out: list[Failure] = []

    def fail(check: str, pod: str, detail: str) -> None:
        out.append(Failure(seed, index, check, pod, detail))

    for v in checker.check(ours.nodes, ours.pods):
        fail("a", v.pod, f"[{v.rule}] on {v.node}: {v.detail}")
    for v in checker.check(kube.nodes, kube.pods):
        fail("checker", v.pod, f"kube-scheduler's placement [{v.rule}] on {v.node}: {v.detail}")
    kube_bound, ours_bound = kube.bound(), ours.bound()
    for p in ours.pods:
        name = p["metadata"]["name"]
        if name in ours_bound:
            continue
        cond = _scheduled_condition(p)
        if cond.get("status") != "False" or not str(cond.get("message", "")).strip():
            kube_did = (
                f"bound to {kube_bound[name]}"
                if name in kube_bound
                else f"unschedulable: {kube.condition(name).get('message', '')!r}"
            )
            fail(
                "b", f"{ours.copy.namespace}/{name}", f"no reason given ({cond}); kube: {kube_did}"
            )
    if len(ours_bound) < len(kube_bound):
        lost = sorted(set(kube_bound) - set(ours_bound))
        reasons = {n: ours.condition(n).get("message", "") for n in lost}
        fail(
            "c",
            ours.copy.namespace,
            f"ours bound {len(ours_bound)} pods, kube-scheduler {len(kube_bound)}; bound by "
            f"kube-scheduler only: {json.dumps(reasons)}",
        )
    for o, who in ((kube, "kube-scheduler"), (ours, "ours")):
        for name in o.deleted:
            fail("harness", f"{o.copy.namespace}/{name}", f"deleted during the run ({who})")
    for p in kube.pods:
        if not _resolved(p):
            fail(
                "harness",
                f"{kube.copy.namespace}/{p['metadata']['name']}",
                f"kube-scheduler neither bound it nor marked it unschedulable in time: "
                f"{_scheduled_condition(p)}",
            )
    for o in (kube, ours):
        if len(o.server_nodes) != len(o.copy.nodes):
            fail("harness", o.copy.namespace, f"{len(o.server_nodes)} of the nodes were found")
        for node in o.server_nodes:
            extra = [
                t
                for t in (node.get("spec") or {}).get("taints") or []
                if t.get("key", "").startswith("node.kubernetes.io/")
            ]
            if extra:
                fail("harness", node["metadata"]["name"], f"node controller taints {extra}")
    return out


def summary(results: Sequence[CaseResult], seconds: float) -> dict[str, Any]:
    """The run's JSON: counts, failures by check, the failing seeds and every failure."""
    failures = [f for r in results for f in r.failures]
    by_check: dict[str, list[int]] = {}
    for f in failures:
        seeds = by_check.setdefault(f.check, [])
        if f.seed not in seeds:
            seeds.append(f.seed)
    features: dict[str, int] = {}
    for r in results:
        for feat in r.features:
            features[feat] = features.get(feat, 0) + 1
    return {
        "cases": len(results),
        "seconds": round(seconds, 1),
        "passed": sum(1 for r in results if not r.failures),
        "failed_seeds": sorted({f.seed for f in failures}),
        "failed_seeds_by_check": {k: sorted(v) for k, v in sorted(by_check.items())},
        "cases_ours_bound_more": sorted(
            r.seed for r in results if len(r.ours.bound()) > len(r.kube.bound())
        ),
        "cases_ours_bound_fewer": sorted(
            r.seed for r in results if len(r.ours.bound()) < len(r.kube.bound())
        ),
        "pods": {
            "kube-scheduler_bound": sum(len(r.kube.bound()) for r in results),
            "ours_bound": sum(len(r.ours.bound()) for r in results),
            "total": sum(len(r.kube.pods) for r in results),
        },
        "features": dict(sorted(features.items())),
        "failures": [f.to_dict() for f in failures],
    }


# ------------------------------------------------------------------------------ watching


class PodWatch:
    """Follows every pod of the ``diff-`` namespaces: the latest object, and per namespace when
    something that matters last changed (a bind, or the PodScheduled condition)."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.deleted: set[tuple[str, str]] = set()
        self.changed_at: dict[str, float] = {}
        self._signature: dict[tuple[str, str], tuple[Any, ...]] = {}
        self._forgotten: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """List, then follow in the background (relisting when the watch expires)."""
        version = await self._list()
        self._task = asyncio.create_task(self._follow(version), name="differential-pod-watch")

    async def _list(self) -> str:
        listing = await self.api.call("GET", "/api/v1/pods")
        for pod in listing.get("items", []):
            self._observe("ADDED", pod)
        return str(listing["metadata"]["resourceVersion"])

    async def _follow(self, version: str) -> None:
        while True:
            try:
                async for event in self.api.watch("/api/v1/pods", version):
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        version = await self._list()  # expired: start over from a fresh list
                        break
                    version = str(obj.get("metadata", {}).get("resourceVersion", version))
                    if event.get("type") != "BOOKMARK":
                        self._observe(str(event.get("type")), obj)
            except (aiohttp.ClientError, ApiError, TimeoutError):
                await asyncio.sleep(0.5)
                version = await self._list()

    def _observe(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        if not ns.startswith("diff-") or ns in self._forgotten:
            return
        key = (ns, name)
        if kind == "DELETED":
            self.deleted.add(key)
            return
        self.pods[key] = pod
        cond = _scheduled_condition(pod)
        signature = (
            (pod.get("spec") or {}).get("nodeName"),
            cond.get("status"),
            cond.get("reason"),
            cond.get("message"),
        )
        if self._signature.get(key) != signature:
            self._signature[key] = signature
            self.changed_at[ns] = time.monotonic()

    def settled(
        self, copy: CaseCopy, stable: float, cycles_since: Callable[[float], int] | None = None
    ) -> bool:
        """Every pod of the copy seen and resolved, nothing changed for ``stable`` s and, with
        ``cycles_since`` (the scheduler's cycles completed since a moment), at least two
        cycles since the last change: one of them ran wholly after it, so a long cycle still
        deciding is not mistaken for a settled copy."""
        ns = copy.namespace
        for pod in copy.pods:
            seen = self.pods.get((ns, pod["metadata"]["name"]))
            if seen is None or not _resolved(seen):
                return False
        changed = self.changed_at.get(ns, 0.0)
        if time.monotonic() - changed < stable:
            return False
        return cycles_since is None or cycles_since(changed) >= 2

    def check_alive(self) -> None:
        """Raise if the watch task died."""
        if self._task is not None and self._task.done():
            self._task.result()
            raise RuntimeError("the pod watch ended")

    def forget(self, namespace: str) -> None:
        """Drop what was seen of a namespace (after its case was judged) and ignore it from
        now on."""
        self._forgotten.add(namespace)
        for key in [k for k in self.pods if k[0] == namespace]:
            del self.pods[key]
            self._signature.pop(key, None)
        self.deleted = {k for k in self.deleted if k[0] != namespace}
        self.changed_at.pop(namespace, None)

    async def stop(self) -> None:
        """Cancel the watch."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


# ------------------------------------------------------------------------------- harness


def differential_control_plane() -> ControlPlane:
    """A (not yet started) control plane with kube-scheduler's static identity."""
    return ControlPlane(static_users={peers.KUBE_SCHEDULER_USER: ()})


async def _bounded(jobs: Iterable[Callable[[], Any]], limit: int) -> list[Any]:
    sem = asyncio.Semaphore(limit)

    async def one(job: Callable[[], Any]) -> Any:
        async with sem:
            return await job()

    return list(await asyncio.gather(*(one(j) for j in jobs)))


async def _merge_patch(api: Api, path: str, body: Mapping[str, Any]) -> None:
    """A JSON merge patch (lists in it replace the object's)."""
    async with api.session.patch(
        api.server + path,
        data=json.dumps(body),
        headers={"Content-Type": "application/merge-patch+json"},
        timeout=aiohttp.ClientTimeout(total=120),
    ) as resp:
        if resp.status >= 300:
            raise ApiError("PATCH", path, resp.status, await resp.text())


async def _create_namespace(api: Api, name: str) -> None:
    """A namespace and its ``default`` ServiceAccount: pods are refused until that exists, and
    making it here spares waiting for the controller that would (which is slow under load)."""
    await api.call("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    await api.call(
        "POST",
        f"/api/v1/namespaces/{name}/serviceaccounts",
        {"metadata": {"name": "default"}},
        allow=(409,),
    )


def _flag(contender: peers.Contender, name: str) -> str:
    """The value of ``--name=value`` in the contender's (first) command line."""
    prefix = name + "="
    return next(a[len(prefix) :] for a in contender.commands[0].argv if a.startswith(prefix))


def _log(message: str) -> None:
    print(f"[differential {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Harness:
    """Both schedulers on one started control plane, ready to run cases."""

    def __init__(
        self,
        cp: ControlPlane,
        work: Path,
        *,
        settings: Settings | None = None,
        log: Callable[[str], None] = _log,
    ) -> None:
        self.cp = cp
        self.work = work
        self.settings = settings or Settings()
        self.log = log
        self._procs: list[Any] = []
        self._namespaces: set[str] = set()
        self._cleanups: list[asyncio.Task[None]] = []
        self.kube: peers.Contender | None = None
        self.ours: peers.Contender | None = None

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> Harness:
        """Our CRDs, RBAC and default queues; both schedulers started and ready."""
        cp = self.cp
        self.work.mkdir(parents=True, exist_ok=True)
        cp.kubectl("apply", "-f", str(REPO / "crds"))
        cp.kubectl(
            "wait", "--for", "condition=Established", "--timeout=60s",
            "crd/queues.scheduling.run.ai", "crd/podgroups.scheduling.run.ai",
        )  # fmt: skip
        cp.kubectl("apply", "-f", str(REPO / "manifests" / "defaults"))
        binary = find_bin_dir() / "kube-scheduler"
        if not binary.is_file():
            raise FileNotFoundError(f"{binary}: run testenv/build.sh (it builds kube-scheduler)")
        self.kube = peers.kube_scheduler(cp, self.work, binary, unthrottled=True)
        self._fast_backoff(self.kube)
        self.ours = peers.ours(cp, self.work, OURS_CONFIG, "info")
        try:
            for contender in (self.kube, self.ours):
                self._procs += contender.spawn(self.work)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def _fast_backoff(contender: peers.Contender) -> None:
        """Retry unschedulable pods after 1 s at most (default 1-10 s), so a pod that becomes
        schedulable when another is bound settles quickly."""
        path = Path(_flag(contender, "--config"))
        config = json.loads(path.read_text())
        config.update(podInitialBackoffSeconds=1, podMaxBackoffSeconds=1)
        path.write_text(json.dumps(config, indent=2))

    def _wait_ready(self, timeout: float = 90.0) -> None:
        assert self.kube is not None and self.ours is not None
        kube_port = _flag(self.kube, "--secure-port")
        ours_addr = _flag(self.ours, "--metrics-address")
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        probes = {
            "kube-scheduler": (f"https://127.0.0.1:{kube_port}/readyz", insecure),
            "ours": (f"http://{ours_addr}/readyz", None),
        }
        deadline = time.monotonic() + timeout
        for name, (url, context) in probes.items():
            while True:
                dead = [p.name for p in self._procs if not p.running()]
                if dead:
                    raise RuntimeError(f"{dead} exited early; logs in {self.work}")
                try:
                    with urllib.request.urlopen(url, timeout=2, context=context) as resp:
                        if resp.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name} not ready after {timeout}s ({url})")
                time.sleep(0.3)

    def stop(self) -> None:
        """Stop both schedulers (logs stay in ``work``)."""
        for proc in self._procs:
            proc.stop()
        self._procs = []

    def __enter__(self) -> Harness:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def logs(self) -> list[Path]:
        """The schedulers' log files."""
        return sorted(self.work.glob("*.log"))

    # --------------------------------------------------------------------- cases

    def run(self, seed: int, cases: int, *, first_index: int = 0) -> list[CaseResult]:
        """``cases`` cases with seeds ``seed, seed+1, ...``, in batches."""
        return asyncio.run(self._run(case_seeds(seed, cases), first_index))

    async def _run(self, seeds: Sequence[int], first_index: int) -> list[CaseResult]:
        results: list[CaseResult] = []
        async with Api(self.cp.server, self.cp.admin_token, self.cp.ca_file) as api:
            watch = PodWatch(api)
            await watch.start()
            try:
                size = self.settings.batch_size
                for start in range(0, len(seeds), size):
                    batch = [
                        (first_index + start + k, s)
                        for k, s in enumerate(seeds[start : start + size])
                    ]
                    began = time.monotonic()
                    results += await self._batch(api, watch, batch)
                    failed = sum(1 for r in results[-len(batch) :] if r.failures)
                    self.log(
                        f"cases {batch[0][0]}-{batch[-1][0]}: {failed} of {len(batch)} failed "
                        f"({time.monotonic() - began:.1f}s)"
                    )
            finally:
                await asyncio.gather(*self._cleanups)
                self._cleanups.clear()
                await watch.stop()
                # Not waited for: the namespaces are empty already.
                await _bounded(
                    (
                        partial(api.call, "DELETE", f"/api/v1/namespaces/{ns}", allow=(404, 409))
                        for ns in sorted(self._namespaces)
                    ),
                    self.settings.concurrency,
                )
                self._namespaces.clear()
        return results

    def _copies(self, index: int, seed: int) -> tuple[CaseCopy, CaseCopy]:
        assert self.kube is not None and self.ours is not None
        kube = generate(seed, index, KUBE, self.kube.scheduler_name)
        ours = generate(
            seed, index, OURS, self.ours.scheduler_name, pod_labels={QUEUE_LABEL: "default-queue"}
        )
        return kube, ours

    async def _batch(
        self, api: Api, watch: PodWatch, batch: Sequence[tuple[int, int]]
    ) -> list[CaseResult]:
        limit = self.settings.concurrency
        pairs = [self._copies(i, s) for i, s in batch]
        copies = [c for pair in pairs for c in pair]
        phases: dict[str, float] = {}
        clock = [time.monotonic()]

        def phase(name: str) -> None:
            now = time.monotonic()
            phases[name] = round(now - clock[0], 1)
            clock[0] = now

        try:
            self._namespaces.update(c.namespace for c in copies)
            await _bounded((partial(_create_namespace, api, c.namespace) for c in copies), limit)
            phase("namespaces")
            nodes = [n for c in copies for n in c.nodes]
            await _bounded((partial(self._create_node, api, n) for n in nodes), limit)
            phase("nodes")
            await self._wait_nodes(api, copies)
            phase("nodes_ready")
            # Copies in parallel, the pods of one copy one after the other, in the case's order.
            await asyncio.gather(*(self._create_pods(api, c) for c in copies))
            phase("pods")
            settled = await self._settle(watch, copies)
            phase("settle")
            node_objs = await self._nodes(api, copies)
            results = []
            for (index, seed), (kube, ours) in zip(batch, pairs, strict=True):
                outcomes = [
                    CopyOutcome(
                        copy=c,
                        pods=[
                            watch.pods.get((c.namespace, p["metadata"]["name"]), p) for p in c.pods
                        ],
                        server_nodes=node_objs.get(c.copy_id, []),
                        deleted=sorted(n for ns, n in watch.deleted if ns == c.namespace),
                        settled=c.namespace in settled,
                    )
                    for c in (kube, ours)
                ]
                result = CaseResult(
                    seed, index, sorted(kube.features), kube=outcomes[0], ours=outcomes[1]
                )
                result.failures = judge(seed, index, result.kube, result.ours)
                results.append(result)
            phase("judge")
            return results
        finally:
            self.log(f"batch phases (s): {phases}")
            # In the background: the next batch starts on its own nodes meanwhile.
            self._cleanups.append(asyncio.create_task(self._cleanup(api, watch, copies)))

    async def _create_pods(self, api: Api, copy: CaseCopy) -> None:
        for pod in copy.pods:
            await api.call("POST", f"/api/v1/namespaces/{copy.namespace}/pods", pod)

    async def _nodes(self, api: Api, copies: Sequence[CaseCopy]) -> dict[str, list[dict[str, Any]]]:
        """The copies' Node objects by case-label value."""
        ids = ",".join(c.copy_id for c in copies)
        listing = await api.call(
            "GET", "/api/v1/nodes", params={"labelSelector": f"{CASE_LABEL} in ({ids})"}
        )
        out: dict[str, list[dict[str, Any]]] = {}
        for node in listing.get("items", []):
            out.setdefault(node["metadata"]["labels"][CASE_LABEL], []).append(node)
        return out

    async def _create_node(self, api: Api, node: Mapping[str, Any]) -> None:
        """Create a node already Ready, then take off the ``node.kubernetes.io/not-ready``
        taint the API server puts on every new node.

        kwok would make the node Ready within a second or so and the node controller would
        then take the taint off, but only a few nodes a second (its client rate limit): with
        hundreds of nodes per batch, half a minute. A node that says it is Ready from the start
        (kwok keeps it so: heartbeats, lease) lets the harness take the taint off at once, as
        the node controller would."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "created Ready by the differential test",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        body = {**node, "status": {**node["status"], "conditions": [ready]}}
        await api.call("POST", "/api/v1/nodes", body)
        await _merge_patch(api, f"/api/v1/nodes/{node['metadata']['name']}", {"spec": node["spec"]})

    async def _wait_nodes(self, api: Api, copies: Sequence[CaseCopy], timeout: float = 60) -> None:
        """Until every node is Ready and has no ``node.kubernetes.io/*`` taint (the not-ready
        taint is taken off again should it be back: the spec's taints are the case's)."""
        spec = {n["metadata"]["name"]: n["spec"] for c in copies for n in c.nodes}
        deadline = time.monotonic() + timeout
        while True:
            by_copy = await self._nodes(api, copies)
            ready, tainted = set(), []
            for node in (n for nodes in by_copy.values() for n in nodes):
                name = node["metadata"]["name"]
                conds = (node.get("status") or {}).get("conditions") or []
                if any(
                    t.get("key", "").startswith("node.kubernetes.io/")
                    for t in (node.get("spec") or {}).get("taints") or []
                ):
                    tainted.append(name)
                elif any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds):
                    ready.add(name)
            if set(spec) <= ready:
                return
            if time.monotonic() > deadline:
                late = sorted(set(spec) - ready)[:10]
                raise TimeoutError(f"nodes not ready after {timeout}s: {late}")
            await _bounded(
                (
                    partial(_merge_patch, api, f"/api/v1/nodes/{n}", {"spec": spec[n]})
                    for n in tainted
                    if n in spec
                ),
                self.settings.concurrency,
            )
            await asyncio.sleep(0.5)

    async def _settle(self, watch: PodWatch, copies: Sequence[CaseCopy]) -> set[str]:
        """Wait until every copy settled or the timeout; the settled namespaces."""
        deadline = time.monotonic() + self.settings.timeout
        settled: set[str] = set()
        marks: list[tuple[float, int]] = []
        cycles = asyncio.create_task(self._count_cycles(marks))

        def cycles_since(moment: float) -> int:
            # The count read first after the moment: never more cycles than really ran since.
            after = [count for at, count in marks if at >= moment]
            return marks[-1][1] - after[0] if after else 0

        while True:
            watch.check_alive()
            for c in copies:
                since = cycles_since if c.side == OURS else None
                if c.namespace not in settled and watch.settled(c, self.settings.stable, since):
                    settled.add(c.namespace)
            if len(settled) == len(copies) or time.monotonic() > deadline:
                cycles.cancel()
                if len(settled) < len(copies):
                    late = [c.namespace for c in copies if c.namespace not in settled]
                    self.log(f"not settled after {self.settings.timeout}s: {late[:10]}")
                return settled
            await asyncio.sleep(0.25)

    async def _count_cycles(self, marks: list[tuple[float, int]]) -> None:
        """Append (time, ``kai_cycles_total``) of ours every 0.3 s."""
        assert self.ours is not None
        url = f"http://{_flag(self.ours, '--metrics-address')}/metrics"
        async with aiohttp.ClientSession() as session:
            while True:
                at = time.monotonic()
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                    async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                        for line in (await resp.text()).splitlines():
                            if line.startswith("kai_cycles_total "):
                                marks.append((at, int(float(line.split()[1]))))
                await asyncio.sleep(0.3)

    async def _cleanup(self, api: Api, watch: PodWatch, copies: Sequence[CaseCopy]) -> None:
        """Force-delete every pod of the copies (one delete-collection with grace 0 each: gone
        at once, no kubelet needs to confirm) and their nodes. The empty namespaces are deleted
        at the end of the run: deleting a namespace makes the namespace controller sweep every
        resource type in it, a load that would slow the next batches down."""
        ok = (404, 409, 429, 500, 504)
        limit = self.settings.concurrency
        await _bounded(
            (
                partial(
                    api.call,
                    "DELETE",
                    f"/api/v1/namespaces/{c.namespace}/pods",
                    params={"gracePeriodSeconds": "0"},
                    allow=ok,
                )
                for c in copies
            ),
            limit,
        )
        await _bounded(
            (
                partial(api.call, "DELETE", f"/api/v1/nodes/{n['metadata']['name']}", allow=ok)
                for c in copies
                for n in c.nodes
            ),
            limit,
        )
        for c in copies:
            watch.forget(c.namespace)
