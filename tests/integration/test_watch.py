"""List+watch against the real API server: events reach the cache, 410 Gone relists, dropped
connections and a vanished server are retried, a missing CRD is reported and retried, and
the client settings (kubeconfig, server override, TLS verification) behave as the flags say."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from kubernetes_asyncio.client.exceptions import ApiException
from multidict import CIMultiDict, CIMultiDictProxy

from scheduler.cache import Cache
from scheduler.k8s.client import ClientSettings, make_api_client, open_stream, request_json
from scheduler.k8s.errors import (
    ClientConfigError,
    Conflict,
    Forbidden,
    Invalid,
    KubeError,
    NotFound,
    PermanentError,
    TemporaryError,
    translate,
)
from scheduler.k8s.resources import LEASE, NODE, POD, ResourceKind
from scheduler.k8s.watch import Watcher, WatchSettings
from testenv.controlplane import ControlPlane
from tests.integration.support import SCHED, eventually, install_crds, kubectl

FAST = WatchSettings(watch_timeout=2, backoff_base=0.1, backoff_max=0.5, read_grace=5)


# --- helpers -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def crds(control_plane: ControlPlane) -> None:
    """Our CRDs installed and Established."""
    install_crds(control_plane)


def pod_manifest(
    name: str, *, annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None
) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "annotations": annotations or {}, "labels": labels or {}},
            "spec": {
                "schedulerName": SCHED,
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.invalid/fake:1",
                        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                    }
                ],
            },
        }
    )


@contextlib.asynccontextmanager
async def watching(
    settings: ClientSettings,
    kinds: tuple[str | ResourceKind, ...] | list[str] | None = None,
    timings: WatchSettings = FAST,
) -> AsyncIterator[tuple[Cache, Watcher]]:
    """A cache fed by a running watcher (synced on entry), stopped on exit."""
    api = await make_api_client(settings)
    cache = Cache(SCHED, "default-queue")
    watcher = (
        Watcher(api, cache, kinds, settings=timings)
        if kinds
        else Watcher(api, cache, settings=timings)
    )
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.wait_for(watcher.synced.wait(), 30)
        yield cache, watcher
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await api.close()


def admin(cp: ControlPlane) -> ClientSettings:
    return ClientSettings(kube_config=str(cp.kubeconfig))


# --- watch -------------------------------------------------------------------------------


@pytest.mark.e2e
async def test_watch_sees_every_kind_created_updated_deleted(
    control_plane: ControlPlane, crds: None, namespace: str, make_gpu_nodes: Any
) -> None:
    cp = control_plane
    async with watching(admin(cp)) as (cache, watcher):
        assert watcher.listed == {
            "Pod", "Node", "Queue", "PodGroup", "PriorityClass", "PodDisruptionBudget",
            "PersistentVolumeClaim", "PersistentVolume", "StorageClass",
            "DeviceClass", "ResourceSlice", "ResourceClaim",
        }  # fmt: skip
        (node,) = await asyncio.to_thread(make_gpu_nodes, 1, gpus=4)
        queue = f"q-{namespace}"
        await kubectl(
            cp, "apply", "-f", "-",
            input=json.dumps({
                "apiVersion": "scheduling.run.ai/v2", "kind": "Queue",
                "metadata": {"name": queue},
                "spec": {"resources": {"gpu": {"quota": 2}}},
            }),
        )  # fmt: skip
        await kubectl(
            cp, "apply", "-n", namespace, "-f", "-",
            input=json.dumps({
                "apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
                "metadata": {"name": "train"},
                "spec": {"minMember": 2, "queue": queue},
            }),
        )  # fmt: skip
        await kubectl(cp, "apply", "-n", namespace, "-f", "-", input=pod_manifest("solo"))
        for i in range(2):
            manifest = pod_manifest(f"w{i}", annotations={"pod-group-name": "train"})
            await kubectl(cp, "apply", "-n", namespace, "-f", "-", input=manifest)

        def seen() -> Any:
            snap = cache.snapshot()
            mine = {p.name: p for p in snap.pods if p.namespace == namespace}
            return snap if len(mine) == 3 and node in snap.node_by_name else None

        snap = await eventually("pods, node, queue, podgroup in the snapshot", seen)
        assert snap.node_by_name[node].gpu_count == 4
        assert queue in {q.name for q in snap.queues}
        gang = snap.gang_by_key[f"{namespace}/train"]
        assert gang.min_member == 2 and gang.queue == queue
        pods = {p.name: p for p in snap.pods if p.namespace == namespace}
        assert pods["w0"].queue == queue and pods["solo"].queue == "default-queue"
        assert all(p.pending for p in pods.values())

        # Update: relabel the lone pod into another queue.
        await kubectl(cp, "label", "pod", "solo", "-n", namespace, "kai.scheduler/queue=other")
        await eventually(
            "label update",
            lambda: {p.name: p.queue for p in cache.snapshot().pods}.get("solo") == "other",
        )
        # Delete: pod, PodGroup and queue disappear.
        await kubectl(cp, "delete", "pod", "solo", "-n", namespace, "--wait=false")
        await kubectl(cp, "delete", "podgroup", "train", "-n", namespace)
        await kubectl(cp, "delete", "queue", queue)

        def gone() -> bool:
            snap = cache.snapshot()
            return (
                "solo" not in {p.name for p in snap.pods if p.namespace == namespace}
                and f"{namespace}/train" not in snap.gang_by_key
                and queue not in {q.name for q in snap.queues}
            )

        await eventually("deletions", gone)
        # A finished pod stays known (its gang counts it) but holds nothing and waits for nothing.
        await kubectl(
            cp, "patch", "pod", "w1", "-n", namespace, "--subresource=status",
            "--type=merge", "-p", '{"status": {"phase": "Succeeded"}}',
        )  # fmt: skip

        def finished() -> bool:
            raw = cache.raw("Pod", namespace, "w1")
            return raw is not None and (raw.get("status") or {}).get("phase") == "Succeeded"

        await eventually("the finished pod in the cache", finished)
        assert not any(
            p.pending or p.active
            for p in cache.snapshot().pods
            if p.namespace == namespace and p.name == "w1"
        )
        # The members now name a missing PodGroup: not scheduled, and a problem says why.
        problems = {(p.kind, p.name): p for p in cache.problems() if p.namespace == namespace}
        assert problems[("Pod", "w0")].reason == "PodGroupNotFound"


class Recorder:
    """An event sink that keeps the objects it was given (for kinds the cache ignores)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.relists = 0

    def apply(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        key = f"{obj['metadata'].get('namespace')}/{obj['metadata']['name']}"
        if event_type == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = obj

    def relisted(self, kind: str, objs: Any) -> None:
        self.objects = {}
        for obj in objs:
            self.apply(kind, "ADDED", obj)
        self.relists += 1

    def relist_done(self, kind: str, listed: Any) -> None:
        self.relists += 1
        keep = {f"{ns or None}/{name}" for ns, name in listed}
        self.objects = {k: v for k, v in self.objects.items() if k in keep}


async def first_watch_event(api: Any, kind: ResourceKind, rv: str) -> dict[str, Any]:
    query = {"watch": True, "resourceVersion": rv, "timeoutSeconds": 1}
    async with await open_stream(api, kind.list_path(), query=query) as response:
        line = await response.content.readline()
    return json.loads(line) if line else {}


async def expire_history(cp: ControlPlane, api: Any, namespace: str) -> None:
    """Churn Leases until the API server no longer keeps history back to resourceVersion 1.

    The watch cache keeps at least every event younger than ~75 s (growing its buffer while
    events are fresh), so history is dropped only once the oldest events are older than that:
    wait until the control plane is ~80 s old (no wait on a control plane that has run a
    while), then one burst of updates pushes the oldest events out.
    """
    created = await kubectl(
        cp, "get", "namespace", "default", "-o", "jsonpath={.metadata.creationTimestamp}"
    )
    age = (
        time.time() - dt.datetime.fromisoformat(created.strip().replace("Z", "+00:00")).timestamp()
    )
    if age < 80:
        await asyncio.sleep(80 - age)
    for burst in range(1, 6):
        leases = [
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": f"churn-{i}", "annotations": {"burst": str(burst)}},
                "spec": {"holderIdentity": f"h{burst}"},
            }
            for i in range(150)
        ]
        manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": leases})
        await kubectl(cp, "apply", "-n", namespace, "-f", "-", input=manifest)
        event = await first_watch_event(api, LEASE, "1")
        if event.get("type") == "ERROR" and event["object"].get("code") == 410:
            return
    raise AssertionError("the API server still serves resourceVersion 1 after 5 bursts of churn")


