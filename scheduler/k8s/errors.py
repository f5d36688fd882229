"""Errors from talking to the API server, as a small tree of types.

Whether to retry is a type, not a flag::

    KubeError                      anything that went wrong talking to Kubernetes
    ├── ClientConfigError          no usable kubeconfig / in-cluster credentials (fix the flags)
    ├── TemporaryError             retry after a delay: 429, 5xx, connection errors, timeouts
    └── PermanentError             4xx: retrying the same request will fail the same way
        ├── Unauthorized           401
        ├── Forbidden              403 (RBAC: grant the verb to the scheduler's ServiceAccount)
        ├── NotFound               404 (object gone, or a CRD not installed)
        ├── Conflict               409 (already exists, or a stale resourceVersion)
        ├── Gone                   410 (watch/list resourceVersion too old: relist)
        └── Invalid                422 (the API rejected the object)

:func:`translate` maps any exception from kubernetes-asyncio / aiohttp to one of these, with
the original chained as ``__cause__``; callers write ``raise translate(e) from e``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

__all__ = [
    "ClientConfigError",
    "Conflict",
    "Forbidden",
    "Gone",
    "Invalid",
    "KubeError",
    "NotFound",
    "PermanentError",
    "TemporaryError",
    "Unauthorized",
    "error_for_status",
    "translate",
]


class KubeError(Exception):
    """Base of every error raised by :mod:`scheduler.k8s`.

    ``status`` is the HTTP status (0 when the request never got an answer), ``reason`` the
    API's machine-readable reason (``NotFound``, ``AlreadyExists`` …) and ``message`` the
    API's human message when it sent one.
    """

    def __init__(
        self, message: str, *, status: int = 0, reason: str = "", causes: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason
        #: The messages of the Status's ``details.causes`` (e.g. which PodDisruptionBudget
        #: refused an eviction), when the API sent any.
        self.causes = causes


class ClientConfigError(KubeError):
    """No usable connection settings (kubeconfig, in-cluster service account, flags)."""


class TemporaryError(KubeError):
    """Worth retrying after a delay. ``retry_after`` is the server's hint in seconds, if any."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 0,
        reason: str = "",
        retry_after: float | None = None,
        causes: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message, status=status, reason=reason, causes=causes)
        self.retry_after = retry_after


class PermanentError(KubeError):
    """The API refused the request; repeating it unchanged fails the same way."""


class Unauthorized(PermanentError):
    """401: the credentials are not accepted."""


class Forbidden(PermanentError):
    """403: RBAC does not allow this verb on this resource for the scheduler's identity."""


class NotFound(PermanentError):
    """404: the object does not exist, or the resource type (e.g. a CRD) is not installed."""


class Conflict(PermanentError):
    """409: the object already exists or was changed since it was read."""


class Gone(PermanentError):
    """410: the resourceVersion is too old for the API's history; list again."""


class Invalid(PermanentError):
    """422: the object failed API validation."""


_BY_STATUS: dict[int, type[PermanentError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
}


def _status_body(body: Any) -> tuple[str, str, tuple[str, ...]]:
    """(reason, message, cause messages) from a ``Status`` object body, when it is one."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return "", body.strip()[:500], ()
    if isinstance(body, Mapping):
        details = body.get("details")
        raw = details.get("causes") if isinstance(details, Mapping) else None
        causes = tuple(
            str(c.get("message"))
            for c in (raw if isinstance(raw, list) else ())
            if isinstance(c, Mapping) and c.get("message")
        )
        return str(body.get("reason") or ""), str(body.get("message") or ""), causes
    return "", "", ()


def _retry_after(headers: Any) -> float | None:
    raw = headers.get("Retry-After") if headers is not None else None
    try:
        return float(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None


def error_for_status(
    status: int, body: Any = None, *, headers: Any = None, what: str = ""
) -> KubeError:
    """The error for an HTTP ``status`` with the API's ``Status`` ``body`` (str, bytes or dict).

    ``what`` names the request (``"list pods"``) so the message says what failed.
    """
    reason, message, causes = _status_body(body)
    prefix = f"{what}: " if what else ""
    text = (
        f"{prefix}HTTP {status}"
        + (f" {reason}" if reason else "")
        + (f": {message}" if message else "")
    )
    if status == 429 or status >= 500:
        return TemporaryError(
            text,
            status=status,
            reason=reason,
            retry_after=_retry_after(headers),
            causes=causes,
        )
    cls = _BY_STATUS.get(status, PermanentError)
    return cls(text, status=status, reason=reason, causes=causes)


def translate(exc: BaseException, what: str = "") -> KubeError:
    """Map ``exc`` to a :class:`KubeError`, chaining ``exc`` as its cause.

    Already-translated errors pass through unchanged.
    """
    if isinstance(exc, KubeError):
        return exc
    err: KubeError
    prefix = f"{what}: " if what else ""
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        if status:
            err = error_for_status(status, exc.body or exc.reason, headers=exc.headers, what=what)
        else:
            err = TemporaryError(f"{prefix}{exc.reason or exc}")
    elif isinstance(exc, asyncio.TimeoutError | TimeoutError):
        err = TemporaryError(f"{prefix}timed out")
    elif isinstance(exc, aiohttp.ClientResponseError):
        err = error_for_status(exc.status, exc.message, headers=exc.headers, what=what)
    elif isinstance(exc, aiohttp.ClientError | ConnectionError | OSError):
        err = TemporaryError(f"{prefix}{type(exc).__name__}: {exc}")
    elif isinstance(exc, ValueError):
        # A response we could not decode (truncated stream, oversized line): reconnecting helps.
        err = TemporaryError(f"{prefix}bad response: {exc}")
    else:
        err = KubeError(f"{prefix}{type(exc).__name__}: {exc}")
    err.__cause__ = exc
    return err
