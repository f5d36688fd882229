"""pytest fixtures for the real third-party controllers (see testenv/controllers.py), loaded
with ``testenv.pytest_plugin``:

- ``volcano_controller`` (module): Volcano's controller-manager, CRDs and RBAC installed.
- ``make_long_running_gpu_nodes`` (per test): ``make_long_running_gpu_nodes(count, gpus=8,
  labels=None) -> names``: GPU nodes run by a second kwok (session) on which pods stay
  Running until deleted, whatever owns them (deleted after the test).
- ``lws_controller`` (per test): ``lws_controller(gang_scheduler_provider="volcano" | None)``
  starts the LeaderWorkerSet manager (with its webhooks) and stops it after the test; one at a
  time.

Nothing starts unless a test asks for it. A failed test's report gets the log tail of every
controller running at that moment.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Generator, Mapping
from typing import Any

import pytest

from testenv import nodes
from testenv.controllers import (
    LongRunningKwok,
    LwsController,
    VolcanoControllerManager,
    live_log_tails,
)
from testenv.controlplane import ControlPlane

__all__ = [
    "StartLws",
    "long_running_kwok",
    "lws_controller",
    "make_long_running_gpu_nodes",
    "volcano_controller",
]


@pytest.fixture(scope="module")
def volcano_controller(
    control_plane: ControlPlane,
) -> Generator[VolcanoControllerManager, None, None]:
    """Volcano's job/queue/gc controllers for the test module (``--scheduler-name
    kai-scheduler``); the Volcano CRDs stay installed afterwards."""
    vc = VolcanoControllerManager(control_plane)
    try:
        vc.start()
        yield vc
    finally:
        vc.stop()


@pytest.fixture(scope="session")
def long_running_kwok(control_plane: ControlPlane) -> Generator[LongRunningKwok, None, None]:
    """The second kwok (see testenv.controllers.LongRunningKwok), for the session."""
    kwok = LongRunningKwok(control_plane)
    try:
        kwok.start()
        yield kwok
    finally:
        kwok.stop()


MakeNodes = Callable[..., list[str]]


@pytest.fixture
def make_long_running_gpu_nodes(
    long_running_kwok: LongRunningKwok, control_plane: ControlPlane
) -> Generator[MakeNodes, None, None]:
    """``make_long_running_gpu_nodes(count, gpus=8, labels=None) -> names``, with a per-test
    unique name prefix; the nodes are deleted after the test."""
    created: list[str] = []
    tag = uuid.uuid4().hex[:6]

    def make(count: int, gpus: int = 8, labels: Mapping[str, str] | None = None) -> list[str]:
        prefix = f"long-running-{tag}-{len(created)}"
        names = long_running_kwok.make_gpu_nodes(
            count, gpus=gpus, labels=labels, name_prefix=prefix
        )
        created.extend(names)
        return names

    try:
        yield make
    finally:
        if created:
            nodes.delete_nodes(control_plane, created)


StartLws = Callable[..., LwsController]
_FIXTURES = frozenset(
    {"volcano_controller", "lws_controller", "long_running_kwok", "make_long_running_gpu_nodes"}
)


@pytest.fixture
def lws_controller(
    control_plane: ControlPlane,
) -> Generator[StartLws, None, None]:
    """``lws_controller(gang_scheduler_provider="volcano") -> LwsController``: started and
    ready (webhooks answering); stopped and its webhook configurations removed after the
    test."""
    started: list[LwsController] = []

    def start(gang_scheduler_provider: str | None = "volcano") -> LwsController:
        if any(c.proc is not None and c.proc.running() for c in started):
            raise RuntimeError("one LWS controller at a time: its webhooks are cluster-wide")
        suffix = gang_scheduler_provider or "no-gang"
        ctrl = LwsController(
            control_plane, gang_scheduler_provider=gang_scheduler_provider,
            name=f"lws-manager-{suffix}",
        )  # fmt: skip
        started.append(ctrl)
        return ctrl.start()

    try:
        yield start
    finally:
        for ctrl in reversed(started):
            ctrl.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[Any, Any, None]:
    """Attach the running controllers' log tails to the report of a failed test that used
    them."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.failed and _FIXTURES.intersection(getattr(item, "fixturenames", ())):
        for title, tail in live_log_tails():
            report.sections.append((f"controller log {title}", tail))
