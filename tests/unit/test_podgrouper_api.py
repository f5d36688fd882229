"""The grouper's API layer without a server: owner-chain walking, its cache, kinds found by
discovery, unreadable owners (as KAI: the chain stops below them), and the kopf wiring
(login from our kubeconfig handling, handler registration)."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest
from kubernetes_asyncio.client import Configuration

from scheduler.k8s.errors import Forbidden, KubeError, NotFound
from scheduler.k8s.resources import QUEUE
from scheduler.k8s.writer import ObjectRef
from scheduler.podgrouper.api import KubeGrouperApi, OwnerGone
from scheduler.podgrouper.controller import PodGrouper
from scheduler.podgrouper.operator import build_registry, connection_info, kopf_settings
from scheduler.podgrouper.owners import ObjectInfo
from scheduler.podgrouper.settings import OperatorSettings
from tests.unit.podgrouper_objects import NS, obj, raw


class ScriptedApi(KubeGrouperApi):
    """``KubeGrouperApi`` answering from a dict of path -> object (or error)."""

    def __init__(self, answers: dict[str, Any], **kw: Any) -> None:
        self.now = 0.0
        super().__init__(api=None, clock=lambda: self.now, **kw)  # type: ignore[arg-type]
        self.answers = answers
        self.requests: list[str] = []

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        self.requests.append(f"{method} {path}")
        await asyncio.sleep(0)
        answer = self.answers.get(path)
        if answer is None:
            raise NotFound(f"{path} not found", status=404, reason="NotFound")
        if isinstance(answer, KubeError):
            raise answer
        return answer


def _path(group_version: str, plural: str, name: str) -> str:
    base = f"/apis/{group_version}" if "/" in group_version else f"/api/{group_version}"
    return f"{base}/namespaces/{NS}/{plural}/{name}"


def _deployment_chain() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    deploy = raw("Deployment", "serve", api_version="apps/v1")
    rs = raw(
        "ReplicaSet",
        "serve-1",
        api_version="apps/v1",
        owner=obj("Deployment", "serve", api_version="apps/v1"),
    )
    pod = raw("Pod", "serve-1-a", owner=obj("ReplicaSet", "serve-1", api_version="apps/v1"))
    return deploy, rs, pod


async def test_chain_walks_to_the_top_owner_and_caches_owners() -> None:
    deploy, rs, pod = _deployment_chain()
    api = ScriptedApi(
        {
            _path("apps/v1", "replicasets", "serve-1"): rs,
            _path("apps/v1", "deployments", "serve"): deploy,
        }
    )
    chain = await api.owner_chain(ObjectInfo.from_k8s(pod))
    assert [o.kind for o in chain] == ["ReplicaSet", "Deployment"]
    assert len(api.requests) == 2
    # A second pod of the same ReplicaSet, concurrently: the cache answers.
    await asyncio.gather(*(api.owner_chain(ObjectInfo.from_k8s(pod)) for _ in range(5)))
    assert len(api.requests) == 2
    api.now = 11.0  # past owner_ttl: read again
    await api.owner_chain(ObjectInfo.from_k8s(pod))
    assert len(api.requests) == 4


async def test_concurrent_reads_of_one_owner_share_a_request() -> None:
    deploy, rs, pod = _deployment_chain()
    api = ScriptedApi(
        {
            _path("apps/v1", "replicasets", "serve-1"): rs,
            _path("apps/v1", "deployments", "serve"): deploy,
        }
    )
    await asyncio.gather(*(api.owner_chain(ObjectInfo.from_k8s(pod)) for _ in range(5)))
    assert len(api.requests) == 2


async def test_deleted_owner_is_owner_gone() -> None:
    _, rs, pod = _deployment_chain()
    api = ScriptedApi({_path("apps/v1", "replicasets", "serve-1"): rs})
    with pytest.raises(OwnerGone, match="Deployment/serve"):
        await api.owner_chain(ObjectInfo.from_k8s(pod))


async def test_owner_created_again_after_a_miss_is_found_at_once() -> None:
    deploy, rs, pod = _deployment_chain()
    api = ScriptedApi({_path("apps/v1", "replicasets", "serve-1"): rs})
    with pytest.raises(OwnerGone):
        await api.owner_chain(ObjectInfo.from_k8s(pod))
    api.answers[_path("apps/v1", "deployments", "serve")] = deploy
    chain = await api.owner_chain(ObjectInfo.from_k8s(pod))
    assert [o.kind for o in chain] == ["ReplicaSet", "Deployment"], "a miss is not cached"


async def test_fresh_chain_reads_every_owner_again() -> None:
    deploy, rs, pod = _deployment_chain()
    api = ScriptedApi(
        {
            _path("apps/v1", "replicasets", "serve-1"): rs,
            _path("apps/v1", "deployments", "serve"): deploy,
        }
    )
    await api.owner_chain(ObjectInfo.from_k8s(pod))
    await api.owner_chain(ObjectInfo.from_k8s(pod), fresh=True)
    assert len(api.requests) == 4


async def test_owner_replaced_under_the_same_name_is_owner_gone() -> None:
    _, rs, pod = _deployment_chain()
    rs["metadata"]["uid"] = "a-new-uid"
    api = ScriptedApi({_path("apps/v1", "replicasets", "serve-1"): rs})
    with pytest.raises(OwnerGone, match="replaced"):
        await api.owner_chain(ObjectInfo.from_k8s(pod))


async def test_unreadable_owner_stops_the_chain_below_it() -> None:
    _, rs, pod = _deployment_chain()
    api = ScriptedApi(
        {
            _path("apps/v1", "replicasets", "serve-1"): rs,
            _path("apps/v1", "deployments", "serve"): Forbidden("no", status=403),
        }
    )
    chain = await api.owner_chain(ObjectInfo.from_k8s(pod))
    assert [o.kind for o in chain] == ["ReplicaSet"], "the last readable owner is the top"


async def test_custom_kind_is_found_by_discovery() -> None:
    ray = raw("RayCluster", "ray", api_version="ray.io/v1")
    pod = raw("Pod", "ray-head", owner=obj("RayCluster", "ray", api_version="ray.io/v1"))
    api = ScriptedApi(
        {
            "/apis/ray.io/v1": {
                "resources": [
                    {"name": "rayclusters/status", "kind": "RayCluster", "namespaced": True},
                    {"name": "rayclusters", "kind": "RayCluster", "namespaced": True},
                ]
            },
            _path("ray.io/v1", "rayclusters", "ray"): ray,
        }
    )
    chain = await api.owner_chain(ObjectInfo.from_k8s(pod))
    assert [o.name for o in chain] == ["ray"]


async def test_kind_the_api_does_not_serve_stops_the_chain_until_its_crd_appears() -> None:
    pod = raw("Pod", "p", owner=obj("Widget", "w", api_version="example.com/v1"))
    api = ScriptedApi({})
    assert await api.owner_chain(ObjectInfo.from_k8s(pod)) == []
    api.answers["/apis/example.com/v1"] = {
        "resources": [{"name": "widgets", "kind": "Widget", "namespaced": True}]
    }
    api.answers[_path("example.com/v1", "widgets", "w")] = raw(
        "Widget", "w", api_version="example.com/v1"
    )
    assert await api.owner_chain(ObjectInfo.from_k8s(pod)) == [], "discovery is not asked again"
    api.now = 61.0
    chain = await api.owner_chain(ObjectInfo.from_k8s(pod))
    assert [o.kind for o in chain] == ["Widget"]


async def test_exists_is_cached_and_unknown_on_errors() -> None:
    api = ScriptedApi({"/apis/scheduling.run.ai/v2/queues/team-a": {"kind": "Queue"}})
    assert await api.exists(QUEUE, "team-a") is True
    assert await api.exists(QUEUE, "nope") is False
    assert await api.exists(QUEUE, "team-a") is True
    assert len(api.requests) == 2
    api.answers["/apis/scheduling.run.ai/v2/queues/locked"] = Forbidden("no", status=403)
    assert await api.exists(QUEUE, "locked") is None


async def test_events_are_rate_limited_per_object_and_message() -> None:
    api = ScriptedApi({})
    posted: list[str] = []

    async def record(method: str, path: str, **kw: Any) -> Any:
        posted.append(kw["body"]["reason"])
        return {}

    api._request = record  # type: ignore[method-assign]
    ref = ObjectRef("Job", "batch/v1", "train", NS, "uid-train")
    for _ in range(3):
        await api.event(ref, "QueueNotFound", "queue 'x' does not exist", warning=True)
    await api.event(ref, "QueueNotFound", "queue 'y' does not exist", warning=True)
    assert posted == ["QueueNotFound", "QueueNotFound"]


# ---------------------------------------------------------------- kopf wiring


async def test_login_turns_our_client_configuration_into_kopf_connection_info() -> None:
    cfg = Configuration()
    cfg.host = "https://127.0.0.1:6443"
    cfg.api_key = {"BearerToken": "s3cret"}
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    cfg.ssl_ca_cert = "/tmp/ca.crt"
    cfg.verify_ssl = True
    info = await connection_info(cfg)
    assert isinstance(info, kopf.ConnectionInfo)
    assert (info.server, info.scheme, info.token) == ("https://127.0.0.1:6443", "Bearer", "s3cret")
    assert info.ca_path == "/tmp/ca.crt" and info.insecure is False
    assert info.expiration is None, "a kubeconfig token does not rotate"
    cfg.verify_ssl = False
    cfg.api_key = {}
    cfg.cert_file, cfg.key_file = "/tmp/c.crt", "/tmp/c.key"
    info = await connection_info(cfg)
    assert info.insecure is True and info.token is None
    assert (info.certificate_path, info.private_key_path) == ("/tmp/c.crt", "/tmp/c.key")


def test_registry_has_login_pod_and_podgroup_handlers_only() -> None:
    grouper = PodGrouper(ScriptedApi({}))
    registry = build_registry(grouper, api=None)  # type: ignore[arg-type]
    watching = registry._watching.get_all_handlers()
    plurals = sorted(str(h.selector.any_name) for h in watching if h.selector is not None)
    assert plurals == ["podgroups", "pods"]
    assert not registry._changing.get_all_handlers(), "no state kept on watched objects"
    assert not registry._spawning.get_all_handlers()
    settings = kopf_settings(OperatorSettings(worker_limit=7))
    assert settings.scanning.disabled and settings.peering.standalone
    assert settings.posting.enabled is False
    assert settings.queueing.worker_limit == 7
