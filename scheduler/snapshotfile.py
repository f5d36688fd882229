"""Snapshot files: one cycle's :class:`Snapshot` plus the scheduler config it was decided with.

Written by ``kai-scheduler snapshot`` and by the running scheduler's ``GET /debug/snapshot``;
read by ``kai-scheduler simulate --snapshot``. The file is the snapshot's own JSON
(:meth:`Snapshot.to_dict`: ``version``, ``now``, ``nodes``, ``pods``, ``gangs``, ``queues``,
``budgets``) with two extra top-level keys that :meth:`Snapshot.from_dict` ignores:

- ``config``: the scheduler config as the camelCase mapping of the config file
  (``placement``, ``solverTimeLimit``, ``cyclePeriod``, ...), so a replay solves with the same
  settings (absent when unknown; ``simulate --config`` replaces it);
- ``source``: where the snapshot came from (``kai-scheduler snapshot``, ``/debug/snapshot``)
  and the kinds whose API was not installed, for the reader.

A path ending in ``.gz`` is gzip-compressed JSON. Every read problem raises
:class:`SnapshotFileError` naming the file and what to do.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler.cluster.snapshot import Snapshot
from scheduler.config import ConfigError, SchedulerConfig, parse_config

__all__ = [
    "SnapshotFile",
    "SnapshotFileError",
    "config_to_mapping",
    "read_snapshot",
    "snapshot_document",
    "write_snapshot",
]


class SnapshotFileError(ValueError):
    """A snapshot file that cannot be read (the message names the file and the fix)."""


@dataclass(frozen=True)
class SnapshotFile:
    """What a snapshot file holds."""

    snapshot: Snapshot
    #: The config file mapping stored with the snapshot (None when the file has none).
    config: Mapping[str, Any] | None = None
    #: Free-form provenance (``source`` in the file).
    source: Mapping[str, Any] = field(default_factory=dict)

    def scheduler_config(self) -> SchedulerConfig:
        """The stored config parsed (defaults when none was stored)."""
        return parse_config(dict(self.config) if self.config is not None else None)


def config_to_mapping(config: SchedulerConfig) -> dict[str, Any]:
    """The config-file mapping of ``config`` for what a cycle's decision depends on
    (placement, solver limit, period, queues, names); :func:`parse_config` reads it back."""
    p = config.placement
    out: dict[str, Any] = {
        "placement": {
            "gpu": p.gpu_strategy,
            "cpu": p.cpu_strategy,
            "scoring": p.scoring,
            "holdStrandingShares": p.hold_stranding_shares,
            "holdStrandingMaxWait": p.hold_stranding_max_wait,
            "solverWorkers": p.workers,
            "greedyOnly": p.greedy_only,
            "takeBack": p.take_back,
            "consolidationMaxPods": p.consolidation_max_pods,
            "takeBackGangs": p.take_back_gangs,
        },
        "solverTimeLimit": p.time_limit_seconds,
        "cyclePeriod": config.cycle_period,
        "defaultQueue": config.default_queue,
        "stalenessGracePeriod": config.staleness_grace_period,
        "nominationTimeout": config.nomination_timeout,
        "podGrouper": config.pod_grouper,
    }
    names = config.scheduler_names_served
    if len(names) > 1:
        out["schedulerNames"] = list(names)
    else:
        out["schedulerName"] = names[0]
    return out


def snapshot_document(
    snapshot: Snapshot,
    config: Mapping[str, Any] | None = None,
    source: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON document of a snapshot file."""
    doc = snapshot.to_dict()
    if config is not None:
        doc["config"] = dict(config)
    if source:
        doc["source"] = dict(source)
    return doc


def write_snapshot(
    path: str | Path,
    snapshot: Snapshot,
    config: Mapping[str, Any] | None = None,
    source: Mapping[str, Any] | None = None,
) -> Path:
    """Write the snapshot file (gzip when ``path`` ends in ``.gz``); returns the path."""
    out = Path(path)
    text = json.dumps(snapshot_document(snapshot, config, source), separators=(",", ":"))
    data = text.encode()
    if out.suffix == ".gz":
        # mtime=0: the same snapshot gives the same bytes.
        data = gzip.compress(data, mtime=0)
    out.write_bytes(data)
    return out


def _text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise SnapshotFileError(f"--snapshot {path}: cannot read it ({e.strerror or e})") from e
    if raw[:2] == b"\x1f\x8b":
        # Gzip is recognised by its magic bytes, whatever the file is called.
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise SnapshotFileError(f"--snapshot {path}: broken gzip data ({e})") from e
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SnapshotFileError(
            f"--snapshot {path}: not a snapshot file (binary data at byte {e.start}); "
            "write one with: kai-scheduler snapshot --out FILE"
        ) from e


def read_snapshot(path: str | Path) -> SnapshotFile:
    """Read a snapshot file written by :func:`write_snapshot` (or a bare Snapshot JSON)."""
    p = Path(path)
    text = _text(p)
    try:
        data = json.loads(text)
    except ValueError as e:
        raise SnapshotFileError(
            f"--snapshot {p}: not JSON ({e}); write one with: kai-scheduler snapshot --out FILE"
        ) from e
    if not isinstance(data, dict) or "nodes" not in data:
        raise SnapshotFileError(
            f"--snapshot {p}: not a snapshot (expected a JSON object with nodes, pods, gangs, "
            "queues); write one with: kai-scheduler snapshot --out FILE"
        )
    try:
        snapshot = Snapshot.from_dict(data)
    except (ValueError, TypeError, KeyError) as e:
        raise SnapshotFileError(f"--snapshot {p}: cannot be read as a snapshot ({e})") from e
    config = data.get("config")
    if config is not None:
        if not isinstance(config, dict):
            raise SnapshotFileError(f"--snapshot {p}: config must be a mapping")
        try:
            parse_config(config)
        except ConfigError as e:
            raise SnapshotFileError(
                f"--snapshot {p}: its config is not valid ({e}); pass --config FILE instead"
            ) from e
    source = data.get("source")
    return SnapshotFile(snapshot, config, source if isinstance(source, dict) else {})
