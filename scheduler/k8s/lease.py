"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go does it.

Every replica runs :meth:`LeaderElector.run`. A candidate takes the Lease when it is free or
its holder has not renewed it for ``lease_duration`` seconds *as observed locally* (the holder's
timestamps are never compared with our clock, so clock skew cannot elect two leaders). Writes
carry the Lease's resourceVersion, so two candidates racing for it cannot both win (409).

The leader renews every ``retry_period``. :meth:`LeaderElector.is_leader` is true only while the
last successful renewal started less than ``renew_deadline`` ago; since ``renew_deadline`` is
below ``lease_duration``, a leader that cannot reach the API stops acting before anyone else
may take over. Callers check it right before every bind.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import Callable
from typing import Any

import structlog
from kubernetes_asyncio.client import ApiClient

from scheduler.config import LeaderElectionSettings
from scheduler.k8s.client import request_json
from scheduler.k8s.errors import Conflict, KubeError, NotFound
from scheduler.k8s.resources import LEASE

__all__ = ["LeaderElector"]

log = structlog.get_logger("scheduler.k8s.lease")


def _micro_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Acquire and renew a Lease; see module docstring."""

    def __init__(
        self,
        api: ApiClient,
        settings: LeaderElectionSettings,
        identity: str,
        *,
        on_change: Callable[[bool], None] | None = None,
        on_transitions: Callable[[int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.settings = settings
        self.identity = identity
        self._on_change = on_change
        #: Called with ``spec.leaseTransitions`` whenever the Lease is read or written
        #: (the scheduler's metric for leader flapping).
        self._on_transitions = on_transitions
        self._clock = clock
        self._leading = False
        self._valid_until = 0.0
        #: (holder, renewTime, resourceVersion) last seen, and when we first saw it.
        self._observed: tuple[str, str, str] | None = None
        self._observed_at = 0.0

    @property
    def path(self) -> str:
        """URL of the Lease object."""
        return LEASE.object_path(self.settings.lease_namespace, self.settings.lease_name)

    def is_leader(self) -> bool:
        """True while this replica holds a Lease renewed within ``renew_deadline``."""
        return self._leading and self._clock() < self._valid_until

    def _set_leading(self, leading: bool) -> None:
        if leading != self._leading:
            self._leading = leading
            log.info(
                "leader_acquired" if leading else "leader_lost",
                identity=self.identity,
                lease=f"{self.settings.lease_namespace}/{self.settings.lease_name}",
            )
            if self._on_change is not None:
                self._on_change(leading)

    def _spec(self, previous: dict[str, Any] | None) -> dict[str, Any]:
        now = _micro_now()
        prev = previous or {}
        same = prev.get("holderIdentity") == self.identity
        transitions = int(prev.get("leaseTransitions") or 0)
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.settings.lease_duration)),
            "acquireTime": prev.get("acquireTime") if same and prev.get("acquireTime") else now,
            "renewTime": now,
            "leaseTransitions": transitions if same or not previous else transitions + 1,
        }

    async def try_acquire_or_renew(self) -> bool:
        """One round of the protocol; returns whether we lead afterwards."""
        started = self._clock()
        try:
            lease = await request_json(self.api, "GET", self.path)
        except NotFound:
            body = {
                "apiVersion": LEASE.api_version,
                "kind": "Lease",
                "metadata": {
                    "name": self.settings.lease_name,
                    "namespace": self.settings.lease_namespace,
                },
                "spec": self._spec(None),
            }
            try:
                await request_json(
                    self.api, "POST", LEASE.list_path(self.settings.lease_namespace), body=body
                )
            except Conflict:
                return False  # someone else created it first
            self._saw({"leaseTransitions": 0})  # what _spec(None) wrote
            return self._won(started)
        spec = (lease or {}).get("spec") or {}
        self._saw(spec)
        meta = (lease or {}).get("metadata") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, str(spec.get("renewTime") or ""), str(meta.get("resourceVersion") or ""))
        if record != self._observed:
            self._observed, self._observed_at = record, started
        duration = float(spec.get("leaseDurationSeconds") or self.settings.lease_duration)
        if holder and holder != self.identity and started < self._observed_at + duration:
            self._set_leading(False)
            return False
        updated = dict(lease)
        updated["spec"] = {**spec, **self._spec(spec)}
        try:
            result = await request_json(self.api, "PUT", self.path, body=updated)
        except Conflict:
            return False  # the Lease changed under us: re-read next round
        self._saw(updated["spec"])
        rmeta = (result or {}).get("metadata") or {}
        self._observed = (
            self.identity,
            updated["spec"]["renewTime"],
            str(rmeta.get("resourceVersion") or ""),
        )
        self._observed_at = started
        return self._won(started)

    def _saw(self, spec: dict[str, Any]) -> None:
        if self._on_transitions is not None:
            self._on_transitions(int(spec.get("leaseTransitions") or 0))

    def _won(self, started: float) -> bool:
        self._valid_until = started + self.settings.renew_deadline
        self._set_leading(True)
        return True

    async def run(self, stop: asyncio.Event, iterations: int | None = None) -> None:
        """Acquire, then keep renewing, until ``stop`` is set (or ``iterations`` rounds)."""
        rounds = 0
        while not stop.is_set() and (iterations is None or rounds < iterations):
            rounds += 1
            try:
                await self.try_acquire_or_renew()
            except KubeError as e:
                log.warning("lease_error", identity=self.identity, error=e.message)
            if self._leading and not self.is_leader():
                self._set_leading(False)  # could not renew within renew_deadline
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.settings.retry_period)
        if self._leading:
            await self.release()

    async def release(self) -> None:
        """Give the Lease up (so a standby takes over at once); best effort."""
        was_leading = self.is_leader()
        self._set_leading(False)
        self._valid_until = 0.0
        if not was_leading:
            return
        try:
            lease = await request_json(self.api, "GET", self.path)
            spec = (lease or {}).get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            lease["spec"] = {
                **spec,
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "renewTime": _micro_now(),
            }
            await request_json(self.api, "PUT", self.path, body=lease)
            log.info("leader_released", identity=self.identity)
        except KubeError as e:
            log.warning("lease_release_failed", identity=self.identity, error=e.message)
