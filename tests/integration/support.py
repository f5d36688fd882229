"""Helpers shared by the integration tests (real API server; nothing here fakes it)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import ApiClient

from scheduler.cache import Cache
from scheduler.k8s.watch import Watcher, WatchSettings
from testenv.controlplane import ControlPlane

__all__ = ["FAST_WATCH", "REPO", "SCHED", "eventually", "install_crds", "kubectl", "watched"]

SCHED = "kai-scheduler"
REPO = Path(__file__).resolve().parents[2]
#: Watch settings that notice a cut or a quiet watch within seconds, for tests.
FAST_WATCH = WatchSettings(watch_timeout=5, backoff_base=0.1, backoff_max=0.5, read_grace=5)


@contextlib.asynccontextmanager
async def watched(api: ApiClient, scheduler_name: str) -> AsyncIterator[Cache]:
    """A cache for ``scheduler_name`` kept current by a running watcher (every kind)."""
    cache = Cache(scheduler_name, "default-queue")
    watcher = Watcher(api, cache, settings=FAST_WATCH)
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.wait_for(watcher.synced.wait(), 30)
        yield cache
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


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
