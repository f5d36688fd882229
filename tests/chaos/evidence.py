"""Evidence for a chaos report, from the scheduler's JSON log and the webhook's records."""

from __future__ import annotations

import json
import re
from collections import Counter

from testenv.chaos import AdmissionRecord
from tests.chaos.invariants import Violation

__all__ = ["log_evidence", "log_levels", "repeated_binds"]

_POD_NAME = re.compile(r"g\d{4}-[a-z]+-\d+(?:r\d+)?")


def log_evidence(log_text: str, violation: Violation, limit: int = 12) -> list[str]:
    """Scheduler log lines naming the pods (or gang) of a violation."""
    blob = json.dumps(violation.to_json())
    names = set(_POD_NAME.findall(blob))
    gang = violation.evidence.get("gang")
    if isinstance(gang, str):
        names.add(gang.split("/", 1)[-1])
    if not names:
        return []
    lines = [line for line in log_text.splitlines() if any(n in line for n in names)]
    return lines[-limit:]


def repeated_binds(records: list[AdmissionRecord]) -> dict[str, list[str]]:
    """Pods whose bind was admitted more than once: pod -> the nodes asked for, in order."""
    nodes: dict[str, list[str]] = {}
    for r in records:
        if r.subresource == "binding" and r.allowed and not r.dry_run:
            nodes.setdefault(r.name, []).append(r.node)
    return {pod: asked for pod, asked in sorted(nodes.items()) if len(asked) > 1}


def log_levels(log_text: str) -> dict[str, dict[str, int]]:
    """Count of the scheduler's warning and error log events by name (JSON log lines)."""
    out: dict[str, Counter[str]] = {"error": Counter(), "warning": Counter()}
    for line in log_text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        level = record.get("level") if isinstance(record, dict) else None
        if level in out:
            out[level][str(record.get("event"))] += 1
    return {level: dict(counts.most_common(15)) for level, counts in out.items()}
