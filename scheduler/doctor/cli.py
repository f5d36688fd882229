"""``kai-scheduler doctor``: the readiness checks an admin would otherwise run by hand.

Exit codes: 0 every check is ok or warn, 1 a check failed, 2 bad flags or an unusable
kubeconfig (the message names the flag).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from scheduler.cliflags import add_kube_flags, api_url, non_negative_number, positive_number
from scheduler.doctor.report import OUTPUTS, render
from scheduler.doctor.result import exit_code

__all__ = ["add_parser", "run"]

_EXIT_BAD_INPUT = 2


def add_parser(subs: Any) -> argparse.ArgumentParser:
    """Add the ``doctor`` subcommand to ``kai-scheduler``'s subparsers."""
    p: argparse.ArgumentParser = subs.add_parser(
        "doctor",
        help="check an installed scheduler: Deployment, leader, CRDs, queues, RBAC, GPUs ...",
        description="Readiness checks of an installed KAI Scheduler; each is ok, warn or fail "
        "with a one-line fix. Exit code 1 when a check fails.",
    )
    add_kube_flags(
        p,
        kube_config_help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster)",
        server_type=api_url,
    )
    p.add_argument(
        "--namespace",
        "-n",
        default="kai-scheduler",
        help="namespace the scheduler is installed in (default kai-scheduler)",
    )
    p.add_argument(
        "--output",
        "-o",
        choices=OUTPUTS,
        default="table",
        help="table (rich on a terminal, plain text otherwise) or json",
    )
    p.add_argument(
        "--pending-minutes",
        metavar="N",
        type=non_negative_number("minutes"),
        default=5.0,
        help="report our pods pending longer than N minutes (default 5)",
    )
    p.add_argument(
        "--metrics-url",
        metavar="URL",
        type=api_url,
        default=None,
        help="scrape the scheduler here (e.g. after kubectl port-forward) instead of "
        "through the API server's pod proxy",
    )
    p.add_argument(
        "--lws-namespace",
        default="lws-system",
        help="namespace of the LeaderWorkerSet controller's config (default lws-system)",
    )
    p.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=positive_number("seconds"),
        default=10.0,
        help="seconds allowed for each API request (default 10)",
    )
    p.set_defaults(command="doctor")
    return p  # fmt: skip


def _kubeconfig(given: str | None) -> str | None:
    """``--kube-config``, else kubectl's default file when neither $KUBECONFIG nor an
    in-cluster account would be used."""
    if given or os.environ.get("KUBECONFIG") or os.environ.get("KUBERNETES_SERVICE_HOST"):
        return given
    default = Path.home() / ".kube" / "config"
    return str(default) if default.is_file() else None


async def _run(args: argparse.Namespace) -> int:
    from scheduler.doctor.checks import DoctorSettings, run_checks
    from scheduler.k8s.client import ClientSettings, make_api_client

    settings = DoctorSettings(
        namespace=args.namespace,
        pending_minutes=args.pending_minutes,
        metrics_url=args.metrics_url,
        lws_namespace=args.lws_namespace,
        timeout=args.timeout,
    )
    connection = ClientSettings(
        _kubeconfig(args.kube_config), args.kube_api_server, args.kube_api_secure
    )
    api = await make_api_client(connection)
    try:
        results = await run_checks(api, settings)
    finally:
        await api.close()
    render(results, args.output, sys.stdout)
    return exit_code(results)


def run(args: argparse.Namespace) -> int:
    """Run the checks and print them; the process's exit code."""
    from scheduler.k8s.errors import ClientConfigError
    from scheduler.logs import setup_logging

    # Logs go to stderr and only when something is wrong: stdout is the report.
    setup_logging("console", "warning")
    try:
        return asyncio.run(_run(args))
    except ClientConfigError as e:
        print(f"kai-scheduler doctor: {e}", file=sys.stderr)
        return _EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
