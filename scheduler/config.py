"""Scheduler settings: the YAML config file (``--config``) and the command-line flags.

Settings are dataclasses grouped by concern. The config file uses the camelCase keys of the
shipped ConfigMap (``manifests/30-configmap.yaml``)::

    placement: {gpu: binpack, cpu: spread}
    schedulerNames: [kai-scheduler, volcano]   # or schedulerName: kai-scheduler
    cyclePeriod: 1s
    solverTimeLimit: 0.5s
    defaultQueue: default-queue
    stalenessGracePeriod: 60s

An unknown key, a wrong type or a bad value raises :class:`ConfigError` naming the key and what
to write instead, so a typo never silently falls back to a default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import yaml

from scheduler.cluster.queuespec import SpecError, parse_duration
from scheduler.solver.placement import PlacementSettings, Scoring, Strategy

__all__ = [
    "ConfigError",
    "GpuSharingSettings",
    "LeaderElectionSettings",
    "SchedulerConfig",
    "ServiceSettings",
    "load_config",
    "parse_config",
]

_STRATEGIES: tuple[Strategy, ...] = ("binpack", "spread")
_SCORINGS: tuple[Scoring, ...] = ("packing", "fragmentation")


class ConfigError(ValueError):
    """The config file (or a flag) has a value the scheduler cannot use."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


@dataclass(frozen=True)
class LeaderElectionSettings:
    """Timing and identity of the coordination.k8s.io Lease used for leader election."""

    #: Name of the Lease object.
    lease_name: str = "kai-scheduler"
    #: Namespace of the Lease (the Role in manifests/ grants Leases only there).
    lease_namespace: str = "kai-scheduler"
    #: How long a leader's claim lasts without renewal; others wait this long to take over.
    lease_duration: float = 15.0
    #: The leader gives up if it cannot renew for this long (must be below lease_duration).
    renew_deadline: float = 10.0
    #: How often the leader renews and candidates retry.
    retry_period: float = 2.0


@dataclass(frozen=True)
class GpuSharingSettings:
    """GPU sharing that reaches the container (see docs/gpu-sharing.md)."""

    #: Hold each shared device with a reservation pod and write each sharer's device
    #: ConfigMap at bind (the chart turns it on; off, fractional pods are bookkeeping only).
    enabled: bool = False
    #: Namespace of the reservation pods (the chart creates it and grants pods there).
    reservation_namespace: str = "kai-resource-reservation"
    #: Seconds between garbage-collection passes over the reservation pods.
    collect_interval: float = 2.0
    #: ``host:port`` the admission webhook listens on with TLS ("" = no webhook).
    webhook_address: str = ""
    #: PEM certificate and key the webhook serves (the chart mounts them from a Secret).
    webhook_cert_file: str = ""
    webhook_key_file: str = ""
    #: Show sharing demand no node has room for to autoscalers as whole-GPU scaling pods.
    scaling_pods: bool = False


