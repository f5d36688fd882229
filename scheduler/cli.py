"""The ``kai-scheduler`` command: ``run`` (the default), ``simulate`` and ``podgrouper``.

``run`` flags follow the upstream scheduler's, so this Deployment snippet works unchanged::

    args: ["--kube-api-server=https://kubernetes.default.svc", "--kube-api-secure=true",
           "--kube-config=/etc/kubernetes/admin.conf"]

Without ``--kube-config`` the in-cluster ServiceAccount is used. Exit codes: 0 clean shutdown,
1 the service failed, 2 bad flags or config (the message names the flag or key).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import socket
import sys
import uuid
from collections.abc import Sequence
from dataclasses import replace
from types import ModuleType

from scheduler import __version__
from scheduler.cliflags import add_kube_flags, parse_bool
from scheduler.config import (
    ConfigError,
    SchedulerConfig,
    ServiceSettings,
    load_config,
)
from scheduler.k8s.client import ClientSettings
from scheduler.logs import LOG_FORMATS, LOG_LEVELS, setup_logging

__all__ = ["build_parser", "main", "parse_bool", "settings_from_args"]

_SUBCOMMANDS = ("run", "simulate", "podgrouper", "doctor", "snapshot", "explain")


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    add_kube_flags(p, kube_config_help="kubeconfig file (default: the in-cluster ServiceAccount)")
    p.add_argument(
        "--scheduler-name",
        action="append",
        default=None,
        help="serve pods with this spec.schedulerName (default kai-scheduler); repeat it or "
        "separate names by commas to serve several, e.g. kai-scheduler and volcano",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="YAML config: placement, cyclePeriod, solverTimeLimit, defaultQueue, ...",
    )
    p.add_argument(
        "--leader-elect",
        metavar="true|false",
        nargs="?",
        const=True,
        type=parse_bool,
        default=False,
        help="elect a leader through a coordination.k8s.io Lease; only it binds",
    )
    p.add_argument(
        "--metrics-address",
        default=":8080",
        help="serve /healthz, /readyz and /metrics here (default :8080)",
    )
    p.add_argument("--log-format", choices=LOG_FORMATS, default="json")
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info", type=str.lower)
    p.set_defaults(command="run")


def _simulate_module() -> ModuleType | None:
    try:
        return importlib.import_module("scheduler.simulate.cli")
    except ImportError:
        return None


def build_parser(with_simulate: bool = True) -> argparse.ArgumentParser:
    """The argument parser. ``simulate`` is imported only when asked for (it pulls in more)."""
    parser = argparse.ArgumentParser(
        prog="kai-scheduler",
        description="Kubernetes scheduler for AI/ML workloads (gangs, queues, GPU packing).",
    )
    parser.add_argument("--version", action="version", version=f"kai-scheduler {__version__}")
    subs = parser.add_subparsers(
        dest="command", metavar="{run,simulate,podgrouper,doctor,snapshot,explain}"
    )
    _add_run_flags(subs.add_parser("run", help="run the scheduler against a cluster (default)"))
    from scheduler.podgrouper import cli as podgrouper_cli

    podgrouper_cli.add_parser(subs)
    from scheduler import capture

    capture.add_parser(subs)
    from scheduler.doctor import cli as doctor_cli

    doctor_cli.add_parser(subs)
    from scheduler.inspect import cli as explain_cli

    explain_cli.add_parser(subs)
    module = _simulate_module() if with_simulate else None
    if module is not None:
        module.add_parser(subs)
    else:
        stub = subs.add_parser("simulate", help="replay scenarios on an in-memory cluster")
        stub.set_defaults(command="simulate-missing")
    return parser


def _normalise(argv: Sequence[str]) -> list[str]:
    """Make ``run`` the default subcommand (``kai-scheduler --kube-config=...``)."""
    args = list(argv)
    first = next((a for a in args if a not in ("-h", "--help", "--version")), None)
    if first is None:
        return args if args else ["run"]
    if first not in _SUBCOMMANDS:
        index = args.index(first)
        args.insert(index, "run")
    return args


def _identity() -> str:
    base = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{base}_{uuid.uuid4().hex[:8]}"


def settings_from_args(
    args: argparse.Namespace,
) -> tuple[SchedulerConfig, ClientSettings, ServiceSettings]:
    """Config file plus flags; raises :class:`ConfigError` naming the flag or key."""
    base = SchedulerConfig()
    namespace = os.environ.get("POD_NAMESPACE")
    if namespace:
        base = replace(
            base, leader_election=replace(base.leader_election, lease_namespace=namespace)
        )
    config = load_config(args.config, base)
    if args.scheduler_name is not None:
        names = [n.strip() for given in args.scheduler_name for n in given.split(",")]
        if not all(names):
            raise ConfigError("--scheduler-name", "must not be empty")
        served = tuple(dict.fromkeys(names))
        config = replace(config, scheduler_name=served[0], scheduler_names=served)
    server = args.kube_api_server
    if server is not None and not server.startswith(("https://", "http://")):
        raise ConfigError(
            "--kube-api-server", f"{server!r} must be a URL such as https://host:6443"
        )
    connection = ClientSettings(args.kube_config, server, args.kube_api_secure)
    from scheduler.health import parse_address

    try:
        parse_address(args.metrics_address)
    except ValueError as e:
        raise ConfigError("--metrics-address", str(e)) from e
    service = ServiceSettings(args.leader_elect, args.metrics_address, _identity())
    return config, connection, service


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kai-scheduler`` console script."""
    raw = list(sys.argv[1:] if argv is None else argv)
    normalised = _normalise(raw)
    wants_simulate = "simulate" in normalised[:1] or any(a in ("-h", "--help") for a in raw)
    parser = build_parser(with_simulate=wants_simulate)
    args = parser.parse_args(normalised)
    if args.command == "simulate-missing":
        print("kai-scheduler: the simulator (scheduler.simulate) is not installed", file=sys.stderr)
        return 2
    if args.command == "snapshot":
        from scheduler import capture

        return capture.run(args)
    if args.command == "podgrouper":
        from scheduler.podgrouper import cli as podgrouper_cli

        return podgrouper_cli.run(args)
    if args.command == "doctor":
        from scheduler.doctor import cli as doctor_cli

        return doctor_cli.run(args)
    if args.command == "explain":
        from scheduler.inspect import cli as explain_cli

        return explain_cli.run(args)
    if args.command != "run":
        module = _simulate_module()
        assert module is not None
        return int(module.run(args))
    try:
        setup_logging(args.log_format, args.log_level)
        config, connection, service = settings_from_args(args)
    except ConfigError as e:
        print(f"kai-scheduler: {e}", file=sys.stderr)
        return 2
    from scheduler.runner import run

    try:
        return asyncio.run(run(config, connection, service))
    except KeyboardInterrupt:
        return 130
