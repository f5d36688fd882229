"""Asking the API server who a bearer token belongs to and what that user may do.

:func:`review_token` sends a ``TokenReview`` (authentication.k8s.io/v1) and
:func:`may_access` a ``SubjectAccessReview`` (authorization.k8s.io/v1) for a non-resource URL,
so an endpoint of ours (``GET /debug/snapshot``) is guarded by the cluster's own users and
RBAC, the way kube-scheduler guards its debug handlers. The scheduler's ClusterRole grants
``create`` on both review kinds for this (and nothing else about them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler.k8s.client import request_json

__all__ = ["ReviewedUser", "may_access", "review_token"]

_TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
_ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
#: Seconds each review may take: the caller is waiting on an HTTP request.
_TIMEOUT = 10.0


@dataclass(frozen=True)
class ReviewedUser:
    """The user an authenticated token belongs to (TokenReview ``status.user``)."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


async def review_token(api: Any, token: str) -> tuple[ReviewedUser | None, str]:
    """(user, "") when the API server authenticates ``token``; (None, why) when it does not.
    API failures raise :class:`scheduler.k8s.errors.KubeError`."""
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": token},
    }
    answer = await request_json(api, "POST", _TOKEN_REVIEWS, body=body, timeout=_TIMEOUT)
    status = (answer or {}).get("status") or {}
    if not status.get("authenticated"):
        return None, str(status.get("error") or "token not authenticated")
    user = status.get("user") or {}
    extra = {str(k): tuple(str(x) for x in v or ()) for k, v in (user.get("extra") or {}).items()}
    return (
        ReviewedUser(
            username=str(user.get("username") or ""),
            uid=str(user.get("uid") or ""),
            groups=tuple(str(g) for g in user.get("groups") or ()),
            extra=extra,
        ),
        "",
    )


async def may_access(api: Any, user: ReviewedUser, path: str, verb: str) -> tuple[bool, str]:
    """Whether ``user`` may ``verb`` the non-resource URL ``path``: (allowed, reason)."""
    spec: dict[str, Any] = {
        "user": user.username,
        "groups": list(user.groups),
        "nonResourceAttributes": {"path": path, "verb": verb},
    }
    if user.uid:
        spec["uid"] = user.uid
    if user.extra:
        spec["extra"] = {k: list(v) for k, v in user.extra.items()}
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": spec,
    }
    answer = await request_json(api, "POST", _ACCESS_REVIEWS, body=body, timeout=_TIMEOUT)
    status = (answer or {}).get("status") or {}
    return bool(status.get("allowed")), str(status.get("reason") or "")