@dataclass(frozen=True)
class SchedulerConfig:
    """Everything the config file can set, with the defaults of the shipped ConfigMap."""

    #: Pods with this spec.schedulerName are ours; also the name Events are reported by.
    scheduler_name: str = "kai-scheduler"
    #: More names whose pods are ours too (``schedulerNames``, ``--scheduler-name`` given more
    #: than once), e.g. ``volcano`` to take over from Volcano's scheduler without editing
    #: jobs. See :attr:`scheduler_names_served`.
    scheduler_names: tuple[str, ...] = ()
    #: GPU/CPU binpack|spread, solver time limit and workers.
    placement: PlacementSettings = field(default_factory=PlacementSettings)
    #: Seconds between cycles when nothing new arrives.
    cycle_period: float = 1.0
    #: New pending work starts a cycle after this quiet time (batches bursts of pods).
    debounce: float = 0.05
    #: Queue for pods and PodGroups that name none.
    default_queue: str = "default-queue"
    #: Seconds a partly bound gang keeps its resources before its members are evicted.
    staleness_grace_period: float = 60.0
    #: Attempts per bind before the pod's bind is given up for this cycle.
    bind_attempts: int = 3
    #: API requests (binds, status writes, Events) in flight at once; binds stream in the
    #: background, so this bounds how fast a backlog is bound and how hard the API is hit.
    max_requests_in_flight: int = 64
    #: Gangs the first cycle after start considers (in admission order; 0: all). After a
    #: restart or a failover the backlog can be thousands of gangs; solving them all before
    #: the first bind would hold every bind back by that solve. The rest are taken by the
    #: next cycle, which starts at once while the first binds stream.
    first_cycle_max_gangs: int = 1000
    #: The same Event (object, reason, message) is sent at most once per this many seconds.
    event_interval: float = 60.0
    #: Seconds a gang held on its nodes (nominated) waits for the pods evicted for it to
    #: terminate before the hold is dropped and the gang is planned again.
    nomination_timeout: float = 120.0
    #: A pod grouper runs (``kai-scheduler podgrouper``): pending pods that name no PodGroup
    #: wait for it instead of being scheduled alone (the shipped manifests turn this on).
    pod_grouper: bool = False
    #: Leader election timing.
    leader_election: LeaderElectionSettings = field(default_factory=LeaderElectionSettings)
    #: Reservation pods, device ConfigMaps and the admission webhook (docs/gpu-sharing.md).
    gpu_sharing: GpuSharingSettings = field(default_factory=GpuSharingSettings)
    #: Serve ``GET /debug/snapshot`` (the last cycle's snapshot) on the metrics port to callers
    #: whose bearer token the API server authorises for it (``debugSnapshot``, see
    #: :mod:`scheduler.debug_snapshot`).
    debug_snapshot: bool = False

    @property
    def scheduler_names_served(self) -> tuple[str, ...]:
        """Every spec.schedulerName served: :attr:`scheduler_name` first, then the others."""
        return tuple(dict.fromkeys((self.scheduler_name, *self.scheduler_names)))


@dataclass(frozen=True)
class ServiceSettings:
    """The process around the cycle: leadership, probes, identity."""

    #: Take part in leader election; only the leader binds.
    leader_elect: bool = False
    #: Where /healthz, /readyz and /metrics are served (``:8080``, ``127.0.0.1:0``).
    metrics_address: str = ":8080"
    #: This replica's name in the Lease (defaults to POD_NAME or host name plus a suffix).
    identity: str = ""


def _duration(raw: Any, key: str, *, positive: bool = True) -> float:
    try:
        value = parse_duration(raw, key)
    except SpecError as e:
        raise ConfigError(key, e.message) from e
    if positive and value <= 0:
        raise ConfigError(key, f"{raw!r} must be a positive duration such as 1s or 500ms")
    return value


def _max_wait(raw: Any, key: str) -> float:
    value = _duration(raw, key, positive=False)
    if value < 0:
        raise ConfigError(key, f"{raw!r} must be a duration such as 15m, or 0 for no limit")
    return value


def _string(raw: Any, key: str) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise ConfigError(key, f"{raw!r} must be a non-empty string")
    return raw.strip()


def _int(raw: Any, key: str, minimum: int) -> int:
    if not isinstance(raw, int) or isinstance(raw, bool) or raw < minimum:
        raise ConfigError(key, f"{raw!r} must be a whole number >= {minimum}")
    return raw


def _weight(raw: Any, key: str) -> float:
    if not isinstance(raw, int | float) or isinstance(raw, bool) or not 0 <= raw < 1e6:
        raise ConfigError(key, f"{raw!r} must be a number >= 0 (0 turns it off)")
    return float(raw)


def _bool(raw: Any, key: str) -> bool:
    if not isinstance(raw, bool):
        raise ConfigError(key, f"{raw!r} must be true or false")
    return raw


def _names(raw: Any, key: str) -> tuple[str, ...]:
    if isinstance(raw, str) or not isinstance(raw, list) or not raw:
        raise ConfigError(key, f"{raw!r} must be a non-empty list of scheduler names")
    return tuple(dict.fromkeys(_string(v, f"{key}[{i}]") for i, v in enumerate(raw)))


