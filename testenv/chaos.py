"""Fault injectors for chaos tests, run on the test's asyncio loop.

- :class:`TcpRelay` sits between a client (the scheduler) and kube-apiserver. Point the
  client's kubeconfig at :attr:`TcpRelay.url`: TLS passes through untouched (the API server's
  certificate covers 127.0.0.1). :meth:`TcpRelay.cut` aborts every open connection (watches
  included, as a NAT or load-balancer reset would); :meth:`TcpRelay.stall` stops forwarding
  bytes for some seconds without closing anything (a network partition that heals);
  :meth:`TcpRelay.freeze` does that only to the connections open at the time, while new ones
  work (a half-open watch: the client keeps waiting on a connection nobody serves).
- :class:`BindingWebhook` is a validating admission webhook (HTTPS, certificate from
  :func:`testenv.pki.make_pki`) for CREATE on ``pods/binding`` and ``pods/eviction`` in one
  namespace. It denies a seeded-random share of binds and records every bind and eviction it
  admits, so a test knows independently of the scheduler which pods were evicted.
  :meth:`BindingWebhook.configuration` is the ValidatingWebhookConfiguration to create
  (``clientConfig.url``, ``failurePolicy: Fail``).

Killing the scheduler and restarting kube-apiserver need no injector here:
``SchedulerProcess.kill()`` and :meth:`testenv.ControlPlane.restart_apiserver` do that.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from testenv.pki import make_pki

__all__ = ["WEBHOOK_PROBE_PREFIX", "AdmissionRecord", "BindingWebhook", "TcpRelay"]

#: Binds of pods named like this are always denied: a test creates such a pod and binds it
#: until the denial shows the webhook is live (the API server loads webhook configs lazily).
WEBHOOK_PROBE_PREFIX = "chaos-webhook-probe"
_CHUNK = 64 * 1024


class _Link:
    """One relayed connection: two pumps, one per direction, and its own gate (a freeze)."""

    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream = upstream
        self.tasks: list[asyncio.Task[None]] = []
        self.flowing = asyncio.Event()
        self.flowing.set()
        #: Loop time of the last byte the client sent: a watch sends its request and then
        #: only receives, while pooled request connections keep sending.
        self.client_sent_at = asyncio.get_running_loop().time()

    def abort(self) -> None:
        """Drop both sockets at once (RST, no TLS close_notify) and stop the pumps."""
        for writer in (self.client, self.upstream):
            writer.transport.abort()
        for task in self.tasks:
            task.cancel()


@dataclass
class RelayStats:
    """What the relay did."""

    connections: int = 0
    refused: int = 0
    cuts: int = 0
    connections_cut: int = 0
    stalls: int = 0
    stalled_seconds: float = 0.0
    freezes: int = 0
    connections_frozen: int = 0


class TcpRelay:
    """A TCP relay from ``127.0.0.1:<port>`` to ``target_host:target_port`` (module docstring).

    Use on one asyncio loop: ``await start()``, then ``cut()`` / ``stall()`` from the same
    loop, ``await close()`` at the end.
    """

    def __init__(self, target_host: str, target_port: int, *, listen_port: int = 0) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self._listen_port = listen_port
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._stall_until = 0.0
        self._resume: asyncio.TimerHandle | None = None
        self._thaw: list[asyncio.TimerHandle] = []
        self.stats = RelayStats()

    @property
    def port(self) -> int:
        """The local port clients connect to."""
        if self._server is None:
            raise RuntimeError("the relay is not started")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def url(self) -> str:
        """``https://127.0.0.1:<port>`` for a kubeconfig."""
        return f"https://127.0.0.1:{self.port}"

    @property
    def open_connections(self) -> int:
        """Connections being relayed now."""
        return len(self._links)

    @property
    def stalled(self) -> bool:
        """True while bytes are held back."""
        return not self._flowing.is_set()

    async def start(self) -> TcpRelay:
        """Listen on loopback."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self._listen_port)
        return self

    async def close(self) -> None:
        """Stop listening and drop every connection."""
        if self._server is not None:
            self._server.close()
        self.cut(count=False)
        self._flowing.set()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), timeout=5)

    def cut(self, *, count: bool = True) -> int:
        """Abort every open connection (new ones are accepted at once); how many were cut."""
        links = list(self._links)
        for link in links:
            link.abort()
        self._links.clear()
        if count:
            self.stats.cuts += 1
            self.stats.connections_cut += len(links)
        return len(links)

    def stall(self, seconds: float) -> None:
        """Hold every byte, both ways and on new connections too, for ``seconds``; nothing is
        closed, so clients only notice through their own timeouts."""
        loop = asyncio.get_running_loop()
        self.stats.stalls += 1
        self.stats.stalled_seconds += seconds
        self._stall_until = max(self._stall_until, loop.time() + seconds)
        self._flowing.clear()
        if self._resume is not None:
            self._resume.cancel()
        self._resume = loop.call_at(self._stall_until, self._flowing.set)

    def freeze(self, seconds: float, *, client_idle: float = 0.0) -> int:
        """Hold every byte of the connections open now for ``seconds``, while new connections
        flow: a half-open connection, as a NAT or proxy that silently dropped its state leaves
        it. With ``client_idle``, only connections whose client has sent nothing for that many
        seconds are frozen: the watches, while connections busy with requests keep working.
        Returns how many were frozen."""
        loop = asyncio.get_running_loop()
        links = [link for link in self._links if loop.time() - link.client_sent_at >= client_idle]
        for link in links:
            link.flowing.clear()
            self._thaw.append(loop.call_later(seconds, link.flowing.set))
        self.stats.freezes += 1
        self.stats.connections_frozen += len(links)
        return len(links)

    def resume(self) -> None:
        """End a stall and every freeze now."""
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        for handle in self._thaw:
            handle.cancel()
        self._thaw.clear()
        for link in self._links:
            link.flowing.set()
        self._flowing.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            # The API server is down (restarting): the client sees its connection reset, as
            # it would without a relay.
            self.stats.refused += 1
            writer.transport.abort()
            return
        link = _Link(writer, up_writer)
        self._links.add(link)
        link.tasks = [
            asyncio.create_task(self._pump(reader, up_writer, link, from_client=True)),
            asyncio.create_task(self._pump(up_reader, writer, link, from_client=False)),
        ]
        # The connection lives as long as this callback: cancelled pumps (a cut) end it too.
        await asyncio.gather(*link.tasks, return_exceptions=True)

    async def _pump(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        link: _Link,
        *,
        from_client: bool,
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await src.read(_CHUNK)
                if not data:
                    break
                if from_client:
                    link.client_sent_at = loop.time()
                # Held here during a stall or freeze: read, not forwarded, the socket open.
                await self._flowing.wait()
                await link.flowing.wait()
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            # Either side ending ends the connection (HTTP over TLS needs no half-close).
            if link in self._links:
                self._links.discard(link)
                link.abort()


@dataclass(frozen=True)
class AdmissionRecord:
    """One admission request the webhook answered."""

    at: float
    subresource: str
    namespace: str
    name: str
    node: str
    allowed: bool
    code: int = 0
    dry_run: bool = False


@dataclass
class _Counts:
    binds_allowed: int = 0
    binds_denied: int = 0
    evictions: int = 0
    denied_by_code: dict[int, int] = field(default_factory=dict)


class BindingWebhook:
    """Denies ``deny_rate`` of binds in ``namespace`` (module docstring).

    A denial answers with a status code drawn from ``deny_codes`` (the API server passes it
    to the client): 500 is a temporary failure a scheduler retries, 403 a final one. The
    random stream is seeded (``seed``), so the same seed gives the same sequence of
    decisions for the same sequence of requests. ``on_admit`` is called for every admitted
    request (the chaos harness uses it to learn of evictions the moment they happen).
    """

    def __init__(
        self,
        namespace: str,
        workdir: Path,
        *,
        deny_rate: float = 0.05,
        seed: int = 0,
        deny_codes: tuple[int, ...] = (500, 403),
        name: str = "kai-chaos-bind-failures",
        on_admit: Callable[[AdmissionRecord], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.namespace = namespace
        self.workdir = workdir
        self.deny_rate = deny_rate
        self.deny_codes = deny_codes
        self.name = name
        self.on_admit = on_admit
        self._clock = clock
        self._rng = random.Random(seed)
        self.records: list[AdmissionRecord] = []
        self.counts = _Counts()
        self._runner: web.AppRunner | None = None
        self._port = 0
        self._ca_pem = b""

    @property
    def url(self) -> str:
        """Where the API server sends AdmissionReviews."""
        return f"https://127.0.0.1:{self._port}/validate"

    async def start(self) -> BindingWebhook:
        """Make a certificate for 127.0.0.1 and serve HTTPS on a free loopback port."""
        pki = await asyncio.to_thread(make_pki, self.workdir / "webhook-pki", service_ip="10.0.0.1")
        self._ca_pem = pki.ca_cert.read_bytes()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(pki.serving_cert), str(pki.serving_key))
        app = web.Application()
        app.router.add_post("/validate", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        # Bind the socket ourselves: that is how we learn the free port it got.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self._port = int(sock.getsockname()[1])
        await web.SockSite(self._runner, sock, ssl_context=context).start()
        return self

    async def close(self) -> None:
        """Stop serving (delete the configuration first, or the API server fails binds)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def configuration(self) -> dict[str, Any]:
        """The ValidatingWebhookConfiguration that sends this namespace's binds and
        evictions here."""
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": self.name},
            "webhooks": [
                {
                    "name": "binds.chaos.kai.test",
                    "clientConfig": {
                        "url": self.url,
                        "caBundle": base64.b64encode(self._ca_pem).decode(),
                    },
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods/binding", "pods/eviction"],
                            "scope": "Namespaced",
                        }
                    ],
                    # Only the chaos namespace: other tests sharing the control plane bind as usual.
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": self.namespace}
                    },
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 5,
                }
            ],
        }

    def _decide(self, subresource: str, name: str, dry_run: bool) -> tuple[bool, int, str]:
        if subresource != "binding" or dry_run:
            return True, 0, ""
        if name.startswith(WEBHOOK_PROBE_PREFIX):
            return False, 403, "chaos webhook probe: the webhook is live"
        if self._rng.random() < self.deny_rate:
            code = self._rng.choice(self.deny_codes)
            return False, code, f"chaos: bind of {name} denied on purpose (code {code})"
        return True, 0, ""

    async def _handle(self, request: web.Request) -> web.Response:
        review = await request.json()
        req = review.get("request") or {}
        subresource = str(req.get("subResource") or "")
        name = str(req.get("name") or "")
        dry_run = bool(req.get("dryRun"))
        obj = req.get("object") or {}
        node = str((obj.get("target") or {}).get("name") or "")
        allowed, code, message = self._decide(subresource, name, dry_run)
        record = AdmissionRecord(
            self._clock(), subresource, str(req.get("namespace") or ""), name, node, allowed,
            code, dry_run,
        )  # fmt: skip
        self.records.append(record)
        if not name.startswith(WEBHOOK_PROBE_PREFIX) and not dry_run:
            if subresource == "binding" and allowed:
                self.counts.binds_allowed += 1
            elif subresource == "binding":
                self.counts.binds_denied += 1
                self.counts.denied_by_code[code] = self.counts.denied_by_code.get(code, 0) + 1
            elif subresource == "eviction":
                self.counts.evictions += 1
            if allowed and self.on_admit is not None:
                self.on_admit(record)
        response: dict[str, Any] = {"uid": req.get("uid", ""), "allowed": allowed}
        if not allowed:
            response["status"] = {"code": code, "message": message}
        body = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": response,
        }
        return web.Response(text=json.dumps(body), content_type="application/json")
