"""``simulate --snapshot FILE --set PATH=VALUE``: the changes a what-if applies to a snapshot.

Paths (names may contain dots; the fixed parts are matched from the ends)::

    queue.<name>.<gpu|cpu|memory>.<quota|limit|overQuotaWeight>=V   # Queue CRD units
    node.<name>.unschedulable=<true|false>
    config.<key>[.<key>...]=V                                        # config-file keys

Queue values are in the Queue CRD's units (GPU devices, CPU millicores, memory MB; ``-1`` is
unlimited), read by the same code as the CRD. ``config.`` values are YAML scalars set into the
config-file mapping (``config.placement.gpu=spread``, ``config.solverTimeLimit=2s``), which is
then parsed like the config file. Every problem raises :class:`WhatIfError` naming the path and
the valid forms (exit code 2).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from scheduler.cluster.queue import QUEUE_RESOURCES, UNLIMITED, Queue, QueueResource
from scheduler.cluster.queuespec import SpecError, queue_from_k8s
from scheduler.cluster.snapshot import Snapshot
from scheduler.config import ConfigError, parse_config

__all__ = ["VALID_FORMS", "Change", "WhatIfError", "apply_changes", "parse_change"]

VALID_FORMS = (
    "queue.<name>.<gpu|cpu|memory>.<quota|limit|overQuotaWeight>=V (Queue CRD units: GPU "
    "devices, CPU millicores, memory MB, -1 unlimited); node.<name>.unschedulable=true|false; "
    "config.<key>=V (config-file keys, e.g. config.placement.gpu=spread)"
)
_QUEUE_FIELDS = ("quota", "limit", "overQuotaWeight")
_ATTR = {"quota": "quota", "limit": "limit", "overQuotaWeight": "over_quota_weight"}


class WhatIfError(ValueError):
    """A ``--set`` that cannot be applied (the message names it and says what to write)."""


@dataclass(frozen=True)
class Change:
    """One parsed ``--set``."""

    #: The text as given (for messages and the report).
    text: str
    #: ``queue``, ``node`` or ``config``.
    target: str
    #: Queue or node name ("" for config).
    name: str
    #: The rest of the path: (resource, field), ("unschedulable",) or the config keys.
    field: tuple[str, ...]
    #: The value: a string for queues (parsed as a CRD quantity), YAML data otherwise.
    value: Any


def _bad(text: str, why: str) -> WhatIfError:
    return WhatIfError(f"--set {text}: {why}; valid forms: {VALID_FORMS}")


def parse_change(text: str) -> Change:
    """Parse one ``PATH=VALUE``; raises :class:`WhatIfError`."""
    path, sep, raw = text.partition("=")
    path, raw = path.strip(), raw.strip()
    if not sep or not path or not raw:
        raise _bad(text, "expected PATH=VALUE")
    target, _, rest = path.partition(".")
    parts = rest.split(".") if rest else []
    if target == "queue":
        if len(parts) < 3 or not all(parts):
            raise _bad(text, "a queue path is queue.<name>.<resource>.<field>")
        name, resource, fld = ".".join(parts[:-2]), parts[-2], parts[-1]
        if resource not in QUEUE_RESOURCES:
            raise _bad(text, f"unknown queue resource {resource!r}")
        if fld not in _QUEUE_FIELDS:
            raise _bad(text, f"unknown queue field {fld!r}")
        return Change(text, "queue", name, (resource, fld), raw)
    if target == "node":
        if len(parts) < 2 or not all(parts) or parts[-1] != "unschedulable":
            raise _bad(text, "a node path is node.<name>.unschedulable")
        value = _yaml(text, raw)
        if not isinstance(value, bool):
            raise _bad(text, f"{raw!r} must be true or false")
        return Change(text, "node", ".".join(parts[:-1]), ("unschedulable",), value)
    if target == "config":
        if not parts or not all(parts):
            raise _bad(text, "a config path is config.<key>[.<key>]")
        return Change(text, "config", "", tuple(parts), _yaml(text, raw))
    raise _bad(text, f"unknown target {target!r}")


def _yaml(text: str, raw: str) -> Any:
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise _bad(text, f"value {raw!r} is not a YAML scalar ({e})") from e


def _suggest(name: str, known: Iterable[str]) -> str:
    names = sorted(known)
    shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
    return f"there is no {name!r}; the snapshot has: {shown or 'none'}"


def _queue_amount(change: Change) -> int:
    """The value in scheduler units, read like the CRD field it stands for."""
    resource, fld = change.field
    spec = {"resources": {resource: {fld: change.value}}}
    try:
        parsed = queue_from_k8s({"metadata": {"name": change.name}, "spec": spec})
    except SpecError as e:
        raise _bad(change.text, e.message) from e
    value: int = getattr(parsed.resource(resource), _ATTR[fld])
    return value


def _apply_queue(queue: Queue, change: Change) -> Queue:
    resource, fld = change.field
    current = queue.resource(resource)
    updated = dataclasses.replace(current, **{_ATTR[fld]: _queue_amount(change)})
    resources: dict[str, QueueResource] = dict(queue.resources)
    resources[resource] = updated
    ordered = tuple((r, resources[r]) for r in QUEUE_RESOURCES if r in resources)
    return dataclasses.replace(queue, resources=ordered)


def _set_in(mapping: dict[str, Any], keys: Sequence[str], value: Any, text: str) -> None:
    node = mapping
    for key in keys[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        elif not isinstance(child, dict):
            raise _bad(text, f"config key {key!r} is not a mapping")
        else:
            child = node[key] = dict(child)
        node = child
    node[keys[-1]] = value


def apply_changes(
    snapshot: Snapshot, config: Mapping[str, Any] | None, changes: Sequence[Change]
) -> tuple[Snapshot, dict[str, Any]]:
    """The snapshot and config mapping with ``changes`` applied in order."""
    queues = {q.name: q for q in snapshot.queues}
    nodes = {n.name: n for n in snapshot.nodes}
    mapping: dict[str, Any] = dict(config or {})
    for change in changes:
        if change.target == "queue":
            if change.name not in queues:
                raise _bad(change.text, _suggest(change.name, queues))
            queues[change.name] = _apply_queue(queues[change.name], change)
        elif change.target == "node":
            if change.name not in nodes:
                raise _bad(change.text, _suggest(change.name, nodes))
            nodes[change.name] = dataclasses.replace(nodes[change.name], unschedulable=change.value)
        else:
            _set_in(mapping, change.field, change.value, change.text)
            try:
                parse_config(mapping)
            except ConfigError as e:
                raise _bad(change.text, f"config {e}") from e
    for change in changes:
        # Checked once every change is in: quota=6 then limit=6 is fine in either order.
        if change.target == "queue":
            r = queues[change.name].resource(change.field[0])
            if r.limit != UNLIMITED and r.quota != UNLIMITED and r.limit < r.quota:
                raise _bad(
                    change.text,
                    f"the {change.field[0]} limit would be below the quota ({r.limit} < "
                    f"{r.quota} in scheduler units); also --set the limit",
                )
    changed = dataclasses.replace(
        snapshot,
        queues=tuple(queues[q.name] for q in snapshot.queues),
        nodes=tuple(nodes[n.name] for n in snapshot.nodes),
    )
    return changed, mapping