def _mapping(raw: Any, key: str) -> Mapping[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(key, f"must be a mapping of keys to values, got {type(raw).__name__}")
    return cast(Mapping[str, Any], raw)


def _check_keys(data: Mapping[str, Any], allowed: Mapping[str, object], prefix: str) -> None:
    for key in data:
        if key not in allowed:
            known = ", ".join(sorted(allowed))
            raise ConfigError(f"{prefix}{key}", f"unknown key; remove it or use one of: {known}")


def _strategy(raw: Any, key: str) -> Strategy:
    if raw not in _STRATEGIES:
        raise ConfigError(key, f"{raw!r} must be binpack or spread")
    return cast(Strategy, raw)


def _scoring(raw: Any, key: str) -> Scoring:
    if raw not in _SCORINGS:
        raise ConfigError(key, f"{raw!r} must be packing or fragmentation")
    return cast(Scoring, raw)


def _placement(raw: Any, base: PlacementSettings) -> PlacementSettings:
    data = _mapping(raw, "placement")
    parsers: dict[str, Callable[[Any, str], Any]] = {
        "gpu": _strategy,
        "cpu": _strategy,
        "scoring": _scoring,
        "holdStrandingShares": _bool,
        "holdStrandingMaxWait": _max_wait,
        "sharePriceWeight": _weight,
        "solverWorkers": lambda v, k: _int(v, k, 1),
        "greedyOnly": _bool,
        "takeBack": _bool,
        "consolidationMaxPods": lambda v, k: _int(v, k, 0),
        "takeBackGangs": lambda v, k: _int(v, k, 0),
    }
    _check_keys(data, parsers, "placement.")
    names = {
        "gpu": "gpu_strategy",
        "cpu": "cpu_strategy",
        "scoring": "scoring",
        "holdStrandingShares": "hold_stranding_shares",
        "holdStrandingMaxWait": "hold_stranding_max_wait",
        "sharePriceWeight": "share_price_weight",
        "solverWorkers": "workers",
        "greedyOnly": "greedy_only",
        "takeBack": "take_back",
        "consolidationMaxPods": "consolidation_max_pods",
        "takeBackGangs": "take_back_gangs",
    }
    changes = {names[k]: parsers[k](v, f"placement.{k}") for k, v in data.items()}
    out = replace(base, **changes)
    if out.hold_stranding_shares and out.scoring != "fragmentation":
        # The guard reads the fragmentation scorer's mix: with packing it would do nothing.
        raise ConfigError(
            "placement.holdStrandingShares",
            "needs placement.scoring: fragmentation (it judges a device's remainder by the "
            "workload mix that scoring measures); set scoring or remove the key",
        )
    return out


def _leader_election(raw: Any, base: LeaderElectionSettings) -> LeaderElectionSettings:
    data = _mapping(raw, "leaderElection")
    parsers: dict[str, tuple[str, Callable[[Any, str], Any]]] = {
        "leaseName": ("lease_name", _string),
        "leaseNamespace": ("lease_namespace", _string),
        "leaseDuration": ("lease_duration", _duration),
        "renewDeadline": ("renew_deadline", _duration),
        "retryPeriod": ("retry_period", _duration),
    }
    _check_keys(data, parsers, "leaderElection.")
    changes = {parsers[k][0]: parsers[k][1](v, f"leaderElection.{k}") for k, v in data.items()}
    out = replace(base, **changes)
    if out.renew_deadline >= out.lease_duration:
        raise ConfigError(
            "leaderElection.renewDeadline",
            f"{out.renew_deadline}s must be below leaseDuration ({out.lease_duration}s)",
        )
    if out.retry_period >= out.renew_deadline:
        raise ConfigError(
            "leaderElection.retryPeriod",
            f"{out.retry_period}s must be below renewDeadline ({out.renew_deadline}s)",
        )
    return out


def _gpu_sharing(raw: Any, base: GpuSharingSettings) -> GpuSharingSettings:
    data = _mapping(raw, "gpuSharing")
    parsers: dict[str, tuple[str, Callable[[Any, str], Any]]] = {
        "enabled": ("enabled", _bool),
        "reservationNamespace": ("reservation_namespace", _string),
        "collectInterval": ("collect_interval", _duration),
        "webhookAddress": ("webhook_address", _string),
        "webhookCertFile": ("webhook_cert_file", _string),
        "webhookKeyFile": ("webhook_key_file", _string),
        "scalingPods": ("scaling_pods", _bool),
    }
    _check_keys(data, parsers, "gpuSharing.")
    changes = {parsers[k][0]: parsers[k][1](v, f"gpuSharing.{k}") for k, v in data.items()}
    out = replace(base, **changes)
    if out.webhook_address and not (out.webhook_cert_file and out.webhook_key_file):
        raise ConfigError(
            "gpuSharing.webhookAddress",
            "the webhook serves TLS only: set webhookCertFile and webhookKeyFile too",
        )
    return out


def parse_config(data: Any, base: SchedulerConfig | None = None) -> SchedulerConfig:
    """Config from parsed YAML (a mapping, or None for an empty file)."""
    cfg = base or SchedulerConfig()
    top = _mapping(data, "config")
    simple: dict[str, tuple[str, Callable[[Any, str], Any]]] = {
        "schedulerName": ("scheduler_name", _string),
        "schedulerNames": ("scheduler_names", _names),
        "cyclePeriod": ("cycle_period", _duration),
        "debounce": ("debounce", lambda v, k: _duration(v, k, positive=False)),
        "defaultQueue": ("default_queue", _string),
        "stalenessGracePeriod": (
            "staleness_grace_period",
            lambda v, k: _duration(v, k, positive=False),
        ),
        "bindAttempts": ("bind_attempts", lambda v, k: _int(v, k, 1)),
        "maxRequestsInFlight": ("max_requests_in_flight", lambda v, k: _int(v, k, 1)),
        "firstCycleMaxGangs": ("first_cycle_max_gangs", lambda v, k: _int(v, k, 0)),
        "eventInterval": ("event_interval", lambda v, k: _duration(v, k, positive=False)),
        "nominationTimeout": ("nomination_timeout", _duration),
        "podGrouper": ("pod_grouper", _bool),
        "debugSnapshot": ("debug_snapshot", _bool),
    }
    nested = ("placement", "solverTimeLimit", "leaderElection", "gpuSharing")
    _check_keys(top, {**simple, **dict.fromkeys(nested)}, "")
    changes: dict[str, Any] = {}
    for key, value in top.items():
        if key in simple:
            attr, parse = simple[key]
            changes[attr] = parse(value, key)
    if "schedulerNames" in top:
        if "schedulerName" in top:
            raise ConfigError("schedulerNames", "give schedulerName or schedulerNames, not both")
        changes["scheduler_name"] = changes["scheduler_names"][0]
    placement = cfg.placement
    if "placement" in top:
        placement = _placement(top["placement"], placement)
    if "solverTimeLimit" in top:
        placement = replace(
            placement, time_limit_seconds=_duration(top["solverTimeLimit"], "solverTimeLimit")
        )
    changes["placement"] = placement
    if "leaderElection" in top:
        changes["leader_election"] = _leader_election(top["leaderElection"], cfg.leader_election)
    if "gpuSharing" in top:
        changes["gpu_sharing"] = _gpu_sharing(top["gpuSharing"], cfg.gpu_sharing)
    return replace(cfg, **changes)


def load_config(path: str | Path | None, base: SchedulerConfig | None = None) -> SchedulerConfig:
    """Read the YAML config file at ``path`` (defaults when ``path`` is None)."""
    if path is None:
        return base or SchedulerConfig()
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError("--config", f"cannot read {path}: {e.strerror or e}") from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError("--config", f"{path} is not valid YAML: {e}") from e
    return parse_config(data, base)
