"""pytest fixtures for the real control plane: ``control_plane`` (session), ``namespace`` and
``make_gpu_nodes`` (per test). Register with ``pytest_plugins = ["testenv.pytest_plugin"]``.

The control plane starts only when a test asks for it, so unit-only runs need no binaries.
When a test that used it fails, the components' log tails are added to the report.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

import pytest

from testenv import nodes
from testenv.controlplane import ControlPlane

__all__ = ["control_plane", "make_gpu_nodes", "namespace"]
# Volcano's controller-manager and the LeaderWorkerSet controller (volcano_controller,
# lws_controller): see testenv/controllers_plugin.py.
pytest_plugins = ["testenv.controllers_plugin"]

_active: list[ControlPlane] = []
_started: list[ControlPlane] = []


@pytest.fixture(scope="session")
def control_plane() -> Generator[ControlPlane, None, None]:
    """One real control plane (etcd, kube-apiserver, kube-controller-manager, kwok) for the
    whole session, stopped at session end (also on Ctrl-C, via the finalizer and atexit)."""
    cp = ControlPlane()
    _active.append(cp)
    try:
        cp.start()
        _started.append(cp)
        yield cp
    finally:
        cp.stop()
        _active.remove(cp)


def _slug(text: str, limit: int) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:limit].strip("-") or "t"


@pytest.fixture
def namespace(
    control_plane: ControlPlane, request: pytest.FixtureRequest
) -> Generator[str, None, None]:
    """A fresh namespace (with its ``default`` ServiceAccount ready), deleted after the test."""
    name = f"t-{_slug(request.node.name, 40)}-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "namespace", name)
    # Pods are rejected until the service-account controller has made `default`.
    control_plane.kubectl(
        "wait", "--for=create", "serviceaccount/default", "-n", name, "--timeout=30s",
        timeout=45,
    )  # fmt: skip
    try:
        yield name
    finally:
        control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


MakeGpuNodes = Callable[..., list[str]]


@pytest.fixture
def make_gpu_nodes(
    control_plane: ControlPlane, request: pytest.FixtureRequest
) -> Generator[MakeGpuNodes, None, None]:
    """``make_gpu_nodes(count, gpus=8, cpu="64", memory="512Gi", pods=110, labels=None,
    taints=None, name_prefix="gpu-node", gpu_memory_mib=None) -> names``: kwok GPU nodes
    with a per-test unique name prefix, deleted after the test."""
    created: list[str] = []
    tag = uuid.uuid4().hex[:6]
    calls = 0

    def make(
        count: int,
        gpus: int = 8,
        cpu: str = "64",
        memory: str = "512Gi",
        pods: int = 110,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, str]] | None = None,
        name_prefix: str = "gpu-node",
        gpu_memory_mib: int | None = None,
    ) -> list[str]:
        nonlocal calls
        calls += 1
        prefix = f"{name_prefix}-{tag}" + (f"-{calls}" if calls > 1 else "")
        names = nodes.make_gpu_nodes(
            control_plane, count, gpus=gpus, cpu=cpu, memory=memory, pods=pods,
            labels=labels, taints=taints, name_prefix=prefix, gpu_memory_mib=gpu_memory_mib,
        )  # fmt: skip
        created.extend(names)
        return names

    try:
        yield make
    finally:
        if created:
            nodes.delete_nodes(control_plane, created)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[Any, Any, None]:
    """Attach the control plane's log tails to the report of a failed test that used it."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not report.failed or not _active:
        return
    if "control_plane" not in getattr(item, "fixturenames", ()):
        return
    for cp in _active:
        report.sections.append((f"testenv logs ({cp.log_dir})", cp.log_tail()))


def pytest_unconfigure(config: pytest.Config) -> None:
    """Last resort: never leave a control plane running when pytest ends."""
    for cp in list(_active):
        cp.stop()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say how long the session's control plane took to start and where its logs are."""
    for cp in _started:
        terminalreporter.write_line(
            f"testenv: control plane started in {cp.startup_seconds:.1f}s; logs in {cp.log_dir}"
        )
