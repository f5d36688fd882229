"""scripts/chart-repo.sh refuses bad arguments with exit 2 and a message naming the fix, before
it needs helm (its output is checked against the built helm in tests/e2e/test_helm_repo.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

__all__: list[str] = []

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "chart-repo.sh"


def _run(*args: str, helm: str = "/nonexistent/helm") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HELM": helm}
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=30, check=False
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "OUT_DIR is required"),
        (("OUT", "--bogus"), "unknown flag --bogus"),
        (("OUT", "OTHER"), "only one OUT_DIR may be given"),
        (("OUT", "--url"), "--url needs a value"),
        (("OUT", "--url", "charts.example.org"), "--url must be an http:// or https:// URL"),
        (("OUT",), "helm not found at '/nonexistent/helm'"),
    ],
)
def test_bad_arguments_exit_2_with_the_fix(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    argv = [str(tmp_path / a) if a in ("OUT", "OTHER") else a for a in args]
    result = _run(*argv)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert message in result.stderr, result.stderr
    assert not list(tmp_path.iterdir()), "nothing is written on bad input"


def test_help_exits_0() -> None:
    result = _run("--help")
    assert result.returncode == 0 and "usage: scripts/chart-repo.sh OUT_DIR" in result.stderr
