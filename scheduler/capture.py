"""``kai-scheduler snapshot --out FILE``: the live cluster as the next cycle would see it.

Every kind the scheduler watches (pods, nodes, KAI and Volcano queues and PodGroups,
PriorityClasses, PodDisruptionBudgets, claims, volumes, StorageClasses) is listed once with the
scheduler's own :class:`~scheduler.k8s.watch.Watcher` into the scheduler's own
:class:`~scheduler.cache.Cache`, and the cache's :class:`~scheduler.cluster.Snapshot` is written
with :mod:`scheduler.snapshotfile`. So the file is exactly what a fresh scheduler replica would
decide on; ``kai-scheduler simulate --snapshot FILE`` replays it.

The scheduler config (which pods are ours, the default queue, placement settings) decides how
the objects are read, so it is taken from ``--config FILE``, else from the scheduler's ConfigMap
(``--config-map``, default ``kai-scheduler/kai-scheduler-config``, key ``config.yaml``), else
the defaults (with a warning). It is stored in the file for the replay.

Kinds whose API is not installed (Volcano's CRDs, usually) count as empty, as in the scheduler.
A kind that cannot be listed for another reason (RBAC) fails the command (exit 1) naming it,
because a snapshot without, say, pods would replay a different cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import structlog
import yaml

from scheduler.cliflags import add_kube_flags
from scheduler.config import ConfigError, SchedulerConfig, load_config, parse_config

if TYPE_CHECKING:
    from scheduler.cluster.snapshot import Snapshot

# The API client, cache and watcher are imported when the command runs: ``add_parser`` is
# called for every ``kai-scheduler`` invocation and must stay cheap.

__all__ = ["CaptureError", "add_parser", "capture", "read_config_map", "run"]

log = structlog.get_logger("scheduler.capture")

DEFAULT_CONFIG_MAP = "kai-scheduler/kai-scheduler-config"
CONFIG_KEY = "config.yaml"
#: Attempts per kind whose list fails with a temporary error (API server restarting).
_ATTEMPTS = 3


class CaptureError(Exception):
    """The cluster could not be captured completely (the message names the kind and the fix)."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``snapshot`` on the ``kai-scheduler`` subcommand parsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "snapshot",
        help="save the live cluster as a snapshot file for simulate --snapshot",
        description="List every kind the scheduler reads (pods, nodes, queues, PodGroups incl. "
        "Volcano's, PriorityClasses, PodDisruptionBudgets, claims, volumes, StorageClasses) "
        "into the scheduler's own cache and write the snapshot its next cycle would decide on, "
        "with the scheduler config; replay it with kai-scheduler simulate --snapshot FILE.",
    )
    p.add_argument("--out", metavar="FILE", required=True, help="write here (.gz: gzip)")
    add_kube_flags(p, kube_config_help="kubeconfig file (default: the in-cluster ServiceAccount)")
    p.add_argument(
        "--config", metavar="FILE", default=None,
        help="scheduler config file (default: read the scheduler's ConfigMap)",
    )  # fmt: skip
    p.add_argument(
        "--config-map", metavar="NAMESPACE/NAME", default=DEFAULT_CONFIG_MAP,
        help=f"the scheduler's ConfigMap, key {CONFIG_KEY} (default {DEFAULT_CONFIG_MAP})",
    )  # fmt: skip
    p.add_argument(
        "--scheduler-name", action="append", default=None,
        help="pods with this spec.schedulerName are ours (default: as the config says)",
    )  # fmt: skip
    p.set_defaults(command="snapshot")
    return p


async def read_config_map(api: Any, reference: str) -> dict[str, Any] | None:
    """The config mapping in ConfigMap ``namespace/name`` (key ``config.yaml``); None when
    the ConfigMap or the key does not exist. Raises :class:`ConfigError` for bad content."""
    from scheduler.k8s.client import request_json
    from scheduler.k8s.errors import NotFound

    namespace, _, name = reference.partition("/")
    if not namespace or not name:
        raise ConfigError("--config-map", f"{reference!r} must look like NAMESPACE/NAME")
    try:
        obj = await request_json(api, "GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}")
    except NotFound:
        return None
    text = ((obj or {}).get("data") or {}).get(CONFIG_KEY)
    if text is None:
        return None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"ConfigMap {reference} {CONFIG_KEY}", f"not valid YAML: {e}") from e
    parse_config(data)  # raises ConfigError naming the key
    return dict(data or {})


async def capture(api: Any, config: SchedulerConfig) -> tuple[Snapshot, list[str]]:
    """List every watched kind once into a fresh cache; the snapshot and the absent kinds."""
    from scheduler.cache import Cache
    from scheduler.k8s.errors import KubeError
    from scheduler.k8s.resources import VOLCANO_KINDS, WATCHED_KINDS
    from scheduler.k8s.watch import Watcher, WatchSettings

    cache = Cache(
        config.scheduler_names_served,
        config.default_queue,
        wait_for_pod_grouper=config.pod_grouper,
    )
    todo: tuple[str, ...] = (*WATCHED_KINDS, *VOLCANO_KINDS)
    absent: set[str] = set()
    errors: dict[str, KubeError] = {}
    for attempt in range(_ATTEMPTS):
        # One round per kind is one list; a kind that failed is listed again by a new watcher.
        watcher = Watcher(api, cache, todo, settings=WatchSettings(backoff_base=0.2))
        await watcher.run(iterations=1)
        absent |= watcher.absent
        errors = {k: e for k, e in watcher.errors.items() if e is not None and k not in absent}
        todo = tuple(k for k in todo if k not in watcher.listed)
        if not todo:
            break
        await asyncio.sleep(watcher.backoff(attempt + 1))
    if todo:
        raise CaptureError(_failure(todo, errors))
    return cache.snapshot(now=time.time()), sorted(absent)


