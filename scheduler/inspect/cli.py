"""``kai-scheduler explain [-n NAMESPACE] pod/NAME | podgroup/NAME | NAME``.

Prints what the scheduler's last cycle decided for one pod or PodGroup and why (the reason
it wrote on the pod's ``PodScheduled`` condition, the PodGroup's status and its Events), the
gang it belongs to and where its pods are bound, anything of take-back in flight, and its
queue's fair share and usage from the Queue's status. A bare NAME is a pod if one of that name
exists, else a PodGroup.

Exit codes: 0 explained (whatever the verdict), 1 the object does not exist or cannot be read,
2 bad flags, target or kubeconfig (the message names which).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from scheduler.cliflags import add_kube_flags, positive_number
from scheduler.inspect.render import OUTPUTS
from scheduler.inspect.views import DEFAULT_SCHEDULER_NAMES

__all__ = ["TargetError", "add_parser", "default_namespace", "parse_target", "run"]

_EXIT_FAILED = 1
_EXIT_BAD_INPUT = 2
_KINDS = {"pod": "pod", "pods": "pod", "po": "pod", "podgroup": "podgroup",
          "podgroups": "podgroup", "pg": "podgroup"}  # fmt: skip
_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class TargetError(ValueError):
    """The object argument is not ``pod/NAME``, ``podgroup/NAME`` or ``NAME``."""


def parse_target(text: str) -> tuple[str, str]:
    """``(kind, name)`` with kind ``pod``, ``podgroup`` or ``""`` (a bare NAME: either)."""
    kind, sep, name = text.strip().partition("/")
    if not sep:
        kind, name = "", kind
    elif kind.lower() not in _KINDS and "." in kind:
        # kubectl's full names: podgroups.scheduling.run.ai/NAME, pods./NAME.
        kind = kind.split(".", 1)[0]
    if sep and kind.lower() not in _KINDS:
        raise TargetError(
            f"{text!r}: explain takes pod/NAME, podgroup/NAME or NAME, not kind {kind or '(empty)'}"
        )
    if not name or "/" in name:
        raise TargetError(f"{text!r}: give one object, e.g. pod/train-0 or podgroup/train")
    return (_KINDS[kind.lower()] if sep else ""), name


def _kubeconfig(given: str | None) -> str | None:
    """``--kube-config``, else kubectl's default file when neither $KUBECONFIG nor an
    in-cluster account would be used (the API client's own order otherwise)."""
    if given or os.environ.get("KUBECONFIG") or os.environ.get("KUBERNETES_SERVICE_HOST"):
        return given
    default = Path.home() / ".kube" / "config"
    return str(default) if default.is_file() else None


def default_namespace(kube_config: str | None) -> str:
    """The namespace kubectl would use: the current context's, else the service account's,
    else ``default``. An unreadable file counts as none (the connection reports it)."""
    path = kube_config or (os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None)
    if path:
        try:
            config = yaml.safe_load(Path(path).read_text())
            current = config.get("current-context")
            for ctx in config.get("contexts") or []:
                if ctx.get("name") == current and (ctx.get("context") or {}).get("namespace"):
                    return str(ctx["context"]["namespace"])
        except (OSError, yaml.YAMLError, AttributeError, TypeError):
            pass
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            return _SA_NAMESPACE.read_text().strip() or "default"
        except OSError:
            pass
    return "default"


def _events(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of Events") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def add_parser(subs: Any) -> argparse.ArgumentParser:
    """Add the ``explain`` subcommand to ``kai-scheduler``'s subparsers."""
    p: argparse.ArgumentParser = subs.add_parser(
        "explain",
        help="why a pod or PodGroup is placed or waiting, with its gang and queue",
        description="What the scheduler's last cycle decided for one pod or PodGroup and why, "
        "its gang, where its pods are bound, take-back in flight, its queue's fair share and "
        "usage. Exit code 1 when the object does not exist.",
    )
    p.add_argument("target", metavar="pod/NAME|podgroup/NAME|NAME", help="the object to explain")
    p.add_argument(
        "--namespace",
        "-n",
        default=None,
        help="the object's namespace (default: the kubeconfig context's, or default)",
    )
    add_kube_flags(
        p, kube_config_help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster)"
    )
    p.add_argument(
        "--output",
        "-o",
        choices=OUTPUTS,
        default="text",
        help="text (rich on a terminal, plain otherwise) or json",
    )
    p.add_argument(
        "--scheduler-name",
        action="append",
        default=None,
        help="schedulerName(s) the scheduler serves (default kai-scheduler); repeat "
        "or separate by commas, as for run",
    )
    p.add_argument(
        "--default-queue",
        default="default-queue",
        help="the scheduler's defaultQueue, for pods that name no queue (default default-queue)",
    )
    p.add_argument(
        "--events",
        metavar="N",
        type=_events,
        default=10,
        help="show at most N Event rows (default 10)",
    )
    p.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=positive_number("seconds"),
        default=15.0,
        help="seconds allowed for each API request (default 15)",
    )
    p.set_defaults(command="explain")
    return p  # fmt: skip


