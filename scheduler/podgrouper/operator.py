"""The pod grouper as a process: kopf watches pods and PodGroups and calls the controller.

kopf does the watching (list, then watch; reconnects; 410 Gone), serialises the events of
each object and runs objects concurrently; :class:`~scheduler.podgrouper.controller.PodGrouper`
does the work. The kopf settings that matter here:

- **Event handlers only** (``@kopf.on.event``): they keep no state on the watched objects, so
  kopf writes nothing to pods (no progress annotations, no finalizers) and needs no
  permission beyond list/watch. Retries are the controller's own (back-off per pod).
- **Authentication**: kopf's built-in login handlers read ``$KUBECONFIG`` or the in-cluster
  service account, but not a ``--kube-config`` path with ``--kube-api-server`` /
  ``--kube-api-secure`` overrides as the scheduler takes them. So one ``@kopf.on.login``
  handler turns the same kubernetes-asyncio configuration the grouper's own requests use
  (:func:`scheduler.k8s.client.make_api_client`) into a ``kopf.ConnectionInfo``: server, CA,
  TLS verification, bearer token or client certificate. An in-cluster token is re-read (and
  kopf logs in again) every ten minutes, as projected tokens rotate.
- **No peering, no scanning, no implicit Events**: one replica runs (``standalone``); kopf does
  not watch CRDs or namespaces (that would need more RBAC); Events come from the controller.
- At most ``worker_limit`` objects are processed at once.

``/healthz`` answers 200 while the operator runs, ``/readyz`` once kopf has started, and
``/metrics`` gives the controller's counters in the Prometheus text format.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Mapping
from typing import Any

import kopf
import structlog
from aiohttp import web
from kubernetes_asyncio.client import ApiClient

from scheduler.health import parse_address
from scheduler.k8s.client import ClientSettings, make_api_client
from scheduler.k8s.errors import ClientConfigError
from scheduler.k8s.resources import PODGROUP
from scheduler.podgrouper.api import KubeGrouperApi
from scheduler.podgrouper.controller import PodGrouper
from scheduler.podgrouper.settings import OperatorSettings

__all__ = ["build_registry", "connection_info", "kopf_settings", "run"]

log = structlog.get_logger("scheduler.podgrouper.operator")


async def connection_info(cfg: Any) -> kopf.ConnectionInfo:
    """A kubernetes-asyncio ``Configuration`` as kopf's connection settings."""
    header = await cfg.get_api_key_with_prefix("BearerToken")
    scheme: str | None = None
    token: str | None = None
    if header:
        first, _, rest = str(header).partition(" ")
        scheme, token = ("Bearer", first) if not rest else (first, rest)
    expiration = None
    if cfg.refresh_api_key_hook is not None:
        expiration = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=10)
    return kopf.ConnectionInfo(
        server=str(cfg.host),
        ca_path=cfg.ssl_ca_cert or None,
        insecure=not cfg.verify_ssl,
        scheme=scheme,
        token=token,
        certificate_path=cfg.cert_file or None,
        private_key_path=cfg.key_file or None,
        expiration=expiration,
    )


def kopf_settings(settings: OperatorSettings) -> kopf.OperatorSettings:
    """kopf's settings (see the module docstring)."""
    ks = kopf.OperatorSettings()
    ks.posting.enabled = False
    ks.scanning.disabled = True
    ks.peering.standalone = True
    ks.queueing.worker_limit = settings.worker_limit
    ks.watching.server_timeout = 270
    ks.watching.client_timeout = 300
    ks.watching.connect_timeout = 10
    ks.networking.request_timeout = 60
    return ks


def build_registry(grouper: PodGrouper, api: ApiClient) -> kopf.OperatorRegistry:
    """The kopf handlers: login, pods (of our schedulers) and PodGroups."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    async def login(**_: Any) -> kopf.ConnectionInfo:
        return await connection_info(api.configuration)

    def ours(body: Mapping[str, Any], **_: Any) -> bool:
        return grouper.handles(body)

    @kopf.on.event("", "v1", "pods", when=ours, registry=registry)
    async def pod_event(event: Mapping[str, Any], body: Mapping[str, Any], **_: Any) -> None:
        await grouper.on_pod_event(event.get("type"), body)

    @kopf.on.event(PODGROUP.group, PODGROUP.version, PODGROUP.plural, registry=registry)
    async def podgroup_event(event: Mapping[str, Any], body: Mapping[str, Any], **_: Any) -> None:
        await grouper.on_podgroup_event(event.get("type"), body)

    return registry


class _Probes:
    """/healthz, /readyz, /metrics."""

    def __init__(self, address: str, grouper: PodGrouper, ready: asyncio.Event) -> None:
        self.host, self.port = parse_address(address)
        self.grouper = grouper
        self.ready = ready
        self.alive = True
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        log.info("probes_listening", address=f"{self.host}:{self.port}")

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(
            text="ok" if self.alive else "stopping", status=200 if self.alive else 500
        )

    async def _readyz(self, _: web.Request) -> web.Response:
        ok = self.ready.is_set() and self.alive
        return web.Response(text="ok" if ok else "starting", status=200 if ok else 503)

    async def _metrics(self, _: web.Request) -> web.Response:
        lines = []
        for name in sorted(self.grouper.stats):
            metric = f"kai_podgrouper_{name}_total"
            lines += [f"# TYPE {metric} counter", f"{metric} {self.grouper.stats[name]}"]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")


async def run(settings: OperatorSettings, connection: ClientSettings) -> int:
    """Run until SIGTERM/SIGINT. Exit codes: 0 clean stop, 1 failure, 2 bad connection
    settings (the message names the flag)."""
    try:
        api = await make_api_client(connection)
    except ClientConfigError as e:
        log.error("bad_connection_settings", error=str(e))
        return 2
    grouper = PodGrouper(
        KubeGrouperApi(
            api,
            component=settings.component,
            instance=settings.identity,
            max_in_flight=settings.max_in_flight,
            owner_ttl=settings.owner_ttl,
        ),
        settings.grouper,
    )
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        # kopf logs every handled event at INFO; the controller logs what matters.
        logging.getLogger("kopf").setLevel(logging.WARNING)
    ready = asyncio.Event()
    probes = _Probes(settings.metrics_address, grouper, ready)
    code = 0
    try:
        await probes.start()
        log.info(
            "podgrouper_starting",
            schedulers=sorted(settings.grouper.scheduler_names),
            default_queue=settings.grouper.default_queue,
        )
        await kopf.operator(
            registry=build_registry(grouper, api),
            settings=kopf_settings(settings),
            standalone=True,
            clusterwide=True,
            ready_flag=ready,
        )
        log.info("podgrouper_stopped", **dict(grouper.stats))
    except OSError as e:
        log.error("probes_failed", address=settings.metrics_address, error=str(e))
        code = 2
    except Exception:
        log.exception("podgrouper_failed")
        code = 1
    finally:
        probes.alive = False
        await grouper.close()
        await probes.stop()
        await api.close()
    return code
