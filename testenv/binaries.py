"""Locating the control plane's binaries built by testenv/build.sh."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["REQUIRED_BINARIES", "BinariesMissingError", "find_bin_dir", "repo_root"]

#: Every binary the control plane and its helpers run.
REQUIRED_BINARIES: tuple[str, ...] = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kubectl",
    "kwok",
    "helm",
)

BIN_DIR_ENV = "KAI_TESTENV_BIN"


class BinariesMissingError(RuntimeError):
    """The testenv binaries are not built (or KAI_TESTENV_BIN points at the wrong place)."""


def repo_root() -> Path:
    """The repository root (the folder holding testenv/)."""
    return Path(__file__).resolve().parent.parent


def find_bin_dir() -> Path:
    """Return the resolved folder holding every binary in REQUIRED_BINARIES.

    Uses $KAI_TESTENV_BIN when set, else .cache/testenv-bin/current under the repo root.
    Raises BinariesMissingError naming the missing binaries and the command that builds them.
    """
    override = os.environ.get(BIN_DIR_ENV)
    if override:
        candidate = Path(override).expanduser()
        origin = f"${BIN_DIR_ENV}={override}"
    else:
        candidate = repo_root() / ".cache" / "testenv-bin" / "current"
        origin = str(candidate)
    if not candidate.is_dir():
        raise BinariesMissingError(
            f"testenv binaries not found at {origin}: run testenv/build.sh "
            f"(or scripts/setup.sh) to build them, or set {BIN_DIR_ENV} to their folder"
        )
    resolved = candidate.resolve()
    missing = [
        name
        for name in REQUIRED_BINARIES
        if not (resolved / name).is_file() or not os.access(resolved / name, os.X_OK)
    ]
    if missing:
        raise BinariesMissingError(
            f"testenv binaries {', '.join(missing)} missing from {resolved} ({origin}): "
            "run testenv/build.sh to build them"
        )
    return resolved
