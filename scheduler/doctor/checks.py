"""The doctor's checks against a live API server: one coroutine per check, each returning a
:class:`CheckResult`. They fetch what they need with the scheduler's own client
(:mod:`scheduler.k8s.client`, kubernetes-asyncio) and leave the verdict to the pure judges in
:mod:`.judge_install` and :mod:`.judge_cluster`.

A check that cannot read what it needs (403, a timeout) says so as a ``warn``: doctor never
claims a failure it did not see. When the API server itself is unreachable, only that is
reported (every other check would fail the same way).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiClient

from scheduler.doctor import judge_cluster as jc
from scheduler.doctor import judge_install as ji
from scheduler.doctor.install import DEPLOYMENT_SELECTOR, PODGROUPER_SELECTOR, Install, install_from
from scheduler.doctor.rbac import CLUSTER_RULES, LEADER_ELECTION_RULES, Permission, permissions
from scheduler.doctor.result import CheckResult, Status
from scheduler.k8s.client import request_json
from scheduler.k8s.errors import Forbidden, KubeError, NotFound, error_for_status, translate
from scheduler.k8s.resources import LEASE, NODE, POD, PRIORITY_CLASS, QUEUE

__all__ = ["CHECKS", "Context", "DoctorSettings", "run_checks"]

_CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
_AUTHZ = "/apis/authorization.k8s.io/v1"
_PAGE = 500


@dataclass(frozen=True)
class DoctorSettings:
    """What the ``doctor`` flags choose."""

    #: Namespace the scheduler is installed in (``--namespace``).
    namespace: str = "kai-scheduler"
    #: A pod of ours pending longer than this many minutes is reported (``--pending-minutes``).
    pending_minutes: float = 5.0
    #: Scrape this URL instead of going through the API server's pod proxy (``--metrics-url``).
    metrics_url: str | None = None
    #: Namespace of the LeaderWorkerSet controller and its config (``--lws-namespace``).
    lws_namespace: str = "lws-system"
    #: Seconds allowed for one request (``--timeout``).
    timeout: float = 10.0


@dataclass
class Context:
    """What the checks share: the client, the settings, the install, and objects read once."""

    api: ApiClient
    settings: DoctorSettings
    now: Callable[[], float] = time.time
    install: Install = field(default_factory=lambda: Install(namespace="kai-scheduler"))
    pods: list[dict[str, Any]] = field(default_factory=list)
    lease: dict[str, Any] | None = None
    crds: dict[str, dict[str, Any] | None] = field(default_factory=dict)

    async def get(self, path: str, **query: Any) -> Any:
        """GET ``path`` as JSON."""
        return await request_json(self.api, "GET", path, query=query, timeout=self.settings.timeout)

    async def get_or_none(self, path: str) -> Any:
        """GET ``path``; None when it does not exist."""
        try:
            return await self.get(path)
        except NotFound:
            return None

    async def list_all(self, path: str, **query: Any) -> list[dict[str, Any]]:
        """Every item of a collection, page by page."""
        items: list[dict[str, Any]] = []
        token = None
        while True:
            page = await self.get(path, limit=_PAGE, **{"continue": token}, **query)
            items += (page or {}).get("items") or []
            token = ((page or {}).get("metadata") or {}).get("continue")
            if not token:
                return items

    async def crd(self, name: str) -> dict[str, Any] | None:
        """A CustomResourceDefinition (None when absent), read once per run."""
        if name not in self.crds:
            self.crds[name] = await self.get_or_none(f"{_CRD_PATH}/{name}")
        return self.crds[name]


async def _get_text(api: ApiClient, path: str, timeout: float) -> str:
    """GET ``path`` through the API server as text (``/metrics`` via the pod proxy)."""
    what = f"GET {path}"
    try:
        response: aiohttp.ClientResponse = await api.call_api(
            path, "GET", header_params={"Accept": "text/plain"}, auth_settings=["BearerToken"],
            _preload_content=False, _request_timeout=timeout,
        )  # fmt: skip
        async with response:
            raw = await response.read()
            if not 200 <= response.status <= 299:
                raise error_for_status(response.status, raw, headers=response.headers, what=what)
    except KubeError:
        raise
    except Exception as e:
        raise translate(e, what) from e
    return raw.decode(errors="replace")


async def _scrape(url: str, timeout: float) -> str:
    """GET a ``/metrics`` URL directly (``--metrics-url``, e.g. after kubectl port-forward)."""
    limit = aiohttp.ClientTimeout(total=timeout)
    async with aiohttp.ClientSession(timeout=limit) as session, session.get(url) as response:
        if response.status != 200:
            raise OSError(f"{url} answered HTTP {response.status}")
        return await response.text()


async def discover(ctx: Context) -> None:
    """Find the scheduler's Deployment, its ConfigMap, pods and Lease (what the checks share)."""
    ns = ctx.settings.namespace
    deployments = await ctx.list_all(
        f"/apis/apps/v1/namespaces/{ns}/deployments", labelSelector=DEPLOYMENT_SELECTOR
    )
    first = install_from(ns, deployments, {})
    maps: dict[str, Any] = {}
    if first.config_map:
        found = await ctx.get_or_none(f"/api/v1/namespaces/{ns}/configmaps/{first.config_map}")
        if found is not None:
            maps[first.config_map] = found
    ctx.install = install_from(ns, deployments, maps)
    if ctx.install.deployment is not None:
        labels = ((ctx.install.deployment.get("spec") or {}).get("selector") or {}).get(
            "matchLabels"
        ) or {}
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        ctx.pods = await ctx.list_all(POD.list_path(ns), labelSelector=selector)
    if ctx.install.leader_elect:
        lease_ns, lease_name = ctx.install.lease
        ctx.lease = await ctx.get_or_none(LEASE.object_path(lease_ns, lease_name))


