"""Measurements for the end-to-end bench: what a scheduler process tree costs (CPU seconds and
memory from ``/proc``) and which API requests it made (kube-apiserver's audit log).

Both read the operating system's and the API server's own accounting rather than anything the
scheduler reports about itself, so every contender is measured the same way.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["AuditCount", "ProcessTreeMeter", "count_audit", "percentile"]

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..1) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = min(len(ordered), max(1, math.ceil(q * len(ordered))))
    return ordered[rank - 1]


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:  # the process exited between listing and reading
        return None


def _stat_fields(pid: int) -> list[str] | None:
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    return text[text.rfind(")") + 2 :].split()


def _children(roots: Iterable[int]) -> set[int]:
    """``roots`` and all their live descendants."""
    parent_of: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None:
                parent_of[int(entry)] = int(fields[1])  # field 4, ppid
    tree = {r for r in roots if r in parent_of}
    grew = True
    while grew:
        more = {pid for pid, ppid in parent_of.items() if ppid in tree and pid not in tree}
        tree |= more
        grew = bool(more)
    return tree


def _status_kb(pid: int, key: str) -> int:
    text = _read(f"/proc/{pid}/status")
    for line in (text or "").splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


@dataclass
class ProcessTreeMeter:
    """CPU time and memory of some processes and all their descendants, sampled from /proc.

    Call :meth:`sample` periodically and once more right before the processes are stopped:
    a process's counters are gone once it has been reaped, so the last sample is what counts.
    """

    roots: Sequence[int]
    #: pid -> user+system CPU seconds at its last sample.
    cpu: dict[int, float] = field(default_factory=dict)
    #: pid -> its own peak resident set (VmHWM) in KiB at its last sample.
    hwm_kb: dict[int, int] = field(default_factory=dict)
    #: Largest sum of the processes' current resident sets seen by one sample, KiB.
    peak_rss_sum_kb: int = 0
    #: Processes seen in the tree so far.
    pids: set[int] = field(default_factory=set)

    def sample(self) -> None:
        """Read every live process of the tree."""
        rss_sum = 0
        for pid in _children(self.roots):
            fields = _stat_fields(pid)
            if fields is None:
                continue
            # utime, stime: fields 14 and 15 of /proc/PID/stat (children's times excluded, so a
            # reaped child is never counted twice).
            self.cpu[pid] = (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
            self.hwm_kb[pid] = max(self.hwm_kb.get(pid, 0), _status_kb(pid, "VmHWM"))
            rss_sum += _status_kb(pid, "VmRSS")
            self.pids.add(pid)
        self.peak_rss_sum_kb = max(self.peak_rss_sum_kb, rss_sum)

    @property
    def cpu_seconds(self) -> float:
        """User + system CPU seconds of every process seen, as of its last sample."""
        return sum(self.cpu.values())

    @property
    def peak_rss_mb(self) -> float:
        """Sum over the processes of each one's peak resident set (VmHWM), MiB: an upper bound
        of the tree's peak that cannot miss a short spike between samples."""
        return sum(self.hwm_kb.values()) / 1024


@dataclass
class AuditCount:
    """The API requests some users made, from kube-apiserver's audit log."""

    #: Distinct requests (audit IDs).
    requests: int = 0
    #: Requests per user name.
    by_user: dict[str, int] = field(default_factory=dict)
    #: Requests per ``verb resource[/subresource]``, e.g. ``create pods/binding``.
    by_kind: dict[str, int] = field(default_factory=dict)
    #: ``create pods/binding`` answered 201 (a pod bound) and 409 (it was already bound).
    bindings_ok: int = 0
    binding_conflicts: int = 0
    #: Requests answered 429 (API Priority and Fairness rejected them).
    throttled: int = 0

    def as_json(self) -> dict[str, Any]:
        """The JSON form used in the bench output (kinds sorted by count)."""
        kinds = sorted(self.by_kind.items(), key=lambda kv: (-kv[1], kv[0]))
        return {
            "requests": self.requests,
            "by_user": dict(sorted(self.by_user.items())),
            "by_kind": dict(kinds),
            "bindings_ok": self.bindings_ok,
            "binding_conflicts": self.binding_conflicts,
            "throttled_429": self.throttled,
        }


def _timestamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def count_audit(path: Path, offset: int, users: Collection[str], since: float) -> AuditCount:
    """Count the requests ``users`` made according to the audit log at ``path``, reading from
    byte ``offset`` and skipping requests received before ``since`` (Unix time).

    A request appears once per stage (long-running ones such as watches at ResponseStarted
    and ResponseComplete): it is counted once, by audit ID, with the last status seen.
    """
    last: dict[str, dict[str, Any]] = {}
    with path.open("rb") as f:
        f.seek(offset)
        for raw in f:
            if not raw.strip():
                continue
            try:
                event = json.loads(raw)
            except ValueError:  # a line being written as we read: ignore the torn tail
                continue
            if event.get("user", {}).get("username") not in users:
                continue
            if _timestamp(event.get("requestReceivedTimestamp", "1970-01-01T00:00:00Z")) < since:
                continue
            last[event["auditID"]] = event
    out = AuditCount(requests=len(last))
    by_user: Counter[str] = Counter()
    by_kind: Counter[str] = Counter()
    for event in last.values():
        by_user[event["user"]["username"]] += 1
        ref = event.get("objectRef") or {}
        resource = ref.get("resource", event.get("requestURI", "?").split("?")[0])
        if ref.get("subresource"):
            resource += "/" + ref["subresource"]
        by_kind[f"{event.get('verb', '?')} {resource}"] += 1
        code = (event.get("responseStatus") or {}).get("code")
        if resource == "pods/binding" and event.get("verb") == "create":
            out.bindings_ok += code == 201
            out.binding_conflicts += code == 409
        out.throttled += code == 429
    out.by_user = dict(by_user)
    out.by_kind = dict(by_kind)
    return out
