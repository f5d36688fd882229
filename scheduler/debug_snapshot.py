"""``GET /debug/snapshot`` on the metrics port: the last cycle's snapshot, for admins only.

Off unless the config sets ``debugSnapshot: true`` (then the route exists; otherwise it is a
404 like any unknown path). Each request must carry ``Authorization: Bearer <token>``; the
token is checked by the API server (TokenReview) and its user must be allowed ``get`` on the
non-resource URL ``/debug/snapshot`` (SubjectAccessReview), e.g. by a ClusterRole with
``nonResourceURLs: ["/debug/snapshot"], verbs: [get]``, or be a cluster admin:

- 401: no bearer token, or the API server does not authenticate it;
- 403: the user may not ``get /debug/snapshot``;
- 503: no cycle has run yet, or the API server could not be asked;
- 200: the snapshot file (:mod:`scheduler.snapshotfile`) of the last cycle, JSON, with the
  scheduler's config; ``kai-scheduler simulate --snapshot FILE`` replays it.

The snapshot is the state the cycle decided on, before it bound anything: replaying it
offline reproduces that decision.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import structlog
from aiohttp import web

from scheduler.cluster.snapshot import Snapshot
from scheduler.k8s.errors import KubeError
from scheduler.k8s.reviews import may_access, review_token
from scheduler.snapshotfile import snapshot_document

__all__ = ["PATH", "SnapshotEndpoint"]

log = structlog.get_logger("scheduler.debug")

PATH = "/debug/snapshot"


class SnapshotEndpoint:
    """The handler; ``latest`` gives (snapshot, cycle number) of the last cycle or None,
    ``api`` the API client once it exists."""

    def __init__(
        self,
        latest: Callable[[], tuple[Snapshot, int] | None],
        api: Callable[[], Any | None],
        config: dict[str, Any],
    ) -> None:
        self._latest = latest
        self._api = api
        self._config = config

    @staticmethod
    def _denied(status: int, reason: str) -> web.Response:
        headers = {"WWW-Authenticate": 'Bearer realm="kai-scheduler"'} if status == 401 else None
        return web.Response(status=status, text=reason + "\n", headers=headers)

    async def handle(self, request: web.Request) -> web.Response:
        """Authenticate, authorise, then answer with the last snapshot."""
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return self._denied(401, "send Authorization: Bearer <token> of a cluster admin")
        api = self._api()
        if api is None:
            return self._denied(503, "not connected to the API server yet")
        try:
            user, why = await review_token(api, token)
            if user is None:
                log.warning("debug_snapshot_denied", status=401, reason=why)
                return self._denied(401, f"token not authenticated: {why}")
            allowed, reason = await may_access(api, user, PATH, "get")
        except KubeError as e:
            log.warning("debug_snapshot_review_failed", error=e.message)
            return self._denied(503, f"could not review the token: {e.message}")
        if not allowed:
            log.warning("debug_snapshot_denied", status=403, user=user.username, reason=reason)
            return self._denied(
                403, f"user {user.username!r} may not get {PATH} (grant nonResourceURLs "
                f"[{PATH}] verb get){': ' + reason if reason else ''}",
            )  # fmt: skip
        latest = self._latest()
        if latest is None:
            return self._denied(503, "no cycle has run yet; try again in a moment")
        snapshot, cycle = latest
        source = {"by": PATH, "cycle": cycle}
        # A big cluster's snapshot takes a while to encode: not on the event loop (the snapshot
        # is immutable, so a thread may read it).
        body = await asyncio.to_thread(_encode, snapshot, self._config, source)
        log.info("debug_snapshot_served", user=user.username, cycle=cycle, bytes=len(body))
        return web.Response(body=body.encode(), content_type="application/json")


def _encode(snapshot: Snapshot, config: dict[str, Any], source: dict[str, Any]) -> str:
    return json.dumps(snapshot_document(snapshot, config, source), separators=(",", ":"))
