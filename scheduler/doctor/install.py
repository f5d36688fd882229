"""What doctor learns about the installed scheduler from its Deployment and ConfigMap.

The scheduler's Deployment is found by the labels both the chart and ``manifests/`` put on it
(:data:`DEPLOYMENT_SELECTOR`). Its container arguments say which scheduler names it serves,
whether leader election is on and where ``/metrics`` is; its ConfigMap's ``config.yaml`` is
parsed by the scheduler's own config code, so doctor knows the default queue and the Lease
exactly as the scheduler does. Pure code: the caller fetches the objects.
"""

from __future__ import annotations

import datetime as dt
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from scheduler.config import ConfigError, SchedulerConfig, parse_config

__all__ = [
    "DEFAULT_SERVICE_ACCOUNT",
    "DEPLOYMENT_SELECTOR",
    "PODGROUPER_SELECTOR",
    "Install",
    "container_flags",
    "install_from",
    "parse_time",
]

#: Labels of the scheduler's Deployment (chart and plain manifests).
DEPLOYMENT_SELECTOR = "app.kubernetes.io/name=kai-scheduler,app.kubernetes.io/component=scheduler"
#: Labels of the pod grouper's Deployment.
PODGROUPER_SELECTOR = "app.kubernetes.io/name=kai-scheduler,app.kubernetes.io/component=podgrouper"
DEFAULT_SERVICE_ACCOUNT = "kai-scheduler"
_CONFIG_KEY = "config.yaml"


def parse_time(value: Any) -> float | None:
    """An API timestamp (RFC 3339, also MicroTime) as epoch seconds; None when unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def container_flags(args: Sequence[Any]) -> dict[str, list[str]]:
    """``--name=value`` and ``--name value`` arguments as {name: [values]} (repeatable)."""
    out: dict[str, list[str]] = {}
    items = [str(a) for a in args]
    i = 0
    while i < len(items):
        item = items[i]
        if item.startswith("--"):
            name, eq, value = item[2:].partition("=")
            if not eq and i + 1 < len(items) and not items[i + 1].startswith("--"):
                value = items[i + 1]
                i += 1
            elif not eq:
                value = "true"
            out.setdefault(name, []).append(value)
        i += 1
    return out


@dataclass(frozen=True)
class Install:
    """The scheduler as installed in ``namespace`` (defaults when no Deployment was found)."""

    namespace: str
    #: The scheduler's Deployment (API JSON), None when there is none.
    deployment: Mapping[str, Any] | None = None
    #: The Deployment's name ("kai-scheduler" when none was found).
    name: str = "kai-scheduler"
    service_account: str = DEFAULT_SERVICE_ACCOUNT
    #: ``spec.schedulerName`` values the scheduler serves.
    scheduler_names: tuple[str, ...] = ("kai-scheduler",)
    leader_elect: bool = False
    replicas: int = 1
    #: Port of /metrics, /healthz, /readyz.
    metrics_port: int = 8080
    #: Name of the ConfigMap holding config.yaml ("" when none is mounted).
    config_map: str = ""
    #: The scheduler's configuration, as it parses it.
    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    #: Why the configuration could not be read ("" when it could).
    config_error: str = ""
    #: Deployments found with the scheduler's labels (several is a mistake).
    found: int = 0

    @property
    def lease(self) -> tuple[str, str]:
        """(namespace, name) of the leader-election Lease."""
        le = self.config.leader_election
        return le.lease_namespace, le.lease_name


def _base_config(namespace: str) -> SchedulerConfig:
    # The scheduler's pod sets POD_NAMESPACE, which moves the Lease into its own namespace
    # (scheduler.cli.settings_from_args); do the same so the Lease is looked up there.
    base = SchedulerConfig()
    return replace(base, leader_election=replace(base.leader_election, lease_namespace=namespace))


def _config_map_of(pod_spec: Mapping[str, Any], config_path: str) -> str:
    """The ConfigMap mounted at the directory of ``config_path`` in the first container."""
    containers = pod_spec.get("containers") or [{}]
    folder = posixpath.dirname(config_path)
    volume = next(
        (
            m.get("name")
            for m in containers[0].get("volumeMounts") or []
            if m.get("mountPath", "").rstrip("/") == folder
        ),
        None,
    )
    for v in pod_spec.get("volumes") or []:
        if v.get("name") == volume and isinstance(v.get("configMap"), Mapping):
            return str(v["configMap"].get("name") or "")
    return ""


def _port(address: str) -> int:
    _, _, port = address.rpartition(":")
    try:
        return int(port)
    except ValueError:
        return 8080


def install_from(
    namespace: str,
    deployments: Sequence[Mapping[str, Any]],
    config_maps: Mapping[str, Mapping[str, Any]] | None = None,
) -> Install:
    """The install described by the scheduler's Deployment (the first by name when several
    match) and the ConfigMaps of ``namespace`` ({name: ConfigMap}); see the module docstring.
    """
    base = _base_config(namespace)
    if not deployments:
        return Install(namespace=namespace, config=base)
    deployment = sorted(deployments, key=lambda d: str(d.get("metadata", {}).get("name")))[0]
    meta = deployment.get("metadata") or {}
    spec = deployment.get("spec") or {}
    pod_spec = (spec.get("template") or {}).get("spec") or {}
    containers = pod_spec.get("containers") or [{}]
    flags = container_flags([*(containers[0].get("args") or [])])
    names = tuple(
        dict.fromkeys(n.strip() for v in flags.get("scheduler-name", []) for n in v.split(","))
    )
    names = tuple(n for n in names if n) or ("kai-scheduler",)
    leader = (flags.get("leader-elect") or ["false"])[-1].strip().lower() in ("true", "1", "yes")
    config_path = (flags.get("config") or [""])[-1]
    config_map = _config_map_of(pod_spec, config_path) if config_path else ""
    config, error = base, ""
    if config_map:
        data = ((config_maps or {}).get(config_map) or {}).get("data") or {}
        key = posixpath.basename(config_path) or _CONFIG_KEY
        if config_map not in (config_maps or {}):
            error = f"ConfigMap {namespace}/{config_map} (mounted as --config) does not exist"
        elif key not in data:
            error = f"ConfigMap {namespace}/{config_map} has no key {key}"
        else:
            try:
                config = parse_config(yaml.safe_load(data[key]), base)
            except yaml.YAMLError as e:
                error = f"{config_map}/{key} is not valid YAML: {e}"
            except ConfigError as e:
                error = f"{config_map}/{key}: {e}"
    if "scheduler-name" not in flags:
        names = config.scheduler_names_served
    replicas = spec.get("replicas")
    return Install(
        namespace=namespace,
        deployment=deployment,
        name=str(meta.get("name") or "kai-scheduler"),
        service_account=str(pod_spec.get("serviceAccountName") or "default"),
        scheduler_names=names,
        leader_elect=leader,
        replicas=1 if replicas is None else int(replicas),
        metrics_port=_port((flags.get("metrics-address") or [":8080"])[-1]),
        config_map=config_map,
        config=config,
        config_error=error,
        found=len(deployments),
    )
