"""One chaos run: a gang stream, seeded faults, and the invariant checker watching throughout.

Used by the CI test (``tests/e2e/test_chaos.py``: every fault kind once, about 90 s) and by
the long run (``python -m tests.chaos --minutes 10 --seed S``); the code is the same, only
the :class:`ChaosSettings` differ.

Set-up: the scheduler runs as a process whose kubeconfig points at a :class:`TcpRelay` in
front of kube-apiserver; a :class:`BindingWebhook` denies a share of binds; the checker's
:class:`Observer` watches the API server directly. Then, for ``duration`` seconds, gangs
arrive and leave while the planned faults fire one after another. Then faults stop (the
relay forwards, binds are no longer denied), no new gangs arrive, and every gang must be
bound within ``drain_timeout`` (``eventually_bound``). The report carries the faults
injected by kind, bind and eviction counts, pod outcomes and every violation, each with the
scheduler's log lines that name the pods involved.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import time
import urllib.parse
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from testenv import ControlPlane
from testenv.chaos import AdmissionRecord, BindingWebhook, TcpRelay
from tests.chaos.api import ApiError, KubeApi
from tests.chaos.cluster import install_kai, relay_kubeconfig, wait_webhook_live
from tests.chaos.evidence import log_evidence, log_levels, repeated_binds
from tests.chaos.invariants import Invariant, InvariantChecker, Violation
from tests.chaos.observer import Observer
from tests.chaos.plan import Fault, FaultKind, estimated_length, plan_faults
from tests.chaos.workload import GangStream, StreamSettings
from tests.e2e.scheduler_process import TEST_CONFIG, SchedulerProcess

__all__ = [
    "ChaosEnv",
    "ChaosReport",
    "ChaosSettings",
    "EventLog",
    "install_kai",
    "run_chaos",
    "run_chaos_sync",
]

#: A connection whose client sent nothing for this long counts as a watch (WATCH_FREEZE).
WATCH_IDLE_SECONDS = 3.0
_WEBHOOK_PATH = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


@dataclass(frozen=True)
class ChaosSettings:
    """Length and intensity of a run; every random choice derives from ``seed``."""

    seed: int = 1
    #: Seconds of gang stream with faults.
    duration: float = 75.0
    #: Seconds, after faults stop, for every gang to be bound (and deleted).
    drain_timeout: float = 60.0
    #: Mean seconds of calm between faults.
    mean_fault_gap: float = 8.0
    #: Overrides of the (shortest, longest) seconds per fault kind (see tests/chaos/plan.py).
    fault_seconds: Mapping[FaultKind, tuple[float, float]] = field(default_factory=dict)
    #: Seconds without faults at the start.
    warmup: float = 8.0
    #: Share of binds the webhook denies while faults run.
    bind_failure_rate: float = 0.05
    #: Extra seconds a gang may stay below minMember past its grace period, on top of the
    #: longest fault of the plan (the scheduler cannot act while it is dead or blind): cycles,
    #: watch back-off, and a restarted scheduler timing the gang afresh.
    gang_slack: float = 20.0
    #: The gang stream's shape (grace period, lifetimes, waiting gangs).
    stream: StreamSettings = field(default_factory=StreamSettings)
    #: Keys merged over the e2e TEST_CONFIG for the scheduler's config file.
    scheduler_config: Mapping[str, Any] = field(default_factory=dict)

    def with_seed(self, seed: int) -> ChaosSettings:
        """The same settings with another seed."""
        return replace(self, seed=seed)


@dataclass(frozen=True)
class ChaosEnv:
    """What a run needs from the cluster around it."""

    cp: ControlPlane
    #: Kubeconfig of the scheduler's ServiceAccount (the run points a copy at the relay).
    scheduler_kubeconfig: Path
    namespace: str
    nodes: tuple[str, ...]
    node_selector: Mapping[str, str]
    workdir: Path
    #: Where the event log and the scheduler's log are kept.
    log_dir: Path


@dataclass
class ChaosReport:
    """The outcome of a run: a JSON summary and the violations."""

    summary: dict[str, Any]
    violations: list[Violation]

    @property
    def ok(self) -> bool:
        """No violation was recorded."""
        return not self.violations

    def to_json(self) -> str:
        """The summary as indented JSON."""
        return json.dumps(self.summary, indent=2, sort_keys=False, default=str)


class EventLog:
    """JSON lines of what the run did (plan, faults, gangs), with seconds since the start."""

    def __init__(self, path: Path, started: float, *, echo: TextIO | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.started = started
        self._file = path.open("w")
        self._echo = echo

    def emit(self, event: str, **fields: Any) -> None:
        """Write one event."""
        line = json.dumps(
            {"t": round(time.monotonic() - self.started, 3), "event": event, **fields},
            default=str,
        )
        self._file.write(line + "\n")
        self._file.flush()
        if self._echo is not None and not event.startswith("gang_") and event != "member_replaced":
            print(line, file=self._echo, flush=True)

    def close(self) -> None:
        """Close the file."""
        self._file.close()


class _Scheduler:
    """The scheduler process, restarted by faults and after unexpected exits."""

    def __init__(self, proc: SchedulerProcess, log: EventLog) -> None:
        self.proc = proc
        self.log = log
        self.starts = 0
        self.expected_down = False
        self.unexpected_exits: list[dict[str, Any]] = []

    async def start(self) -> None:
        self.proc.start()
        self.starts += 1
        await self.wait_ready()

    async def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, _ = await asyncio.to_thread(self.proc.get, "/readyz", 1.0)
            if status == 200:
                return
            if not self.proc.running():
                return  # the supervisor records and restarts it
            await asyncio.sleep(0.2)
        raise AssertionError(f"the scheduler was not ready in {timeout}s:\n{self.proc.log_tail()}")

    async def kill_and_restart(self, down: float) -> dict[str, Any]:
        self.expected_down = True
        try:
            await asyncio.to_thread(self.proc.kill)
            await asyncio.sleep(down)
            began = time.monotonic()
            await self.start()
            return {"ready_after": round(time.monotonic() - began, 2)}
        finally:
            self.expected_down = False

    async def supervise(self) -> None:
        """Restart the scheduler if it exits on its own (that is recorded as a finding)."""
        while True:
            await asyncio.sleep(0.5)
            if self.expected_down or self.proc.running():
                continue
            code = self.proc.proc.returncode if self.proc.proc is not None else None
            exit_info = {"code": code, "log_tail": self.proc.log_tail(30)}
            self.unexpected_exits.append(exit_info)
            self.log.emit("scheduler_exited_unexpectedly", code=code)
            await self.start()


async def run_chaos(
    env: ChaosEnv, settings: ChaosSettings, *, echo: TextIO | None = None
) -> ChaosReport:
    """Run one chaos run (module docstring) and return its report. Never raises for a
    violation; raises only when the harness itself cannot run (e.g. the scheduler never
    becomes ready)."""
    started = time.monotonic()
    seed = settings.seed
    env.log_dir.mkdir(parents=True, exist_ok=True)
    log = EventLog(env.log_dir / f"chaos-seed{seed}.jsonl", started, echo=echo)
    plan = plan_faults(
        seed, settings.duration, warmup=settings.warmup, mean_gap=settings.mean_fault_gap,
        seconds=settings.fault_seconds,
    )  # fmt: skip
    log.emit(
        "plan", seed=seed, duration=settings.duration,
        estimated_seconds=round(estimated_length(plan), 1), faults=[f.to_json() for f in plan],
    )  # fmt: skip
    longest = max((estimated_length([replace(f, after=0.0)]) for f in plan), default=0.0)
    checker = InvariantChecker(
        namespaces=[env.namespace],
        nodes=env.nodes,
        default_grace=60.0,
        gang_slack=settings.gang_slack + longest,
    )
    api = KubeApi(env.cp.server, env.cp.admin_token, env.cp.ca_file)

    bind_admitted = asyncio.Event()

    def admitted(record: AdmissionRecord) -> None:
        # Arms a watch freeze: a pod that will still run when the freeze ends is being bound.
        lifetime = stream.lifetime_of(record.name)
        if record.subresource == "binding" and (lifetime or 0.0) > longest:
            bind_admitted.set()
        if record.subresource == "eviction":
            checker.mark_evicted(record.namespace, record.name)
            log.emit("evicted", pod=record.name)

    webhook = BindingWebhook(
        env.namespace, env.workdir, deny_rate=settings.bind_failure_rate, seed=seed,
        on_admit=admitted,
    )  # fmt: skip
    api_url = urllib.parse.urlsplit(env.cp.server)
    relay = TcpRelay(api_url.hostname or "127.0.0.1", api_url.port or 443)
    observer = Observer(api, checker, started=started)
    stream = GangStream(
        api, checker, env.namespace, env.node_selector, seed=seed, settings=settings.stream,
        log=log.emit,
    )  # fmt: skip
    injected: list[dict[str, Any]] = []
    stuck: list[dict[str, Any]] = []
    sched: _Scheduler | None = None
    tasks: list[asyncio.Task[None]] = []
    webhook_info: dict[str, Any] = {}
    violations: list[Violation] = []
    stop = asyncio.Event()
    try:
        await webhook.start()
        await relay.start()
        await api.request("POST", _WEBHOOK_PATH, body=webhook.configuration())
        webhook_info = await wait_webhook_live(api, env.namespace)
        log.emit("webhook_live", **webhook_info)
        observer.start()
        await asyncio.wait_for(observer.synced.wait(), timeout=60)
        kubeconfig = relay_kubeconfig(
            env.scheduler_kubeconfig, relay.url, env.workdir / "scheduler-via-relay.kubeconfig"
        )
        config = {**TEST_CONFIG, **settings.scheduler_config}
        proc = SchedulerProcess(
            kubeconfig, config=config, name=f"chaos-seed{seed}", workdir=env.workdir
        )
        sched = _Scheduler(proc, log)
        await sched.start()
        log.emit("scheduler_ready", relay=relay.url)
        tasks = [
            asyncio.create_task(stream.run(stop), name="stream"),
            asyncio.create_task(sched.supervise(), name="supervise"),
        ]
        faults_from = time.monotonic()
        for fault in plan:
            await asyncio.sleep(fault.after)
            injected.append(await _inject(fault, sched, relay, env.cp, started, log, bind_admitted))
        # The plan starts counting after set-up (webhook, scheduler start).
        remaining = settings.duration - (time.monotonic() - faults_from)
        if remaining > 0:
            await asyncio.sleep(remaining)
        # Faults stop: everything must settle now.
        relay.resume()
        webhook.deny_rate = 0.0
        stop.set()
        await tasks[0]
        log.emit(
            "drain_started", gangs_left=stream.stats.gangs_created - stream.stats.gangs_retired
        )
        stuck = await stream.drain(settings.drain_timeout)
        if stuck:
            checker.record(
                Invariant.EVENTUALLY_BOUND,
                observer.now(),
                f"namespace/{env.namespace}",
                f"{len(stuck)} gang(s) still not bound {settings.drain_timeout:g}s after the "
                "faults stopped (every gang fits the empty cluster)",
                {"gangs": stuck[:20]},
            )
        violations = checker.finish(observer.now())
        log.emit("finished", violations=len(violations))
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(ApiError):
            await api.request("DELETE", f"{_WEBHOOK_PATH}/{webhook.name}")
        await stream.delete_all()
        if sched is not None:
            await asyncio.to_thread(sched.proc.stop)
        await observer.stop()
        await relay.close()
        await webhook.close()
        await api.close()
        log.close()
    scheduler_log = env.log_dir / f"{sched.proc.name}.log" if sched is not None else None
    log_text = ""
    if sched is not None and scheduler_log is not None:
        shutil.copyfile(sched.proc.log_path, scheduler_log)
        log_text = sched.proc.log_text()
    summary = {
        "seed": seed,
        "duration_seconds": settings.duration,
        "runtime_seconds": round(time.monotonic() - started, 1),
        "faults": {
            "by_kind": dict(Counter(str(f["kind"]) for f in injected)),
            "injected": injected,
        },
        "binds": {
            "allowed": webhook.counts.binds_allowed,
            "denied": webhook.counts.binds_denied,
            "denied_by_code": {str(k): v for k, v in webhook.counts.denied_by_code.items()},
            "webhook_probe": webhook_info,
        },
        # A second admitted bind of one pod is not a violation (the API refuses it with 409,
        # and a retry after a lost answer does the same), but it shows the scheduler acting on
        # a stale view: worth a look when it is more than the faults explain.
        "repeated_bind_requests": repeated_binds(webhook.records),
        "evictions": webhook.counts.evictions,
        "gang_slack_seconds": round(checker.gang_slack, 1),
        "relay": asdict(relay.stats),
        "stream": asdict(stream.stats),
        "pods": {
            "bound": checker.bound_count(),
            "reported_while_waiting": len(checker.reported),
            "ended": checker.outcomes(),
        },
        "peak_use": {
            r: f"{float(checker.peak[r]):.1f}/{float(cap):.1f}"
            for r, cap in checker.capacity().items()
            if r != "memory"
        },
        "scheduler": {
            "starts": sched.starts if sched else 0,
            "unexpected_exits": sched.unexpected_exits if sched else [],
            "log_events": log_levels(log_text),
            "log": str(scheduler_log),
        },
        "observer": asdict(observer.stats),
        "event_log": str(log.path),
        "not_drained": stuck,
        "violation_counts": dict(checker.counts),
        "violations": [
            {**v.to_json(), "scheduler_log": log_evidence(log_text, v)} for v in violations
        ],
    }
    return ChaosReport(summary, violations)


async def _inject(
    fault: Fault,
    sched: _Scheduler,
    relay: TcpRelay,
    cp: ControlPlane,
    started: float,
    log: EventLog,
    bind_admitted: asyncio.Event,
) -> dict[str, Any]:
    """Inject one fault and wait until it is over (the scheduler back, the API up)."""
    if fault.kind is FaultKind.WATCH_FREEZE:
        # The unlucky moment: a bind is being admitted, so the watch event that would confirm
        # it is held back by the freeze while the scheduler goes on believing its assumption,
        # and the pod outlives the freeze, so a scheduler that forgot it meets it again.
        bind_admitted.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(bind_admitted.wait(), timeout=20.0)
    at = time.monotonic() - started
    log.emit("fault_start", kind=str(fault.kind), seconds=fault.seconds)
    detail: dict[str, Any] = {}
    if fault.kind is FaultKind.SCHEDULER_KILL:
        detail = await sched.kill_and_restart(fault.seconds)
    elif fault.kind is FaultKind.APISERVER_RESTART:
        await asyncio.to_thread(cp.restart_apiserver, fault.seconds)
    elif fault.kind is FaultKind.WATCH_CUT:
        detail = {"connections_cut": relay.cut()}
    elif fault.kind is FaultKind.RELAY_STALL:
        detail = {"open_connections": relay.open_connections}
        relay.stall(fault.seconds)
        await asyncio.sleep(fault.seconds)
    elif fault.kind is FaultKind.WATCH_FREEZE:
        # Only connections whose client has been quiet: the watches, not the request pool.
        frozen = relay.freeze(fault.seconds, client_idle=WATCH_IDLE_SECONDS)
        detail = {"connections_frozen": frozen, "open_connections": relay.open_connections}
        await asyncio.sleep(fault.seconds)
    took = round(time.monotonic() - started - at, 2)
    log.emit("fault_end", kind=str(fault.kind), took=took, **detail)
    return {**fault.to_json(), "started": round(at, 2), "took": took, **detail}


def run_chaos_sync(
    env: ChaosEnv, settings: ChaosSettings, *, echo: TextIO | None = None
) -> ChaosReport:
    """:func:`run_chaos` on a fresh event loop (for synchronous tests and the CLI)."""
    return asyncio.run(run_chaos(env, settings, echo=echo))