def _failure(kinds: tuple[str, ...], errors: dict[str, Any]) -> str:
    """One message for the kinds that could not be listed: the first error, and the fix for
    its kind of failure."""
    from scheduler.k8s.errors import Forbidden, Unauthorized

    found = [errors[k] for k in kinds if k in errors]
    distinct = list(dict.fromkeys(e.message for e in found))
    if any(isinstance(e, Forbidden) for e in found):
        fix = "grant list on these kinds to the kubeconfig's user (see manifests/20-rbac.yaml)"
    elif any(isinstance(e, Unauthorized) for e in found):
        fix = "the API server does not accept the kubeconfig's credentials; renew them"
    else:
        fix = "check that the API server in --kube-config / --kube-api-server is reachable"
    first = distinct[0] if distinct else "no answer"
    more = f" (and {len(distinct) - 1} more errors)" if len(distinct) > 1 else ""
    return f"could not list {', '.join(kinds)}: {first}{more}; {fix}"


async def _config(args: argparse.Namespace, api: Any) -> tuple[SchedulerConfig, dict[str, Any]]:
    """The config (file, else ConfigMap, else defaults) and its mapping for the file."""
    from scheduler.k8s.errors import KubeError
    from scheduler.snapshotfile import config_to_mapping

    if args.config:
        config = load_config(args.config)
        return config, config_to_mapping(config)
    try:
        mapping = await read_config_map(api, args.config_map)
    except KubeError as e:
        print(
            f"kai-scheduler snapshot: cannot read ConfigMap {args.config_map} ({e.message}); "
            "pass --config FILE with the scheduler's config",
            file=sys.stderr,
        )
        mapping = None
    if mapping is None:
        print(
            f"kai-scheduler snapshot: ConfigMap {args.config_map} (key {CONFIG_KEY}) not found; "
            "using the default config (pass --config FILE or --config-map NS/NAME)",
            file=sys.stderr,
        )
        config = SchedulerConfig()
        return config, config_to_mapping(config)
    return parse_config(mapping), mapping


def _with_names(config: SchedulerConfig, given: list[str] | None) -> SchedulerConfig:
    if not given:
        return config
    names = [n.strip() for g in given for n in g.split(",")]
    if not all(names):
        raise ConfigError("--scheduler-name", "must not be empty")
    served = tuple(dict.fromkeys(names))
    return replace(config, scheduler_name=served[0], scheduler_names=served)


async def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from scheduler.k8s.client import ClientSettings, make_api_client
    from scheduler.k8s.errors import KubeError
    from scheduler.snapshotfile import config_to_mapping, write_snapshot

    folder = Path(args.out).parent
    if not folder.is_dir():
        print(f"kai-scheduler snapshot: --out {args.out}: folder {folder} does not exist",
              file=sys.stderr)  # fmt: skip
        return 2
    settings = ClientSettings(args.kube_config, args.kube_api_server, args.kube_api_secure)
    try:
        api = await make_api_client(settings)
    except KubeError as e:
        print(f"kai-scheduler snapshot: {e.message}", file=sys.stderr)
        return 2
    try:
        try:
            config, mapping = await _config(args, api)
            config = _with_names(config, args.scheduler_name)
        except ConfigError as e:
            print(f"kai-scheduler snapshot: {e}", file=sys.stderr)
            return 2
        if args.scheduler_name:
            names = config_to_mapping(config)
            kept = {k: v for k, v in mapping.items() if not k.startswith("schedulerName")}
            mapping = {**kept, **{k: names[k] for k in names if k.startswith("schedulerName")}}
        started = time.monotonic()
        try:
            snapshot, absent = await capture(api, config)
        except CaptureError as e:
            print(f"kai-scheduler snapshot: {e}", file=sys.stderr)
            return 1
    finally:
        await api.close()
    source = {"by": "kai-scheduler snapshot", "absentKinds": absent}
    try:
        path = write_snapshot(args.out, snapshot, mapping, source)
    except OSError as e:
        print(f"kai-scheduler snapshot: --out {args.out}: {e.strerror or e}", file=sys.stderr)
        return 2
    pending = sum(1 for p in snapshot.pods if p.managed and p.pending)
    print(
        f"wrote {path}: {len(snapshot.nodes)} nodes, {len(snapshot.queues)} queues, "
        f"{len(snapshot.gangs)} gangs, {len(snapshot.pods)} pods ({pending} pending), "
        f"{len(snapshot.budgets)} disruption budgets in {time.monotonic() - started:.1f}s"
        + (f" (not installed or not readable, so empty: {', '.join(absent)})" if absent else "")
    )
    return 0


def run(args: argparse.Namespace) -> int:
    """Run ``kai-scheduler snapshot``; the exit code (0 ok, 1 incomplete, 2 bad flags)."""
    from scheduler.logs import setup_logging

    # Only problems on stderr: the per-kind "listed" lines would bury the one-line result.
    setup_logging("console", "error")
    return asyncio.run(_run(args))