async def _explain(args: argparse.Namespace, kind: str, name: str, namespace: str) -> int:
    from scheduler.inspect.model import explain_pod, explain_podgroup
    from scheduler.inspect.reads import (
        NotFoundError,
        kind_of_name,
        read_for_pod,
        read_for_podgroup,
    )
    from scheduler.inspect.render import render
    from scheduler.k8s.client import ClientSettings, make_api_client
    from scheduler.k8s.errors import ClientConfigError, KubeError

    names = tuple(n.strip() for given in args.scheduler_name or () for n in given.split(","))
    names = tuple(n for n in names if n) or DEFAULT_SCHEDULER_NAMES
    connection = ClientSettings(
        _kubeconfig(args.kube_config), args.kube_api_server, args.kube_api_secure
    )
    try:
        api = await make_api_client(connection)
    except ClientConfigError as e:
        print(f"kai-scheduler explain: {e}", file=sys.stderr)
        return _EXIT_BAD_INPUT
    bare = not kind
    try:
        if bare:
            kind = await kind_of_name(api, namespace, name, args.timeout)
        read = read_for_pod if kind == "pod" else read_for_podgroup
        objects = await read(
            api, namespace, name, default_queue=args.default_queue, timeout=args.timeout
        )
    except NotFoundError as e:
        what = f"no pod or PodGroup {name} in namespace {namespace}" if bare else str(e)
        print(f"kai-scheduler explain: {what}; check the name and -n NAMESPACE", file=sys.stderr)
        return _EXIT_FAILED
    except KubeError as e:
        print(f"kai-scheduler explain: cannot read {kind} {name}: {e.message}", file=sys.stderr)
        return _EXIT_FAILED
    finally:
        await api.close()
    common: dict[str, Any] = {
        "members": objects.members,
        "queues": objects.queues,
        "events": objects.events,
        "default_queue": args.default_queue,
        "event_limit": args.events,
    }
    if kind == "pod":
        explanation = explain_pod(
            objects.target, podgroup=objects.podgroup, scheduler_names=names, **common
        )
    else:
        explanation = explain_podgroup(objects.target, **common)
    if objects.notes:
        import dataclasses

        explanation = dataclasses.replace(explanation, notes=(*explanation.notes, *objects.notes))
    render(explanation, args.output, sys.stdout)
    return 0


def run(args: argparse.Namespace) -> int:
    """Explain the object and print it; the process's exit code."""
    from scheduler.logs import setup_logging

    # Logs go to stderr and only when something is wrong: stdout is the explanation.
    setup_logging("console", "warning")
    try:
        kind, name = parse_target(args.target)
    except TargetError as e:
        print(f"kai-scheduler explain: {e}", file=sys.stderr)
        return _EXIT_BAD_INPUT
    if args.kube_api_server and not args.kube_api_server.startswith(("https://", "http://")):
        print(
            f"kai-scheduler explain: --kube-api-server={args.kube_api_server}: give a URL such "
            "as https://host:6443",
            file=sys.stderr,
        )
        return _EXIT_BAD_INPUT
    namespace = args.namespace or default_namespace(_kubeconfig(args.kube_config))
    try:
        return asyncio.run(_explain(args, kind, name, namespace))
    except KeyboardInterrupt:
        return 130