async def check_api(ctx: Context) -> CheckResult:
    """The API server answers."""
    version = await ctx.get("/version")
    return CheckResult(
        "api", "API server", Status.OK,
        f"{ctx.api.configuration.host} answers (Kubernetes {(version or {}).get('gitVersion')})",
    )  # fmt: skip


async def check_deployment(ctx: Context) -> CheckResult:
    """The scheduler's Deployment and pods."""
    return ji.judge_deployment(ctx.install, ctx.pods)


async def check_leader(ctx: Context) -> CheckResult:
    """A leader holds and renews the Lease."""
    return ji.judge_leader(ctx.install, ctx.lease, ctx.pods, ctx.now())


def _metrics_pods(ctx: Context) -> list[str]:
    """Ready pods to scrape, the Lease holder first (only the leader runs cycles)."""
    holder = str(((ctx.lease or {}).get("spec") or {}).get("holderIdentity") or "")
    names = sorted(str(p["metadata"]["name"]) for p in ctx.pods if not ji.pod_problem(p))
    return sorted(names, key=lambda n: n != holder.rsplit("_", 1)[0])


async def check_cycle(ctx: Context) -> CheckResult:
    """The age of the last cycle: from ``/metrics`` if reachable, else from the Lease."""
    period = ctx.install.config.cycle_period
    errors: list[str] = []
    if ctx.settings.metrics_url:
        try:
            text = await _scrape(ctx.settings.metrics_url, ctx.settings.timeout)
            return ji.judge_cycle_from_metrics(text, ctx.now(), period, ctx.settings.metrics_url)
        except (OSError, aiohttp.ClientError, TimeoutError) as e:
            errors.append(f"{ctx.settings.metrics_url}: {e or type(e).__name__}")
    else:
        ns, port = ctx.install.namespace, ctx.install.metrics_port
        for pod in _metrics_pods(ctx)[:3]:
            path = f"/api/v1/namespaces/{ns}/pods/{pod}:{port}/proxy/metrics"
            try:
                text = await _get_text(ctx.api, path, min(3.0, ctx.settings.timeout))
                return ji.judge_cycle_from_metrics(text, ctx.now(), period, f"pod {pod}")
            except KubeError as e:
                errors.append(f"pod {pod} via the API server proxy: {e.message[:120]}")
        if not errors:
            errors.append("no Running and Ready pod to scrape")
    return ji.judge_cycle_from_lease(ctx.install, ctx.lease, ctx.now(), "; ".join(errors))


async def check_crds(ctx: Context) -> CheckResult:
    """Queue and PodGroup CRDs installed, Established, at the expected versions."""
    return ji.judge_crds({name: await ctx.crd(name) for name in ji.EXPECTED_CRDS})


