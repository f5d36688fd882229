"""Checking a kubeconfig file before anything is built on it.

kubernetes-asyncio's loader reports a broken file as a bare YAML traceback or a ``'NoneType'
object does not support item assignment``; :func:`check_kubeconfig` reads the file first and
says what is wrong in the words of ``kubectl config`` (missing file, not YAML, no
current-context, a context naming a cluster or user the file lacks, a server that is not a
URL), with the fix. Nothing here talks to the API server.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from scheduler.k8s.errors import ClientConfigError

__all__ = ["check_kubeconfig"]


def _named(entries: Any, section: str, name: str, flag: str, who: str) -> Mapping[str, Any]:
    """The ``section`` entry (``clusters``/``contexts``/``users``) called ``name``; ``who``
    says what named it, for the error."""
    items = entries if isinstance(entries, list) else []
    names = [e.get("name") for e in items if isinstance(e, Mapping)]
    for e in items:
        if isinstance(e, Mapping) and e.get("name") == name:
            return e
    known = ", ".join(str(n) for n in names) or "none"
    raise ClientConfigError(
        f"{flag}: {who} {name!r}, which is not in {section} (it has: {known}); fix the name"
    )


def check_kubeconfig(path: str, *, flag: str | None = None, server_given: bool = False) -> None:
    """Raise :class:`ClientConfigError` naming the problem when the kubeconfig at ``path``
    cannot be used; ``flag`` names where the path came from (default ``--kube-config=PATH``).
    ``server_given``: ``--kube-api-server`` replaces the file's server, so it is not checked."""
    flag = flag or f"--kube-config={path}"
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError as e:
        raise ClientConfigError(
            f"{flag}: file does not exist; give the path of a readable kubeconfig"
        ) from e
    except (OSError, UnicodeDecodeError) as e:
        raise ClientConfigError(f"{flag}: cannot read the file ({e}); fix its permissions") from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        where = ""
        mark = getattr(e, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ClientConfigError(
            f"{flag}: not valid YAML{where} ({problem}); fix the file or regenerate it "
            "(kubectl config view --raw > FILE)"
        ) from e
    if not isinstance(data, Mapping):
        what = "empty" if data is None else f"a YAML {type(data).__name__}, not a mapping"
        raise ClientConfigError(
            f"{flag}: the file is {what}; a kubeconfig has clusters, contexts, users and "
            "current-context"
        )
    current = data.get("current-context")
    contexts = data.get("contexts")
    if not current:
        names = [c.get("name") for c in contexts or [] if isinstance(c, Mapping)]
        hint = f" (contexts in the file: {', '.join(map(str, names))})" if names else ""
        raise ClientConfigError(
            f"{flag}: no current-context is set{hint}; run kubectl config use-context NAME "
            f"--kubeconfig {path}"
        )
    context = _named(contexts, "contexts", str(current), flag, "current-context is").get("context")
    if not isinstance(context, Mapping):
        raise ClientConfigError(f"{flag}: context {current!r} has no context: section")
    cluster_name = context.get("cluster")
    if not cluster_name:
        raise ClientConfigError(f"{flag}: context {current!r} names no cluster")
    cluster = _named(
        data.get("clusters"),
        "clusters",
        str(cluster_name),
        flag,
        f"context {current!r} names cluster",
    ).get("cluster")
    server = cluster.get("server") if isinstance(cluster, Mapping) else None
    valid = isinstance(server, str) and server.startswith(("https://", "http://"))
    if not valid and not server_given:
        raise ClientConfigError(
            f"{flag}: cluster {cluster_name!r} has server {server!r}; it must be a URL such as "
            "https://host:6443 (or pass --kube-api-server)"
        )
    user_name = context.get("user")
    if user_name:
        _named(data.get("users"), "users", str(user_name), flag, f"context {current!r} names user")
