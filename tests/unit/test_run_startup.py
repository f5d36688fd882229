"""``kai-scheduler run`` start and stop: a bad kubeconfig exits 2 naming the problem before the
probe port is bound or the solver warms up; with the API server unreachable, SIGTERM stops the
process at once and the log says why it never connected.

The subprocess tests run the real console entry point (``python -m scheduler``); nothing
listens on the ports they use (the closed port is taken from the kernel and released).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from scheduler.config import SchedulerConfig, ServiceSettings
from scheduler.k8s.client import ClientSettings
from scheduler.k8s.errors import ClientConfigError
from scheduler.k8s.kubeconfig import check_kubeconfig

ROOT = Path(__file__).resolve().parents[2]

GOOD = """\
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:PORT", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: abc}
contexts:
- name: ctx
  context: {cluster: c, user: u}
current-context: ctx
"""


def free_port() -> int:
    """A loopback port nothing listens on (taken from the kernel, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kubeconfig(tmp_path: Path, text: str, port: int = 1) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(text.replace("PORT", str(port)))
    return str(path)


BAD = {
    "not YAML": (
        "clusters: [\n  - bad: {\n",
        "not valid YAML at line 2, column 3",
    ),
    "empty": ("", "the file is empty"),
    "not a mapping": ("just a string\n", "the file is a YAML str, not a mapping"),
    "no current-context": (
        GOOD.replace("current-context: ctx\n", ""),
        "no current-context is set (contexts in the file: ctx); run kubectl config "
        "use-context NAME",
    ),
    "unknown current-context": (
        GOOD.replace("current-context: ctx", "current-context: prod"),
        "current-context is 'prod', which is not in contexts (it has: ctx)",
    ),
    "unknown cluster": (
        GOOD.replace("{cluster: c,", "{cluster: other,"),
        "context 'ctx' names cluster 'other', which is not in clusters (it has: c)",
    ),
    "unknown user": (
        GOOD.replace("user: u}", "user: nobody}"),
        "context 'ctx' names user 'nobody', which is not in users (it has: u)",
    ),
    "server not a URL": (
        GOOD.replace('"https://127.0.0.1:PORT"', "127.0.0.1:6443"),
        "cluster 'c' has server '127.0.0.1:6443'; it must be a URL such as https://host:6443",
    ),
}


@pytest.mark.parametrize(("text", "message"), BAD.values(), ids=BAD.keys())
def test_bad_kubeconfig_is_named(tmp_path: Path, text: str, message: str) -> None:
    path = kubeconfig(tmp_path, text)
    with pytest.raises(ClientConfigError) as e:
        check_kubeconfig(path)
    assert e.value.message.startswith(f"--kube-config={path}: ")
    assert message in e.value.message


def test_good_kubeconfig_passes_and_a_server_flag_replaces_a_bad_server(tmp_path: Path) -> None:
    check_kubeconfig(kubeconfig(tmp_path, GOOD))
    bad_server = GOOD.replace('"https://127.0.0.1:PORT"', "not-a-url")
    check_kubeconfig(kubeconfig(tmp_path, bad_server), server_given=True)
    with pytest.raises(ClientConfigError, match="file does not exist"):
        check_kubeconfig(str(tmp_path / "missing"))


def test_run_refuses_bad_settings_before_binding_or_warming_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import scheduler.runner as runner

    called: list[str] = []

    async def start(self: Any) -> None:
        called.append("bind")

    monkeypatch.setattr(runner.HealthServer, "start", start)
    monkeypatch.setattr(runner, "warm_up", lambda settings: called.append("warm-up"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = kubeconfig(tmp_path, BAD["no current-context"][0])
    code = asyncio.run(
        runner.run(
            SchedulerConfig(),
            ClientSettings(path),
            ServiceSettings(False, f"127.0.0.1:{free_port()}", "test"),
        )
    )
    assert code == 2
    assert called == []


def _env() -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST", "KUBECONFIG")
    }
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run(args: list[str], **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "scheduler", *args],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kw,
    )


def _port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.05):
        return True
    return False


def test_bad_kubeconfig_exits_2_without_opening_the_port(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, BAD["not YAML"][0])
    port = free_port()
    proc = _run(["run", f"--kube-config={path}", f"--metrics-address=127.0.0.1:{port}"])
    opened = False
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        opened = opened or _port_open(port)
        time.sleep(0.02)
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 2, out
    assert not opened
    assert f"kai-scheduler: --kube-config={path}: not valid YAML at line 2, column 3" in out
    # Neither the probe server nor the solver's warm-up ran.
    assert "serving_probes" not in out and "solved" not in out and "Traceback" not in out


def test_unknown_flag_value_exits_2_naming_the_flag(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, GOOD)
    proc = _run(["run", f"--kube-config={path}", "--kube-api-secure=maybe"])
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, out
    assert "--kube-api-secure: 'maybe' must be true or false" in out
    assert "serving_probes" not in out


def test_sigterm_with_the_api_server_unreachable_stops_promptly_and_says_why(
    tmp_path: Path,
) -> None:
    path = kubeconfig(tmp_path, GOOD, port=free_port())
    proc = _run(["run", f"--kube-config={path}", f"--metrics-address=127.0.0.1:{free_port()}"])
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 60
    # Running for real: the probes are served and the lists are being refused.
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if '"watch_interrupted"' in line:
            break
    assert any('"watch_interrupted"' in x for x in lines), "".join(lines)
    time.sleep(2.0)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        rest, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    took = time.monotonic() - sent
    out = "".join(lines) + rest
    assert proc.returncode == 0, out
    assert took < 2.0, f"took {took:.2f} s to stop"
    assert '"stop_requested"' in out and '"SIGTERM"' in out
    stopped = [x for x in out.splitlines() if '"stopped_before_connecting"' in x]
    assert len(stopped) == 1, out
    assert "Cannot connect to host 127.0.0.1" in stopped[0]
    assert '"fix"' in stopped[0]