async def check_queues(ctx: Context) -> CheckResult:
    """Default queue present and valid; no queue-tree findings."""
    try:
        queues: list[dict[str, Any]] | None = await ctx.list_all(QUEUE.list_path())
    except NotFound:
        queues = None
    return ji.judge_queues(queues, ctx.install.config.default_queue)


async def check_priority_classes(ctx: Context) -> CheckResult:
    """KAI's PriorityClasses exist."""
    return ji.judge_priority_classes(await ctx.list_all(PRIORITY_CLASS.list_path()))


async def _review(ctx: Context, kind: str, spec: dict[str, Any]) -> bool:
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": kind, "spec": spec}
    path = f"{_AUTHZ}/{kind.lower()}s"
    answer = await request_json(ctx.api, "POST", path, body=body, timeout=ctx.settings.timeout)
    return bool(((answer or {}).get("status") or {}).get("allowed"))


async def _whoami(ctx: Context) -> str:
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    try:
        answer = await request_json(
            ctx.api, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body=body,
            timeout=ctx.settings.timeout,
        )  # fmt: skip
    except KubeError:
        return ""
    return str((((answer or {}).get("status") or {}).get("userInfo") or {}).get("username", ""))


async def _cluster_role(ctx: Context, ns: str, sa: str) -> str:
    """The ClusterRole bound to the ServiceAccount that looks like the scheduler's (for the fix)."""
    try:
        bindings = await ctx.list_all("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings")
    except KubeError:
        return ctx.install.name
    for b in bindings:
        for s in b.get("subjects") or []:
            if s.get("kind") == "ServiceAccount" and (s.get("namespace"), s.get("name")) == (
                ns,
                sa,
            ):
                role = (b.get("roleRef") or {}).get("name")
                if role and "podgrouper" not in role:
                    return str(role)
    return ctx.install.name


async def check_rbac(ctx: Context) -> CheckResult:
    """Every (verb, group, resource) of the shipped roles, asked for the scheduler's
    ServiceAccount with SubjectAccessReviews (SelfSubjectAccessReviews if doctor may not)."""
    ns, sa = ctx.install.namespace, ctx.install.service_account
    subject = f"system:serviceaccount:{ns}:{sa}"
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"]
    lease_ns = ctx.install.lease[0]
    wanted: list[tuple[Permission, str | None]] = [(p, None) for p in permissions(CLUSTER_RULES)]
    wanted += [(p, lease_ns) for p in permissions(LEADER_ELECTION_RULES)]
    gate = asyncio.Semaphore(8)
    via_self = False

    async def ask(attrs: dict[str, str]) -> bool:
        async with gate:
            if via_self:
                return await _review(ctx, "SelfSubjectAccessReview", {"resourceAttributes": attrs})
            spec = {"user": subject, "groups": groups, "resourceAttributes": attrs}
            return await _review(ctx, "SubjectAccessReview", spec)

    try:
        first = await ask(wanted[0][0].attributes(wanted[0][1]))
    except Forbidden:
        via_self = True
        first = await ask(wanted[0][0].attributes(wanted[0][1]))
    rest = await asyncio.gather(*(ask(p.attributes(n)) for p, n in wanted[1:]))
    answers = [jc.AccessAnswer(p, n, ok) for (p, n), ok in zip(wanted, [first, *rest], strict=True)]
    if via_self and await _whoami(ctx) == subject:
        via_self = False  # doctor runs as the scheduler's ServiceAccount: the answer is exact
    role = await _cluster_role(ctx, ns, sa)
    return jc.judge_rbac(answers, subject, via_self=via_self, cluster_role=role)


async def check_gpu_nodes(ctx: Context) -> CheckResult:
    """Nodes with ``nvidia.com/gpu`` capacity."""
    return jc.judge_gpu_nodes(await ctx.list_all(NODE.list_path()))


