"""``kai-scheduler podgrouper``: the pod grouper's flags and entry point.

::

    kai-scheduler podgrouper --kube-config PATH --kube-api-server URL --kube-api-secure BOOL \\
        --scheduler-name kai-scheduler [--scheduler-name other ...] \\
        --default-queue default-queue --metrics-address :8081 --log-format json --log-level info

The connection flags mean what they mean for ``run``; without ``--kube-config`` the
in-cluster ServiceAccount is used. Exit codes: 0 clean stop, 1 failure, 2 bad flags.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys

from scheduler.config import ConfigError
from scheduler.health import parse_address
from scheduler.k8s.client import ClientSettings
from scheduler.logs import LOG_FORMATS, LOG_LEVELS, setup_logging
from scheduler.podgrouper.keys import DEFAULT_QUEUE
from scheduler.podgrouper.settings import GrouperSettings, OperatorSettings

__all__ = ["add_parser", "run", "settings_from_args"]


def add_parser(subs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``podgrouper`` subcommand to the ``kai-scheduler`` parser."""
    from scheduler.cli import parse_bool

    p = subs.add_parser(
        "podgrouper",
        help="create a PodGroup per workload (Job, Deployment, LeaderWorkerSet, ...)",
        description=(
            "Group the pods of each workload into one PodGroup (KAI's pod grouper): follows "
            "ownerReferences to the top owner, creates its PodGroup and annotates the pods."
        ),
    )
    p.add_argument("--kube-config", metavar="PATH", default=None,
                   help="kubeconfig file (default: the in-cluster ServiceAccount)")  # fmt: skip
    p.add_argument("--kube-api-server", metavar="URL", default=None,
                   help="API server URL; overrides the kubeconfig's server")  # fmt: skip
    p.add_argument("--kube-api-secure", metavar="true|false", type=parse_bool, default=None,
                   help="verify the API server's TLS certificate")  # fmt: skip
    p.add_argument(
        "--scheduler-name",
        action="append",
        default=None,
        metavar="NAME",
        help="group pods with this spec.schedulerName; repeat for several (default kai-scheduler)",
    )
    p.add_argument(
        "--default-queue",
        default=DEFAULT_QUEUE,
        help=f"queue of workloads that name none (default {DEFAULT_QUEUE})",
    )
    p.add_argument(
        "--metrics-address",
        default=":8081",
        help="serve /healthz, /readyz and /metrics here (default :8081)",
    )
    p.add_argument("--log-format", choices=LOG_FORMATS, default="json")
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info", type=str.lower)
    p.set_defaults(command="podgrouper")


def settings_from_args(args: argparse.Namespace) -> tuple[OperatorSettings, ClientSettings]:
    """The settings and connection from the flags; raises :class:`ConfigError` naming the
    flag."""
    given = args.scheduler_name or ["kai-scheduler"]
    names = [n.strip() for item in given for n in item.split(",")]
    if not all(names):
        raise ConfigError("--scheduler-name", "must not be empty")
    queue = args.default_queue.strip()
    if not queue:
        raise ConfigError("--default-queue", "must not be empty")
    server = args.kube_api_server
    if server is not None and not server.startswith(("https://", "http://")):
        raise ConfigError(
            "--kube-api-server", f"{server!r} must be a URL such as https://host:6443"
        )
    try:
        parse_address(args.metrics_address)
    except ValueError as e:
        raise ConfigError("--metrics-address", str(e)) from e
    identity = os.environ.get("POD_NAME") or socket.gethostname()
    settings = OperatorSettings(
        grouper=GrouperSettings(scheduler_names=frozenset(names), default_queue=queue),
        metrics_address=args.metrics_address,
        identity=identity,
    )
    return settings, ClientSettings(args.kube_config, server, args.kube_api_secure)


def run(args: argparse.Namespace) -> int:
    """Run the pod grouper until SIGTERM; the exit code."""
    from scheduler.podgrouper.operator import run as run_operator

    try:
        setup_logging(args.log_format, args.log_level)
        settings, connection = settings_from_args(args)
    except ConfigError as e:
        print(f"kai-scheduler podgrouper: {e}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(run_operator(settings, connection))
    except KeyboardInterrupt:
        return 130
