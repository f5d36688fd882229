"""Locating the command-line tools built by testenv/build_tools.sh (promtool), and the pins."""

from __future__ import annotations

import os
import re
from pathlib import Path

from testenv.binaries import BinariesMissingError, repo_root

__all__ = ["find_tool", "pinned_version", "tools_root"]

#: Overrides ``.cache/testenv-bin/tools`` (a folder holding ``promtool/promtool``).
TOOLS_ENV = "KAI_TESTENV_TOOLS"


def tools_root() -> Path:
    """``$KAI_TESTENV_TOOLS`` or ``.cache/testenv-bin/tools`` under the repo."""
    override = os.environ.get(TOOLS_ENV)
    if override:
        return Path(override).expanduser()
    return repo_root() / ".cache" / "testenv-bin" / "tools"


def find_tool(name: str) -> Path:
    """The executable ``name`` (``promtool``); raises BinariesMissingError naming the command
    that builds it."""
    path = tools_root() / name / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise BinariesMissingError(
            f"{name} is not built ({path} missing): run testenv/build_tools.sh {name} "
            "(testenv/build.sh and scripts/setup.sh run it)"
        )
    return path.resolve()


def pinned_version(variable: str) -> str:
    """A pin of testenv/versions.env, e.g. ``pinned_version("PROMETHEUS_VERSION")``."""
    text = (repo_root() / "testenv" / "versions.env").read_text()
    m = re.search(rf"^{re.escape(variable)}=(\S+)$", text, re.MULTILINE)
    if m is None:
        raise KeyError(f"{variable} is not pinned in testenv/versions.env")
    return m[1]