async def check_pending_pods(ctx: Context) -> CheckResult:
    """Our pods pending longer than ``--pending-minutes``, and why."""
    names = ctx.install.scheduler_names
    pods: list[dict[str, Any]] = []
    for name in names:
        pods += await ctx.list_all(
            POD.list_path(), fieldSelector=f"spec.schedulerName={name},status.phase=Pending"
        )
    now, minutes = ctx.now(), ctx.settings.pending_minutes
    stuck = jc.stuck_pods(pods, names, now, minutes)
    events: dict[str, list[dict[str, Any]]] = {}
    for p in stuck[:20]:
        meta = p["metadata"]
        with_message = any(
            c.get("type") == "PodScheduled" and c.get("message")
            for c in (p.get("status") or {}).get("conditions") or []
        )
        if with_message or not meta.get("uid"):
            continue
        try:
            events[meta["uid"]] = await ctx.list_all(
                f"/api/v1/namespaces/{meta['namespace']}/events",
                fieldSelector=f"involvedObject.uid={meta['uid']}",
            )
        except KubeError:
            continue  # the reason is then "no event", which is still true as far as we know
    return jc.judge_pending_pods(stuck, events, names, now, minutes)


async def check_volcano(ctx: Context) -> CheckResult:
    """Volcano's CRDs, when present."""
    crds = {name: await ctx.crd(name) for name in jc.VOLCANO_CRDS}
    return jc.judge_volcano(crds, ctx.install.scheduler_names)


async def check_lws(ctx: Context) -> CheckResult:
    """How LeaderWorkerSet groups become gangs, when LWS is installed."""
    lws = await ctx.crd(jc.LWS_CRD)
    provider = None
    ready = False
    if lws is not None:
        lws_ns = ctx.settings.lws_namespace
        try:
            maps = await ctx.list_all(f"/api/v1/namespaces/{lws_ns}/configmaps")
        except (NotFound, Forbidden):
            maps = []
        provider = jc.lws_provider(maps)
        groupers = await ctx.list_all(
            f"/apis/apps/v1/namespaces/{ctx.install.namespace}/deployments",
            labelSelector=PODGROUPER_SELECTOR,
        )
        ready = any(int((d.get("status") or {}).get("readyReplicas") or 0) > 0 for d in groupers)
    volcano = await ctx.crd(jc.VOLCANO_CRDS[0])
    return jc.judge_lws(
        lws, provider, lws_namespace=ctx.settings.lws_namespace,
        volcano_podgroups=volcano is not None, podgrouper_ready=ready,
    )  # fmt: skip


Check = Callable[[Context], Awaitable[CheckResult]]

#: (name, title, check) in report order.
CHECKS: tuple[tuple[str, str, Check], ...] = (
    ("deployment", "scheduler Deployment and pods", check_deployment),
    ("leader", "leader Lease", check_leader),
    ("cycle", "last scheduling cycle", check_cycle),
    ("crds", "CRDs (Queue, PodGroup)", check_crds),
    ("queues", "default queues and queue tree", check_queues),
    ("priorityclasses", "PriorityClasses", check_priority_classes),
    ("rbac", "RBAC of the scheduler's ServiceAccount", check_rbac),
    ("gpu-nodes", "nodes with GPUs", check_gpu_nodes),
    ("pending-pods", "pods pending", check_pending_pods),
    ("volcano", "Volcano CRDs (optional)", check_volcano),
    ("lws", "LeaderWorkerSet gangs (optional)", check_lws),
)


def _could_not(name: str, title: str, error: KubeError) -> CheckResult:
    return CheckResult(
        name, title, Status.WARN, f"could not check: {error.message[:200]}",
        "run doctor with a kubeconfig that may read this (a cluster admin's)"
        if isinstance(error, Forbidden)
        else "retry; if it persists, check the API server's health (kubectl get --raw /readyz)",
    )  # fmt: skip


async def run_checks(
    api: ApiClient, settings: DoctorSettings, now: Callable[[], float] = time.time
) -> list[CheckResult]:
    """Run every check in :data:`CHECKS` order (only ``api`` when the server is unreachable)."""
    ctx = Context(api, settings, now)
    try:
        reachable = await check_api(ctx)
    except KubeError as e:
        return [
            CheckResult(
                "api", "API server", Status.FAIL,
                f"cannot reach {api.configuration.host}: {e.message[:200]}",
                "check --kube-config / --kube-api-server and that the server is up "
                "(kubectl version)",
            )
        ]  # fmt: skip
    results = [reachable]
    try:
        await discover(ctx)
    except KubeError as e:
        results.append(_could_not("deployment", "scheduler Deployment and pods", e))
    for name, title, check in CHECKS:
        if name == "deployment" and len(results) > 1:
            continue  # discovery already reported why it could not look
        try:
            results.append(await check(ctx))
        except KubeError as e:
            results.append(_could_not(name, title, e))
    return results
