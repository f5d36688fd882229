"""HTTP endpoints for probes and scraping: ``/healthz``, ``/readyz`` and ``/metrics``.

- ``/healthz`` is 200 while the event loop answers and the cycle loop has ticked recently
  (a wedged cycle turns it 500, so the kubelet restarts the process).
- ``/readyz`` is 200 once the cache has listed every kind (the scheduler can decide), whether
  or not this replica is the leader: a standby is ready to take over.
- ``/metrics`` is the Prometheus text format from :class:`scheduler.metrics.SchedulerMetrics`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from scheduler.metrics import SchedulerMetrics

__all__ = ["HealthServer", "HealthState", "parse_address"]


@dataclass
class HealthState:
    """What the probes report; the runner updates it."""

    #: Set once the cache finished its initial lists.
    ready: bool = False
    #: Monotonic time of the last cycle-loop tick (a cycle, or an idle wait ending).
    last_tick: float = 0.0
    #: The cycle loop is unhealthy when it has not ticked for this long.
    stall_seconds: float = 60.0
    #: Set when shutting down: readiness goes false so traffic drains.
    stopping: bool = False

    def tick(self) -> None:
        """Record that the cycle loop is alive."""
        self.last_tick = time.monotonic()

    def healthy(self) -> tuple[bool, str]:
        """(ok, reason)."""
        if self.last_tick and time.monotonic() - self.last_tick > self.stall_seconds:
            return False, f"cycle loop has not ticked for {self.stall_seconds:.0f}s"
        return True, "ok"


def parse_address(address: str) -> tuple[str, int]:
    """``host:port``, ``:port`` (all interfaces) or ``port`` to (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep:
        host, port = "", address
    host = host.strip("[]") or "0.0.0.0"
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        raise ValueError(f"--metrics-address {address!r} must look like :8080 or 127.0.0.1:8080")
    return host, number


class HealthServer:
    """An aiohttp server for the three endpoints."""

    def __init__(
        self,
        address: str,
        state: HealthState,
        metrics: SchedulerMetrics,
        extra_ready: Callable[[], tuple[bool, str]] | None = None,
        routes: Mapping[str, Callable[[web.Request], Awaitable[web.Response]]] | None = None,
    ) -> None:
        self.host, self.port = parse_address(address)
        self.state = state
        self.metrics = metrics
        self._extra_ready = extra_ready
        #: More GET handlers by path (e.g. ``/debug/snapshot`` when enabled).
        self._routes = dict(routes or {})
        self._runner: web.AppRunner | None = None

    async def _healthz(self, _: web.Request) -> web.Response:
        ok, reason = self.state.healthy()
        return web.Response(status=200 if ok else 500, text=reason)

    async def _readyz(self, _: web.Request) -> web.Response:
        if self.state.stopping:
            return web.Response(status=503, text="shutting down")
        if not self.state.ready:
            return web.Response(status=503, text="cache not synced yet")
        if self._extra_ready is not None:
            ok, reason = self._extra_ready()
            if not ok:
                return web.Response(status=503, text=reason)
        return web.Response(status=200, text="ok")

    async def _metrics(self, _: web.Request) -> web.Response:
        resp = web.Response(body=self.metrics.render())
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    async def start(self) -> None:
        """Bind and serve; :attr:`port` holds the real port afterwards (useful with port 0)."""
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        for path, handler in self._routes.items():
            app.router.add_get(path, handler)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or ()
        if sockets:
            self.port = int(sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
