"""Helpers shared by the integration tests (real API server; nothing here fakes it)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testenv.controlplane import ControlPlane

__all__ = ["REPO", "SCHED", "eventually", "install_crds", "kubectl"]

SCHED = "kai-scheduler"
REPO = Path(__file__).resolve().parents[2]


def install_crds(cp: ControlPlane) -> None:
    """Our CRDs installed and Established (idempotent across modules)."""
    cp.kubectl("apply", "-f", str(REPO / "crds"))
    cp.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s",
        "crd/queues.scheduling.run.ai", "crd/podgroups.scheduling.run.ai",
        timeout=75,
    )  # fmt: skip


async def kubectl(cp: ControlPlane, *args: str, input: str | None = None) -> str:
    """kubectl off the event loop, so watches keep reading meanwhile."""
    result = await asyncio.to_thread(cp.kubectl, *args, input=input)
    return result.stdout


async def eventually(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Poll ``check`` until it returns something truthy; fail with the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value {last!r}")
