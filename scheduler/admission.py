"""The admission webhook for GPU-sharing pods: reject bad share requests, point the env at
the pod's device ConfigMap (see :mod:`scheduler.cluster.gpusharing`, docs/gpu-sharing.md).

Why an aiohttp TLS server inside the scheduler process rather than kopf's admission support:
kopf's webhook server runs inside a kopf operator (its own event loop, handlers registered at
import time, its own cert management), and the scheduler is not a kopf operator; the pod grouper
is, but it is an optional process, and the webhook must be up wherever sharing is used. The
scheduler already serves aiohttp (probes, metrics), every replica serves the webhook (leader or
not: admission must not wait for a failover), and the review itself is a pure function
(:func:`review`) tested without a server.

What :func:`review` does for a pod (``CREATE``) whose ``spec.schedulerName`` is served and that
carries ``gpu-fraction`` or ``gpu-memory``:

- rejects it when the share request is invalid (the same rules and messages the cache reports
  as Events: both a share annotation and ``nvidia.com/gpu``, a fraction not in (0, 1), a
  memory that is not a positive amount, ``gpu-fraction-num-devices`` that is not a whole number),
  naming the annotation and the fix;
- otherwise adds, to every container and init container, ``NVIDIA_VISIBLE_DEVICES`` and
  ``GPU_PORTION`` env vars sourced from ConfigMap ``<pod>-gpu-share`` (not optional: the
  kubelet waits to start the container until the scheduler filled it at bind).

The ConfigMap's name is also written as the pod's label :data:`CONFIG_MAP_LABEL`, which the
scheduler reads at bind: a pod made from ``generateName`` (every controller's pods) has no
name yet when mutating admission sees it, so the webhook makes one up from the prefix and a
random suffix rather than guess the name the API server will generate.
"""

from __future__ import annotations

import base64
import json
import secrets
import ssl
from collections.abc import Collection, Mapping
from typing import Any

import structlog
from aiohttp import web

from scheduler.cluster.gpusharing import (
    CONFIG_MAP_LABEL,
    GPU_PORTION_KEY,
    VISIBLE_DEVICES_KEY,
    config_map_name,
)
from scheduler.cluster.podspec import (
    GPU_FRACTION_ANNOTATION,
    GPU_MEMORY_ANNOTATION,
    PodSpecError,
    pod_from_k8s,
)

__all__ = ["MUTATE_PATH", "AdmissionServer", "review"]

log = structlog.get_logger("scheduler.admission")

#: The URL path the MutatingWebhookConfiguration names.
MUTATE_PATH = "/mutate-pods"
_ENV_NAMES = (VISIBLE_DEVICES_KEY, GPU_PORTION_KEY)


def _env_patch(pod: Mapping[str, Any], config_map: str) -> list[dict[str, Any]]:
    """JSON-patch operations adding the env vars to every container (existing ones of the
    same name are left alone: a user who set them knows better)."""
    ops: list[dict[str, Any]] = []
    spec = pod.get("spec") or {}
    for field in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(field) or []):
            env = c.get("env")
            have = {e.get("name") for e in env or []}
            add = [
                {
                    "name": key,
                    "valueFrom": {"configMapKeyRef": {"name": config_map, "key": key}},
                }
                for key in _ENV_NAMES
                if key not in have
            ]
            if not add:
                continue
            if env is None:
                ops.append({"op": "add", "path": f"/spec/{field}/{i}/env", "value": add})
            else:
                ops += [{"op": "add", "path": f"/spec/{field}/{i}/env/-", "value": e} for e in add]
    return ops


def _escape(key: str) -> str:
    """A map key as a JSON-pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def review(request: Mapping[str, Any], scheduler_names: Collection[str]) -> dict[str, Any]:
    """The AdmissionReview ``response`` for one ``request`` (see the module docstring)."""
    uid = request.get("uid", "")
    allowed: dict[str, Any] = {"uid": uid, "allowed": True}
    pod = request.get("object") or {}
    if request.get("operation") != "CREATE" or (request.get("kind") or {}).get("kind") != "Pod":
        return allowed
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    spec = pod.get("spec") or {}
    if spec.get("schedulerName") not in scheduler_names:
        return allowed
    if GPU_FRACTION_ANNOTATION not in annotations and GPU_MEMORY_ANNOTATION not in annotations:
        return allowed
    try:
        pod_from_k8s(pod, scheduler_name=tuple(scheduler_names), default_queue="", strict=True)
    except PodSpecError as e:
        if "annotations[gpu" in e.field:
            message = f"{e.field}: {e.message}"
            log.info("admission_rejected", pod=meta.get("name"), field=e.field, error=e.message)
            return {**allowed, "allowed": False, "status": {"code": 400, "message": message}}
        # Anything else is the cache's to report as an Event; admission stays out of it.
    name = meta.get("name") or f"{meta.get('generateName') or 'pod-'}{secrets.token_hex(3)}"
    config_map = config_map_name(name)
    ops = _env_patch(pod, config_map)
    if not ops:
        return allowed
    labels = meta.get("labels")
    if labels is None:
        ops.insert(0, {"op": "add", "path": "/metadata/labels", "value": {}})
    ops.append(
        {"op": "add", "path": f"/metadata/labels/{_escape(CONFIG_MAP_LABEL)}", "value": config_map}
    )
    patch = base64.b64encode(json.dumps(ops).encode()).decode()
    return {**allowed, "patchType": "JSONPatch", "patch": patch}


class AdmissionServer:
    """Serves :func:`review` at :data:`MUTATE_PATH` over TLS."""

    def __init__(
        self, address: str, cert_file: str, key_file: str, scheduler_names: Collection[str]
    ) -> None:
        host, _, port = address.rpartition(":")
        self.host = host or "0.0.0.0"
        self.port = int(port)
        self.cert_file = cert_file
        self.key_file = key_file
        self.scheduler_names = frozenset(scheduler_names)
        self._runner: web.AppRunner | None = None

    async def _mutate(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            req = body["request"]
        except (ValueError, KeyError, TypeError):
            return web.Response(status=400, text="expected an AdmissionReview with a request")
        response = review(req, self.scheduler_names)
        return web.json_response(
            {
                "apiVersion": body.get("apiVersion", "admission.k8s.io/v1"),
                "kind": "AdmissionReview",
                "response": response,
            }
        )

    async def start(self) -> None:
        """Bind the port and serve (raises OSError if the port or the files are unusable)."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert_file, self.key_file)
        app = web.Application()
        app.router.add_post(MUTATE_PATH, self._mutate)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=context)
        await site.start()
        log.info("admission_webhook_serving", address=f"{self.host}:{self.port}")

    async def stop(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