@pytest.mark.e2e
async def test_a_paged_list_applies_each_page_and_removes_what_is_gone_at_the_end(
    control_plane: ControlPlane, namespace: str
) -> None:
    """Pages go into the sink as they arrive (the next is fetched meanwhile); an object the
    sink held that the list does not name is removed only once the last page is in."""
    leases = [
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": f"paged-{i}"},
            "spec": {"holderIdentity": f"h{i}"},
        }
        for i in range(7)
    ]
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": leases})
    await kubectl(control_plane, "apply", "-n", namespace, "-f", "-", input=manifest)
    api = await make_api_client(admin(control_plane))
    try:

        class Ordered(Recorder):
            def __init__(self) -> None:
                super().__init__()
                self.calls: list[str] = []

            def apply(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
                self.calls.append(obj["metadata"]["name"])
                super().apply(kind, event_type, obj)

            def relist_done(self, kind: str, listed: Any) -> None:
                self.calls.append(f"done:{len(listed)}")
                super().relist_done(kind, listed)

        sink = Ordered()
        sink.objects[f"{namespace}/gone-lease"] = {"metadata": {"name": "gone-lease"}}
        settings = WatchSettings(
            page_size=2, watch_timeout=2, backoff_base=0.1, backoff_max=0.5, read_grace=5
        )
        watcher = Watcher(api, sink, [LEASE], settings=settings)
        await watcher.run(iterations=1)
        ours = {k for k in sink.objects if k.startswith(f"{namespace}/")}
        assert ours == {f"{namespace}/paged-{i}" for i in range(7)}
        assert sink.calls[-1].startswith("done:") and sink.relists == 1
        # Every lease of the cluster was applied before the end, one call each.
        assert len(sink.calls) - 1 == int(sink.calls[-1].split(":")[1])
    finally:
        await api.close()


@pytest.mark.e2e
async def test_expired_resource_version_relists(
    control_plane: ControlPlane, namespace: str
) -> None:
    api = await make_api_client(admin(control_plane))
    try:
        sink = Recorder()
        watcher = Watcher(api, sink, [LEASE], settings=FAST)
        await watcher.run(iterations=1)  # the initial list
        assert watcher.list_count == {"Lease": 1} and watcher.synced.is_set()
        await expire_history(control_plane, api, namespace)
        assert f"{namespace}/churn-0" not in sink.objects
        # Resume from a resourceVersion the API server no longer has: 410 Gone, list again.
        watcher.resource_versions["Lease"] = "1"
        await watcher.run(iterations=2)  # watch -> Gone -> list
        assert watcher.list_count == {"Lease": 2} and sink.relists == 2
        assert f"{namespace}/churn-0" in sink.objects
        assert int(watcher.resource_versions["Lease"]) > 1
    finally:
        await api.close()


class TcpRelay:
    """A plain TCP relay in front of the API server: dropping it cuts every connection and
    refuses new ones, as an API server restart does."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._frozen: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, "127.0.0.1", self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            while data := await reader.read(65536):
                if writer in self._frozen:
                    continue  # swallowed: the connection stays open but goes silent
                writer.write(data)
                await writer.drain()
        writer.close()

    def freeze(self) -> None:
        """Every open connection goes silent without closing (a half-open connection, a
        stalled proxy); new connections work."""
        self._frozen |= self._writers

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def drop(self) -> None:
        assert self._server is not None
        self._server.close()
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()
        await self._server.wait_closed()


async def relayed(cp: ControlPlane) -> tuple[TcpRelay, ClientSettings]:
    """A started relay to the API server, and client settings that go through it (the server
    flag overrides the kubeconfig's server)."""
    relay = TcpRelay(int(cp.server.rsplit(":", 1)[1]))
    await relay.start()
    settings = ClientSettings(
        kube_config=str(cp.kubeconfig), api_server=f"https://127.0.0.1:{relay.port}"
    )
    return relay, settings


@pytest.mark.e2e
async def test_watch_recovers_from_dropped_connections_and_server_outage(
    control_plane: ControlPlane, namespace: str
) -> None:
    cp = control_plane
    relay, settings = await relayed(cp)
    async with watching(settings, ("Pod", "Node")) as (cache, watcher):
        await relay.drop()  # connections cut, port closed: the "API server" is down
        await kubectl(cp, "apply", "-n", namespace, "-f", "-", input=pod_manifest("during"))
        await eventually(
            "a retried connection failure",
            lambda: isinstance(watcher.errors.get("Pod"), TemporaryError),
        )
        assert cache.raw("Pod", namespace, "during") is None
        await relay.start()  # back on the same port
        await eventually(
            "the pod created during the outage",
            lambda: cache.raw("Pod", namespace, "during") is not None,
        )
        await eventually("healthy again", lambda: watcher.errors.get("Pod", "x") is None)
    await relay.drop()


@pytest.mark.e2e
async def test_a_silent_watch_is_dropped_after_its_heartbeat_timeout(
    control_plane: ControlPlane, namespace: str
) -> None:
    cp = control_plane
    relay, settings = await relayed(cp)
    # A long server-side timeout: only the heartbeat can notice the dead connection.
    beat = WatchSettings(watch_timeout=300, read_grace=60, heartbeat_timeout=2.0,
                         backoff_base=0.05, backoff_max=0.2)  # fmt: skip
    async with watching(settings, [POD.kind], beat) as (cache, watcher):
        relay.freeze()
        await kubectl(cp, "apply", "-n", namespace, "-f", "-", input=pod_manifest("after"))
        await eventually(
            "the pod created after the watch went silent",
            lambda: cache.raw("Pod", namespace, "after") is not None,
            timeout=20,
        )
        assert watcher.list_count["Pod"] == 1  # resumed from its resourceVersion, no relist
    await relay.drop()


@pytest.mark.e2e
async def test_missing_crd_does_not_hold_up_sync_and_is_retried(
    control_plane: ControlPlane,
) -> None:
    widgets = ResourceKind("Widget", "widgets.example.com", "v1", "widgets", namespaced=False)
    delays: list[float] = []

    async def record_sleep(seconds: float) -> None:
        delays.append(seconds)

    api = await make_api_client(admin(control_plane))
    try:
        cache = Cache(SCHED, "default-queue")
        watcher = Watcher(
            api, cache, [NODE.kind, widgets], settings=FAST, sleep=record_sleep, rng=lambda: 1.0
        )
        await watcher.run(iterations=4)
        # A CRD that is not installed holds nothing up: it counts as listed with no objects
        # (cycles run; what needs it waits), and its list is retried with back-off.
        assert watcher.listed == {"Node", "Widget"} and watcher.absent == {"Widget"}
        assert watcher.synced.is_set()
        assert isinstance(watcher.errors["Widget"], NotFound)
        # Back-off doubles per failure, capped (jitter pinned by rng=1.0).
        assert delays[:3] == [0.1, 0.2, 0.4]
    finally:
        await api.close()


# --- client ------------------------------------------------------------------------------


@pytest.mark.e2e
async def test_client_errors_are_typed(control_plane: ControlPlane, namespace: str) -> None:
    cp = control_plane
    api = await make_api_client(admin(cp))
    try:
        with pytest.raises(NotFound) as missing:
            await request_json(api, "GET", POD.object_path(namespace, "nope"))
        assert missing.value.status == 404 and "nope" in str(missing.value)
        assert missing.value.__cause__ is None or isinstance(missing.value.__cause__, Exception)
    finally:
        await api.close()
    # A ServiceAccount without RBAC grants: 403, typed.
    token = await asyncio.to_thread(cp.service_account_token, namespace, "default")
    path = await asyncio.to_thread(cp.kubeconfig_for_token, token, f"sa-{namespace}")
    api = await make_api_client(ClientSettings(kube_config=str(path)))
    try:
        with pytest.raises(Forbidden):
            await request_json(api, "GET", NODE.list_path())
    finally:
        await api.close()


@pytest.mark.e2e
async def test_forbidden_after_being_allowed_is_retried_soon(
    control_plane: ControlPlane, namespace: str
) -> None:
    # A restarted API server answers 403 for a few seconds while its RBAC caches fill; a
    # kind we could read before is retried at once rather than after a growing back-off.
    cp = control_plane
    role = f"read-pods-{namespace}"
    await kubectl(cp, "create", "clusterrole", role, "--verb=get,list,watch", "--resource=pods")
    await kubectl(cp, "create", "clusterrolebinding", role, f"--clusterrole={role}",
                  f"--serviceaccount={namespace}:default")  # fmt: skip
    token = await asyncio.to_thread(cp.service_account_token, namespace, "default")
    path = await asyncio.to_thread(cp.kubeconfig_for_token, token, f"sa-{namespace}")
    delays: list[float] = []

    async def record_sleep(seconds: float) -> None:
        delays.append(seconds)
        await asyncio.sleep(min(seconds, 0.2))

    api = await make_api_client(ClientSettings(kube_config=str(path)))
    watcher = Watcher(api, Cache(SCHED, "default-queue"), [POD.kind], settings=FAST,
                      sleep=record_sleep)  # fmt: skip
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.wait_for(watcher.synced.wait(), 30)
        await kubectl(cp, "delete", "clusterrolebinding", role)
        await eventually(
            "a 403 on the next watch",
            lambda: isinstance(watcher.errors.get("Pod"), Forbidden),
            timeout=30,
        )
        await eventually("a few retries", lambda: len(delays) >= 3, timeout=30)
        assert max(delays) <= 2 * FAST.backoff_base, delays
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()
        await kubectl(cp, "delete", "clusterrole", role)


@pytest.mark.e2e
async def test_api_secure_false_skips_tls_verification(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    for cluster in config["clusters"]:
        cluster["cluster"].pop("certificate-authority", None)  # server cert now unverifiable
    bare = tmp_path / "no-ca.kubeconfig"
    bare.write_text(json.dumps(config))

    async def list_nodes(secure: bool) -> Any:
        api = await make_api_client(ClientSettings(kube_config=str(bare), api_secure=secure))
        try:
            return await request_json(api, "GET", NODE.list_path(), query={"limit": 1})
        finally:
            await api.close()

    assert (await list_nodes(False))["kind"] == "NodeList"
    with pytest.raises(TemporaryError, match=r"(?i)certificate"):
        await list_nodes(True)


async def test_missing_kubeconfig_outside_a_cluster_names_the_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ClientConfigError, match=re.escape("--kube-config=/nonexistent/admin.conf")):
        await make_api_client(ClientSettings(kube_config="/nonexistent/admin.conf"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    with pytest.raises(ClientConfigError, match="--kube-config"):
        await make_api_client(ClientSettings())
    bad = ClientSettings(kube_config=None, api_server="kubernetes.default.svc")
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/config")
    with pytest.raises(ClientConfigError):
        await make_api_client(bad)


def test_translate_maps_statuses_and_chains_the_cause() -> None:
    conflict = ApiException(status=409, reason="Conflict")
    status = {"kind": "Status", "reason": "AlreadyExists", "message": "taken"}
    conflict.body = json.dumps(status).encode()
    err = translate(conflict, "POST binding")
    assert isinstance(err, Conflict) and err.__cause__ is conflict
    assert err.reason == "AlreadyExists" and "POST binding" in str(err) and "taken" in str(err)
    busy = ApiException(status=429, reason="TooManyRequests")
    busy.headers = CIMultiDictProxy(CIMultiDict({"Retry-After": "7"}))
    throttled = translate(busy)
    assert isinstance(throttled, TemporaryError) and throttled.retry_after == 7.0
    assert isinstance(translate(ApiException(status=503)), TemporaryError)
    assert isinstance(translate(ApiException(status=422)), Invalid)
    assert isinstance(translate(ApiException(status=418)), PermanentError)
    refused = aiohttp.ClientConnectionError("refused")
    assert isinstance(translate(refused), TemporaryError)
    assert isinstance(translate(TimeoutError()), TemporaryError)
    already = NotFound("x", status=404)
    assert translate(already) is already
    assert type(translate(RuntimeError("bug"))) is KubeError


@pytest.mark.e2e
async def test_a_crashing_kind_task_stops_the_watcher(control_plane: ControlPlane) -> None:
    class Broken(Recorder):
        def relist_done(self, kind: str, listed: Any) -> None:
            if kind == "Node":
                raise RuntimeError("bug in the sink")
            super().relist_done(kind, listed)

    api = await make_api_client(admin(control_plane))
    try:
        watcher = Watcher(api, Broken(), ["Pod", "Node"], settings=FAST)
        with pytest.raises(RuntimeError, match="bug in the sink"):
            await asyncio.wait_for(watcher.run(), 30)  # would run forever if not stopped
        assert not watcher.synced.is_set()
        leftovers = [t for t in asyncio.all_tasks() if t.get_name().startswith("watch-")]
        assert leftovers == []
    finally:
        await api.close()
