"""Flags shared by the ``kai-scheduler`` subcommands that talk to a cluster (``run``,
``doctor``, ``explain``, ``snapshot``): the connection flags and the argparse value types.

One definition, so every subcommand spells, parses and explains them the same way.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["add_kube_flags", "api_url", "non_negative_number", "parse_bool", "positive_number"]


def parse_bool(text: str | bool) -> bool:
    """``true``/``false`` (also 1/0, yes/no) for flags such as ``--kube-api-secure``."""
    if isinstance(text, bool):
        return text
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} must be true or false")


def api_url(text: str) -> str:
    """An ``http(s)://`` URL (an API server or a metrics endpoint)."""
    if not text.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"{text!r} must be a URL such as http://127.0.0.1:8080")
    return text


def _number(unit: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of {unit}") from None


def positive_number(unit: str) -> Callable[[str], float]:
    """An argparse type: a number of ``unit`` (e.g. "seconds") above 0."""

    def parse(text: str) -> float:
        value = _number(unit, text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 {unit}")
        return value

    return parse


def non_negative_number(unit: str) -> Callable[[str], float]:
    """An argparse type: a number of ``unit`` (e.g. "minutes"), 0 or more."""

    def parse(text: str) -> float:
        value = _number(unit, text)
        if value < 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more {unit}")
        return value

    return parse


def add_kube_flags(
    p: argparse.ArgumentParser,
    *,
    kube_config_help: str,
    server_type: Callable[[str], str] = str,
) -> None:
    """``--kube-config``, ``--kube-api-server`` and ``--kube-api-secure`` (as ``run`` has
    them, after the upstream scheduler's); ``kube_config_help`` says what happens without
    ``--kube-config`` (``run`` uses the in-cluster ServiceAccount, the admin commands the
    kubeconfig kubectl would)."""
    p.add_argument("--kube-config", metavar="PATH", default=None, help=kube_config_help)
    p.add_argument(
        "--kube-api-server",
        metavar="URL",
        type=server_type,
        default=None,
        help="API server URL; overrides the kubeconfig's server",
    )
    p.add_argument(
        "--kube-api-secure",
        metavar="true|false",
        type=parse_bool,
        default=None,
        help="verify the API server's TLS certificate (default: as the kubeconfig says)",
    )
