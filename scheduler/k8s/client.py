"""Connecting to the API server, and raw JSON requests with typed errors.

:func:`make_api_client` builds a kubernetes-asyncio ``ApiClient`` from the CLI flags
(``--kube-config``, ``--kube-api-server``, ``--kube-api-secure``): a kubeconfig file when one is
given and exists, else the pod's in-cluster service account. The server flag overrides the
kubeconfig's server; ``--kube-api-secure=false`` turns TLS verification off.

:func:`request_json` and :func:`open_stream` send raw requests and speak plain JSON dicts, so the
cache never pays for model objects; every failure comes out as a :mod:`scheduler.k8s.errors`
type.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog
import yaml
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.config import ConfigException, load_incluster_config, load_kube_config
from yarl import URL

from scheduler.k8s.errors import ClientConfigError, KubeError, error_for_status, translate
from scheduler.k8s.kubeconfig import check_kubeconfig

__all__ = [
    "JSON_CONTENT",
    "JSON_PATCH",
    "MERGE_PATCH",
    "STRATEGIC_MERGE_PATCH",
    "ClientSettings",
    "make_api_client",
    "open_stream",
    "request_json",
]

log = structlog.get_logger("scheduler.k8s.client")

JSON_CONTENT = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"

#: Seconds allowed for one ordinary (non-watch) request.
DEFAULT_TIMEOUT = 30.0


@dataclass(frozen=True)
class ClientSettings:
    """How to reach the API server (the ``--kube-*`` flags)."""

    #: Path of a kubeconfig file (``--kube-config``); None means the in-cluster service account.
    kube_config: str | None = None
    #: API server URL overriding the kubeconfig's server (``--kube-api-server``).
    api_server: str | None = None
    #: Verify the server's TLS certificate (``--kube-api-secure``); None keeps the config's choice.
    api_secure: bool | None = None


def _in_cluster_available() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


async def _load_kubeconfig(
    path: str, cfg: Configuration, *, flag: str | None = None, server_given: bool = False
) -> None:
    # Our own check first: the loader's errors for a broken file are tracebacks and
    # "'NoneType' object does not support item assignment".
    check_kubeconfig(path, flag=flag, server_given=server_given)
    try:
        await load_kube_config(config_file=path, client_configuration=cfg, persist_config=False)
    except (ConfigException, OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as e:
        raise ClientConfigError(
            f"--kube-config={path}: cannot use this kubeconfig ({e}); "
            "point --kube-config at a valid kubeconfig or leave it out to use the "
            "in-cluster service account"
        ) from e


def _load_in_cluster(cfg: Configuration, why: str) -> None:
    try:
        load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError) as e:
        raise ClientConfigError(
            f"{why}, and the in-cluster service account is not usable ({e}); "
            "run inside a pod with a service account or pass --kube-config=PATH"
        ) from e


async def make_api_client(settings: ClientSettings) -> ApiClient:
    """An ``ApiClient`` configured from ``settings``; the caller closes it (``await c.close()``).

    Order: the ``--kube-config`` file if it exists; else the in-cluster service account; else
    ``$KUBECONFIG`` (handy outside a cluster). A ``--kube-config`` path that does not exist
    inside the scheduler's pod (e.g. ``/etc/kubernetes/admin.conf`` from a host install)
    falls back to the service account with a warning, so that deployment works as is.
    Raises :class:`ClientConfigError` saying which flag to fix.
    """
    cfg = Configuration()
    server_given = bool(settings.api_server)
    if settings.kube_config and os.path.isfile(settings.kube_config):
        await _load_kubeconfig(settings.kube_config, cfg, server_given=server_given)
        source = settings.kube_config
    elif settings.kube_config and _in_cluster_available():
        log.warning(
            "kubeconfig_missing_using_service_account",
            kube_config=settings.kube_config,
        )
        _load_in_cluster(cfg, f"--kube-config={settings.kube_config} does not exist")
        source = "in-cluster"
    elif settings.kube_config:
        raise ClientConfigError(
            f"--kube-config={settings.kube_config}: file does not exist and this process is not "
            "in a cluster; give the path of a readable kubeconfig"
        )
    elif _in_cluster_available() or not os.environ.get("KUBECONFIG"):
        _load_in_cluster(cfg, "no --kube-config given")
        source = "in-cluster"
    else:
        path = os.environ["KUBECONFIG"].split(os.pathsep)[0]
        await _load_kubeconfig(path, cfg, flag=f"$KUBECONFIG ({path})", server_given=server_given)
        source = path
    if settings.api_server:
        server = settings.api_server.rstrip("/")
        if not server.startswith(("https://", "http://")):
            raise ClientConfigError(
                f"--kube-api-server={settings.api_server}: give a URL such as "
                "https://kubernetes.default.svc"
            )
        cfg.host = server
    if settings.api_secure is not None:
        cfg.verify_ssl = settings.api_secure
    api = ApiClient(configuration=cfg)
    proxy = _settle_proxy(api, cfg)
    log.info("api_client", source=source, server=cfg.host, verify_tls=cfg.verify_ssl, proxy=proxy)
    return api


def _settle_proxy(api: ApiClient, cfg: Configuration) -> str | None:
    """Read the proxy environment once, not on every request; the proxy in use (or None).

    kubernetes-asyncio opens its aiohttp session with ``trust_env=True``, so every request
    looks up ``$HTTPS_PROXY``/``$NO_PROXY`` and reads ``~/.netrc``, each in a worker thread:
    two thread hops and a file read per bind, measured as the largest cost of a bind burst
    (py-spy, 10,000 binds). The API server's address does not change, so the answer does
    not either: it is looked up here, as client-go does through ``ProxyFromEnvironment``,
    and the session stops asking. A proxy set in the kubeconfig wins over the environment.
    (``.netrc`` credentials never apply: the scheduler authenticates with its token or
    client certificate.)
    """
    rest = api.rest_client
    if not rest.proxy and cfg.host:
        with contextlib.suppress(LookupError, ValueError):
            url, auth = get_env_proxy_for_url(URL(cfg.host))
            rest.proxy = str(url)
            if auth is not None:
                rest.proxy_headers = {"Proxy-Authorization": auth.encode()}
    # aiohttp has no public setter; the attribute is what ``ClientSession.trust_env`` reads
    # (tests/unit/test_k8s_client.py fails if a new aiohttp moves it).
    rest.pool_manager._trust_env = False
    return str(rest.proxy) if rest.proxy else None


def _query(params: Mapping[str, Any] | Sequence[tuple[str, Any]] | None) -> list[tuple[str, str]]:
    items = params.items() if isinstance(params, Mapping) else (params or ())
    out = []
    for k, v in items:
        if v is None:
            continue
        out.append((k, ("true" if v else "false") if isinstance(v, bool) else str(v)))
    return out


async def _send(
    api: ApiClient,
    method: str,
    path: str,
    *,
    query: Mapping[str, Any] | Sequence[tuple[str, Any]] | None,
    body: Any,
    content_type: str,
    timeout: float | aiohttp.ClientTimeout | None,
) -> aiohttp.ClientResponse:
    headers = {"Accept": JSON_CONTENT}
    if body is not None or method in ("POST", "PUT", "PATCH", "DELETE"):
        headers["Content-Type"] = content_type
    response: aiohttp.ClientResponse = await api.call_api(
        path,
        method,
        query_params=_query(query),
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
        _preload_content=False,
        _request_timeout=timeout,
    )
    return response


async def request_json(
    api: ApiClient,
    method: str,
    path: str,
    *,
    query: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None,
    body: Any = None,
    content_type: str = JSON_CONTENT,
    timeout: float | None = DEFAULT_TIMEOUT,
) -> Any:
    """Send one request and return the decoded JSON body (None for an empty body).

    ``path`` comes from :class:`scheduler.k8s.resources.ResourceKind`; ``body`` is JSON data
    (dicts/lists), sent with ``content_type`` (use :data:`MERGE_PATCH` etc. for PATCH).
    Raises a :class:`scheduler.k8s.errors.KubeError` subclass on any failure.
    """
    what = f"{method} {path}"
    try:
        response = await _send(
            api, method, path, query=query, body=body, content_type=content_type, timeout=timeout
        )
        async with response:
            raw = await response.read()
            if not 200 <= response.status <= 299:
                raise error_for_status(response.status, raw, headers=response.headers, what=what)
    except KubeError:
        raise
    except Exception as e:
        raise translate(e, what) from e
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError as e:
        raise translate(e, what) from e


async def open_stream(
    api: ApiClient,
    path: str,
    *,
    query: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None,
    timeout: aiohttp.ClientTimeout | None = None,
) -> aiohttp.ClientResponse:
    """Open a streaming GET (a watch); the caller reads lines and closes the response.

    A non-2xx answer is raised as a :class:`KubeError` (and the response closed).
    """
    what = f"GET {path}"
    try:
        response = await _send(
            api, "GET", path, query=query, body=None, content_type=JSON_CONTENT, timeout=timeout
        )
        if not 200 <= response.status <= 299:
            async with response:
                raw = await response.read()
            raise error_for_status(response.status, raw, headers=response.headers, what=what)
    except KubeError:
        raise
    except Exception as e:
        raise translate(e, what) from e
    return response
