"""A small asyncio client for the Kubernetes API, for the chaos harness only.

The invariant checker must not share code with the scheduler it judges, so this talks to the
API server with plain aiohttp and JSON dicts (no ``scheduler.`` imports, no kubernetes
client models): list, watch, create, delete, patch.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp

__all__ = ["ApiError", "KubeApi", "WatchExpired"]


class ApiError(Exception):
    """A request answered with a non-2xx status (``status`` 0: no answer at all)."""

    def __init__(self, status: int, what: str, body: str) -> None:
        super().__init__(f"{what}: HTTP {status}: {body[:300]}")
        self.status = status
        self.body = body


class WatchExpired(ApiError):
    """The watch's resourceVersion is too old (410 Gone): list again."""


class KubeApi:
    """Admin access to one API server: ``server`` URL, bearer ``token``, CA ``ca_file``."""

    def __init__(self, server: str, token: str, ca_file: Path, *, timeout: float = 20.0) -> None:
        self.server = server.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self._ssl = ssl.create_default_context(cafile=str(ca_file))
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> KubeApi:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # No connection reuse across API server restarts matters here: aiohttp drops dead
            # pooled connections itself, and every request has its own timeout.
            self._session = aiohttp.ClientSession(
                headers=self._headers, connector=aiohttp.TCPConnector(ssl=self._ssl, limit=32)
            )
        return self._session

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        """One request; the decoded JSON answer. Raises :class:`ApiError` (status 0 when the
        server could not be reached)."""
        what = f"{method} {path}"
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else None
        try:
            async with self._client().request(
                method,
                self.server + path,
                data=data,
                params=dict(params or {}),
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self._timeout),
            ) as resp:
                text = await resp.text()
                if resp.status == 410:
                    raise WatchExpired(resp.status, what, text)
                if not 200 <= resp.status < 300:
                    raise ApiError(resp.status, what, text)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise ApiError(0, what, repr(e)) from e
        return json.loads(text) if text else None

    async def list(self, path: str) -> tuple[list[dict[str, Any]], str]:
        """Every object at collection ``path`` (paged) and the list's resourceVersion."""
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            params = {"limit": "500"}
            if token:
                params["continue"] = token
            page = await self.request("GET", path, params=params)
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            token = meta.get("continue") or ""
            if not token:
                return items, str(meta.get("resourceVersion") or "")

    async def watch(
        self, path: str, resource_version: str, *, timeout_seconds: int = 60
    ) -> AsyncIterator[dict[str, Any]]:
        """Watch events (``{"type", "object"}``) from ``resource_version`` until the server
        ends the stream. BOOKMARKs are passed through so the caller can move its version on;
        an ERROR event with code 410 raises :class:`WatchExpired`."""
        what = f"watch {path}"
        params = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        timeout = aiohttp.ClientTimeout(total=None, connect=10, sock_read=timeout_seconds + 30)
        try:
            async with self._client().get(
                self.server + path, params=params, timeout=timeout
            ) as resp:
                if resp.status == 410:
                    raise WatchExpired(410, what, await resp.text())
                if resp.status != 200:
                    raise ApiError(resp.status, what, await resp.text())
                async for raw in resp.content:
                    if not raw.strip():
                        continue
                    event = json.loads(raw)
                    if event.get("type") == "ERROR":
                        obj = event.get("object") or {}
                        code = int(obj.get("code") or 500)
                        if code == 410:
                            raise WatchExpired(code, what, json.dumps(obj))
                        raise ApiError(code, what, json.dumps(obj))
                    yield event
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
            raise ApiError(0, what, repr(e)) from e
