"""The API client reads the proxy environment once, when it is built, not on every request.

kubernetes-asyncio's session asks the environment (proxies, ``~/.netrc``) in a worker thread on
every request; :func:`scheduler.k8s.client.make_api_client` settles the answer up front.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp import web

from scheduler.k8s.client import ClientSettings, make_api_client, request_json

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "SERVER", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: abc}
contexts:
- name: ctx
  context: {cluster: c, user: u}
current-context: ctx
"""


def _kubeconfig(tmp_path: Path, server: str) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG.replace("SERVER", server))
    return str(path)


def _clear_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)


def test_the_session_stops_asking_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clear_proxy_env(monkeypatch)

    async def scenario() -> None:
        api = await make_api_client(ClientSettings(_kubeconfig(tmp_path, "https://10.9.8.7:6443")))
        try:
            assert api.rest_client.pool_manager.trust_env is False
            assert api.rest_client.proxy is None
        finally:
            await api.close()

    asyncio.run(scenario())


def test_an_environment_proxy_is_kept_and_no_proxy_is_honoured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clear_proxy_env(monkeypatch)
    monkeypatch.setenv("HTTPS_PROXY", "http://user:secret@proxy.example:3128")

    async def proxied(server: str) -> tuple[str | None, dict[str, str] | None]:
        api = await make_api_client(ClientSettings(_kubeconfig(tmp_path, server)))
        try:
            return api.rest_client.proxy, api.rest_client.proxy_headers
        finally:
            await api.close()

    proxy, headers = asyncio.run(proxied("https://10.9.8.7:6443"))
    assert proxy is not None and "proxy.example:3128" in proxy
    assert headers is not None and headers["Proxy-Authorization"].startswith("Basic ")
    monkeypatch.setenv("NO_PROXY", "10.9.8.7")
    assert asyncio.run(proxied("https://10.9.8.7:6443"))[0] is None


def test_netrc_credentials_are_not_sent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``.netrc`` entry for the server's host would otherwise be read on every request and
    sent as Basic auth next to the bearer token."""
    _clear_proxy_env(monkeypatch)
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password leaked\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    seen: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.json_response({"ok": True})

    async def scenario() -> None:
        app = web.Application()
        app.router.add_get("/api", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        api = await make_api_client(
            ClientSettings(_kubeconfig(tmp_path, f"http://127.0.0.1:{port}"))
        )
        try:
            assert await request_json(api, "GET", "/api") == {"ok": True}
        finally:
            await api.close()
            await runner.cleanup()

    asyncio.run(scenario())
    assert seen == ["Bearer abc"]
