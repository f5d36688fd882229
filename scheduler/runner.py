"""The scheduler service: watches, leader election, the cycle loop, probes, clean shutdown.

Tasks (each guarded: if one ends unexpectedly it is logged and the process stops with exit
code 1 rather than limping on):

- the :class:`~scheduler.k8s.watch.Watcher` keeping the :class:`~scheduler.cache.Cache` current
  (KAI's kinds and, when their CRDs are installed, Volcano's Queue and PodGroup, whose status
  and enqueue step :class:`~scheduler.commit.volcano.VolcanoStatus` writes);
- the :class:`~scheduler.k8s.lease.LeaderElector` when ``--leader-elect`` is on;
- the cycle loop: a cycle every ``cyclePeriod``, or sooner when the cache reports new pending
  work or freed capacity, e.g. an evicted pod gone, which lets a gang waiting for it be bound
  (debounced so a burst of pods makes one cycle). Only the leader runs cycles; solving
  happens in a worker thread inside :func:`scheduler.cycle.run_cycle`, so the event loop
  keeps serving watches, probes and the Lease meanwhile.

The connection settings are checked first (the kubeconfig read and validated, the client
built): a bad ``--kube-config`` exits 2 naming the problem before the probe port is bound and
before the solver's warm-up starts.

SIGTERM/SIGINT set the stop event (logged with the signal): a cycle in progress finishes
(bounded), the Lease is released so a standby takes over at once, and the process exits 0.
Nothing waits for a cycle that has not started, so a replica that never reached the API
server stops at once, logging why it could not connect.

Losing the Lease after having led ends the process with exit code 1, as kube-scheduler does:
binds may still be queued or retrying, caches and staleness timers belong to a term that is
over, and a fresh start (as a standby) is the only state known to be right. Until it has
exited, every write is refused locally (the writer asks :meth:`Scheduler.is_leader`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import structlog

from scheduler.cache import Cache
from scheduler.cluster import Snapshot
from scheduler.cluster.gang import Gang
from scheduler.cluster.queuespec import SpecError, parse_duration
from scheduler.commit import LiveBackend
from scheduler.commit.gpusharing import GpuSharing
from scheduler.commit.volcano import VolcanoStatus
from scheduler.config import SchedulerConfig, ServiceSettings
from scheduler.cycle import run_cycle
from scheduler.health import HealthServer, HealthState
from scheduler.k8s.client import ClientSettings, make_api_client
from scheduler.k8s.errors import ClientConfigError
from scheduler.k8s.lease import LeaderElector
from scheduler.k8s.resources import VOLCANO_KINDS, WATCHED_KINDS
from scheduler.k8s.watch import Watcher
from scheduler.k8s.writer import EventLimiter, Writer
from scheduler.metrics import SchedulerMetrics
from scheduler.plugins.scorer_memory import ScorerMemory
from scheduler.solver.warm import warm_up

__all__ = ["Scheduler", "run"]

log = structlog.get_logger("scheduler.runner")

#: Seconds the current cycle may take to finish after SIGTERM before it is cancelled.
_SHUTDOWN_GRACE = 10.0
#: Consecutive failed cycles after which the process stops (exit 1) instead of limping on.
_MAX_CYCLE_FAILURES = 5


class Scheduler:
    """One scheduler replica, wired from settings; :meth:`serve` runs it until stopped."""

    def __init__(
        self,
        config: SchedulerConfig,
        client: ClientSettings,
        service: ServiceSettings,
        *,
        metrics: SchedulerMetrics | None = None,
    ) -> None:
        self.config = config
        self.client_settings = client
        self.service = service
        self.metrics = metrics or SchedulerMetrics()
        self.state = HealthState(stall_seconds=max(60.0, 20 * config.cycle_period))
        self.stop = asyncio.Event()
        self.cycles = 0
        # Kept across cycles: a fragmentation scorer reuses the node states it measured.
        self.scorers = ScorerMemory()
        self.elector: LeaderElector | None = None
        self.backend: LiveBackend | None = None
        self.cache = Cache(
            config.scheduler_names_served,
            config.default_queue,
            wait_for_pod_grouper=config.pod_grouper,
        )
        self.volcano: VolcanoStatus | None = None
        self.lost_leadership = False
        #: Seconds a gang held on its nodes waits for the pods evicted for it to terminate.
        self.nomination_timeout = config.nomination_timeout
        #: The solver's warm-up (:func:`warm_up`), running in a thread while the watches
        #: list the cluster; the first cycle waits for it.
        self.warming: asyncio.Future[None] | None = None
        #: The snapshot of the last cycle and its number (``GET /debug/snapshot``).
        self.last_cycle: tuple[Snapshot, int] | None = None
        #: The API client, once built (the debug endpoint reviews tokens with it).
        self.api: Any = None
        #: True while a cycle runs (shutdown waits for it; for nothing else).
        self.cycling = False
        self.watcher: Watcher | None = None
        #: The API server URL in use (for logs), once a client exists.
        self.server: str | None = None

    def is_leader(self) -> bool:
        """True when this replica may bind (always, without leader election)."""
        return self.elector is None or self.elector.is_leader()

    def _leadership(self, leading: bool) -> None:
        self.metrics.leader.set(1 if leading else 0)
        if not leading and not self.stop.is_set():
            # See the module docstring: a replica that led and lost the Lease exits.
            log.error("leader_lost_exiting", identity=self.service.identity, cycle=self.cycles)
            self.lost_leadership = True
            self.stop.set()

    def _debug_routes(self) -> dict[str, Any]:
        """``/debug/snapshot`` when the config enables it (see :mod:`scheduler.debug_snapshot`)."""
        if not self.config.debug_snapshot:
            return {}
        from scheduler.debug_snapshot import PATH, SnapshotEndpoint
        from scheduler.snapshotfile import config_to_mapping

        endpoint = SnapshotEndpoint(
            lambda: self.last_cycle, lambda: self.api, config_to_mapping(self.config)
        )
        return {PATH: endpoint.handle}

    def _grace(self, gang: Gang) -> float:
        """A gang's staleness grace: its PodGroup's own value, else the configured default."""
        raw = self.cache.raw("PodGroup", gang.namespace, gang.name) or {}
        value = (raw.get("spec") or {}).get("stalenessGracePeriod")
        if value in (None, ""):
            return self.config.staleness_grace_period
        try:
            return parse_duration(value, "spec.stalenessGracePeriod")
        except SpecError:
            return self.config.staleness_grace_period

    async def serve(self, api: Any = None, *, warm: bool = False) -> int:
        """Run until :attr:`stop` is set (0) or a task fails (1); 2 for bad connection flags
        or a probe port that cannot be bound.

        ``api``: a client already built from the settings (:func:`run` builds it first, so
        bad settings fail before anything starts); else it is built here. ``warm``: start
        the solver's warm-up once the port is bound and the client exists."""
        if api is None:
            try:
                api = await make_api_client(self.client_settings)
            except ClientConfigError as e:
                log.error("client_config_error", error=e.message)
                return 2
        self.api = api
        health = HealthServer(
            self.service.metrics_address, self.state, self.metrics, routes=self._debug_routes()
        )
        try:
            await health.start()
        except OSError as e:
            log.error(
                "cannot_serve_probes",
                address=self.service.metrics_address,
                error=str(e),
                fix="free the port or pass another --metrics-address",
            )
            await api.close()
            return 2
        log.info("serving_probes", address=self.service.metrics_address, port=health.port)
        admission = await self._start_admission()
        if admission is False:
            await health.stop()
            await api.close()
            return 2
        if warm and self.warming is None:
            # Warming up imports OR-Tools and solves once (about a second on a busy core);
            # done in a thread, it overlaps the initial lists, which mostly wait for the API.
            self.warming = asyncio.ensure_future(asyncio.to_thread(warm_up, self.config.placement))
        try:
            return await self._serve(api)
        finally:
            self.state.stopping = True
            if admission is not None and admission is not False:
                await admission.stop()
            await health.stop()
            await api.close()
            self._log_stopped()

    async def _start_admission(self) -> Any:
        """The GPU-sharing admission webhook when configured (None when not; False when it
        cannot serve, which stops the process: pods would be admitted without their env)."""
        settings = self.config.gpu_sharing
        if not settings.webhook_address:
            return None
        from scheduler.admission import AdmissionServer

        server = AdmissionServer(
            settings.webhook_address,
            settings.webhook_cert_file,
            settings.webhook_key_file,
            self.config.scheduler_names_served,
        )
        try:
            await server.start()
        except (OSError, ValueError) as e:
            log.error(
                "cannot_serve_admission_webhook",
                address=settings.webhook_address,
                error=str(e),
                fix="check gpuSharing.webhookCertFile/webhookKeyFile and that the port is free",
            )
            return False
        return server

    def _log_stopped(self) -> None:
        """``stopped``; before the first sync also why: what the API server answered."""
        watcher = self.watcher
        if watcher is None or watcher.synced.is_set():
            log.info("stopped", cycles=self.cycles)
            return
        errors = {k: e for k, e in watcher.errors.items() if e is not None}
        first = next(iter(errors.values()), None)
        log.warning(
            "stopped_before_connecting",
            cycles=self.cycles,
            server=self.server,
            listed=sorted(watcher.listed),
            not_listed=sorted(k.key for k in watcher.kinds if k.key not in watcher.listed),
            error=first.message if first is not None else "no answer yet",
            fix="check that the API server in --kube-config / --kube-api-server is reachable "
            "from here and that its certificate and credentials are accepted",
        )

    async def _serve(self, api: Any) -> int:
        cfg = self.config
        self.server = getattr(getattr(api, "configuration", None), "host", None)
        watcher = Watcher(
            api,
            self.cache,
            (*WATCHED_KINDS, *VOLCANO_KINDS),
            on_restart=lambda kind: self.metrics.watch_restarts.labels(kind=kind).inc(),
        )
        self.watcher = watcher
        writer = Writer(
            api,
            component=cfg.scheduler_name,
            instance=self.service.identity,
            limiter=EventLimiter(interval=cfg.event_interval),
            bind_attempts=cfg.bind_attempts,
            max_in_flight=cfg.max_requests_in_flight,
            may_write=self.is_leader,
        )
        if self.service.leader_elect:
            lease = f"{cfg.leader_election.lease_namespace}/{cfg.leader_election.lease_name}"
            self.elector = LeaderElector(
                api,
                cfg.leader_election,
                self.service.identity,
                on_change=self._leadership,
                on_transitions=lambda n: self.metrics.observe_lease(lease, n),
            )
        else:
            self.metrics.leader.set(1)
        sharing = None
        if cfg.gpu_sharing.enabled:
            sharing = GpuSharing(
                self.cache,
                writer,
                namespace=cfg.gpu_sharing.reservation_namespace,
                is_leader=self.is_leader,
                scaling=cfg.gpu_sharing.scaling_pods,
                scheduler_name=cfg.scheduler_name,
            )
        backend = LiveBackend(
            self.cache,
            writer,
            is_leader=self.is_leader,
            metrics=self.metrics,
            grace=self._grace,
            nomination_timeout=self.nomination_timeout,
            sharing=sharing,
        )
        self.backend = backend
        self.volcano = VolcanoStatus(self.cache, writer)
        tasks: dict[str, asyncio.Task[Any]] = {
            "watch": asyncio.create_task(watcher.run(), name="watch"),
            "cycle": asyncio.create_task(self._cycle_loop(watcher, backend), name="cycle"),
            "loop-lag": asyncio.create_task(self._watch_loop_lag(), name="loop-lag"),
        }
        if self.elector is not None:
            tasks["lease"] = asyncio.create_task(self.elector.run(self.stop), name="lease")
        if sharing is not None:
            tasks["gpu-reservations"] = asyncio.create_task(
                self._collect_reservations(watcher, sharing), name="gpu-reservations"
            )
        stopper = asyncio.create_task(self.stop.wait(), name="stop")
        code = 0
        try:
            done, _ = await asyncio.wait(
                [stopper, *tasks.values()], return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                error = None if task.cancelled() else task.exception()
                if task is stopper or (self.stop.is_set() and error is None):
                    continue  # a task that ended because we are stopping is no failure
                code = 1
                log.error(
                    "task_ended_unexpectedly",
                    task=task.get_name(),
                    error=repr(error) if error else "returned",
                )
        finally:
            self.stop.set()
            self.state.stopping = True
            await self._shutdown(tasks, stopper)
        return 1 if self.lost_leadership else code

    async def _collect_reservations(self, watcher: Watcher, sharing: GpuSharing) -> None:
        """Reservation pod garbage collection, once the cache shows the whole cluster."""
        await watcher.synced.wait()
        await sharing.run(self.stop, self.config.gpu_sharing.collect_interval)

    async def _shutdown(
        self, tasks: dict[str, asyncio.Task[Any]], stopper: asyncio.Task[Any]
    ) -> None:
        cycle = tasks.get("cycle")
        if cycle is not None and not cycle.done() and self.cycling:
            # Only a cycle under way is waited for (its binds are a transaction per gang);
            # a loop still waiting for the first sync or the next trigger is just cancelled.
            with contextlib.suppress(TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(cycle), timeout=_SHUTDOWN_GRACE)
        if self.backend is not None:
            # Status writes in flight finish while the client is still open.
            with contextlib.suppress(TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(self.backend.flush(), timeout=5.0)
        lease = tasks.get("lease")
        if lease is not None and not lease.done():
            # run() sees stop and releases the Lease itself; give it a moment.
            with contextlib.suppress(TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(lease), timeout=5.0)
        for task in [*tasks.values(), stopper]:
            task.cancel()
        await asyncio.gather(*tasks.values(), stopper, return_exceptions=True)

    async def _watch_loop_lag(self, interval: float = 0.05) -> None:
        """Measure how late the loop wakes up; warn when it stalled past 100 ms.

        ``cpu_seconds`` in the warning is this process's CPU time over the stalled interval
        (all threads): near ``seconds`` means our own work held the loop, near zero means the
        machine did not give the process CPU time.
        """
        loop = asyncio.get_running_loop()
        while not self.stop.is_set():
            before, cpu_before = loop.time(), time.process_time()
            await asyncio.sleep(interval)
            lag = max(0.0, loop.time() - before - interval)
            self.metrics.loop_lag.observe(lag)
            if lag > 0.1:
                log.warning(
                    "event_loop_stalled",
                    seconds=round(lag, 3),
                    cpu_seconds=round(time.process_time() - cpu_before, 3),
                    cycle=self.cycles,
                )

    async def _wait_trigger(self, pending: asyncio.Event) -> None:
        """Until the period passes, new pending work arrives (then debounce), or stop."""
        waiters = [
            asyncio.create_task(pending.wait()),
            asyncio.create_task(self.stop.wait()),
        ]
        try:
            done, _ = await asyncio.wait(
                waiters, timeout=self.config.cycle_period, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for w in waiters:
                w.cancel()
        if waiters[0] in done and not self.stop.is_set():
            # A burst of new pods (a Deployment scaling up) becomes one cycle, not many.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), timeout=self.config.debounce)

    async def _cycle_loop(self, watcher: Watcher, backend: LiveBackend) -> None:
        await watcher.synced.wait()
        if self.warming is not None:
            await self.warming
        # Everything listed so far (tens of thousands of parsed pods and nodes) lives as long
        # as the process: move it out of the collector's generations, so full collections do
        # not walk it again and again (measured as 1 s pauses at 50,000 pods).
        gc.collect()
        gc.freeze()
        self.state.ready = True
        self.state.tick()
        log.info("cache_synced", counts=self.cache.counts())
        failures = 0
        while not self.stop.is_set():
            self.state.tick()
            if self.is_leader():
                self.cache.pending_changed.clear()
                self.cycles += 1
                # The backend makes a new status publisher when leadership changes hands.
                backend.status.volcano = self.volcano
                self.cycling = True
                # The first cycle takes a bounded bite of a backlog (firstCycleMaxGangs).
                budget = self.config.first_cycle_max_gangs if self.cycles == 1 else 0
                try:
                    report = await run_cycle(
                        backend,
                        self.config.placement,
                        self.cycles,
                        max_gangs=budget or None,
                        scorers=self.scorers,
                    )
                except Exception:
                    # One bad cycle (a bug tripped by unusual input) must not stop scheduling;
                    # a bug that trips every cycle must not be hidden either.
                    failures += 1
                    log.exception("cycle_failed", cycle=self.cycles, consecutive=failures)
                    if failures >= _MAX_CYCLE_FAILURES:
                        raise
                else:
                    failures = 0
                    self.last_cycle = (report.snapshot, self.cycles)
                    log.debug(
                        "cycle_timings",
                        cycle=self.cycles,
                        **{k: round(v, 4) for k, v in report.timings.items()},
                    )
                    self.metrics.observe_report(report)
                    self.metrics.binds_in_flight.set(backend.binds_in_flight)
                    self.metrics.assumed_pods.set(len(self.cache.assumed()))
                    self.metrics.nominated_pods.set(len(self.cache.nominated()))
                    if report.placement.deferred:
                        self.cache.pending_changed.set()  # the rest of the backlog: next
                finally:
                    self.cycling = False
            await self._wait_trigger(self.cache.pending_changed)


def _install_signals(stop: asyncio.Event) -> Callable[[], None]:
    loop = asyncio.get_running_loop()
    installed = []

    def on_signal(sig: signal.Signals) -> None:
        log.info("stop_requested", signal=sig.name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)

    def remove() -> None:
        for sig in installed:
            loop.remove_signal_handler(sig)

    return remove


async def run(config: SchedulerConfig, client: ClientSettings, service: ServiceSettings) -> int:
    """Run a scheduler replica until SIGTERM; the process exit code (2 at once, before any
    port is bound or solve started, when the connection settings cannot be used)."""
    started = time.monotonic()
    try:
        api = await make_api_client(client)
    except ClientConfigError as e:
        log.error("client_config_error", error=e.message)
        print(f"kai-scheduler: {e.message}", file=sys.stderr)
        return 2
    scheduler = Scheduler(config, client, service)
    log.info(
        "starting",
        scheduler_names=list(config.scheduler_names_served),
        leader_elect=service.leader_elect,
        identity=service.identity,
        cycle_period=config.cycle_period,
        gpu_strategy=config.placement.gpu_strategy,
        cpu_strategy=config.placement.cpu_strategy,
    )
    remove = _install_signals(scheduler.stop)
    try:
        code = await scheduler.serve(api, warm=True)
    finally:
        remove()
    log.info("exiting", code=code, seconds=round(time.monotonic() - started, 1))
    return code
