"""What a ``podgrouper-diff`` run found, summed up per case (:func:`summarize`, with PodGroup
names as patterns: :func:`name_pattern`), the two groupers' summaries compared
(:func:`compare`, verdicts as in :mod:`scheduler.bench.podgrouper_diff`) and shown
(:func:`table`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from scheduler.bench.podgrouper_cases import FIELDS, Case

__all__ = [
    "GROUPERS",
    "compare",
    "consistent",
    "name_pattern",
    "name_substitutions",
    "summarize",
    "table",
]

GROUPERS = ("ours", "kai")


def name_pattern(name: str, substitutions: Mapping[str, str]) -> str:
    """``name`` with every known object name and uid (``substitutions`` keys, whole words
    only, longest first) replaced by its placeholder: ``pg-job-7d9-<uid>`` ->
    ``pg-<pod>-<job uid>``."""
    if not substitutions:
        return name
    keys = sorted(substitutions, key=len, reverse=True)
    rx = re.compile(r"(?<![a-z0-9])(?:" + "|".join(re.escape(k) for k in keys) + r")(?![a-z0-9])")
    return rx.sub(lambda m: substitutions[m.group(0)], name)


#: Placeholders as docs/podgrouper.md writes them (``pg-<sts>-<sts uid>``).
_SHORT_KIND = {"replicaset": "rs", "statefulset": "sts", "leaderworkerset": "lws"}


def name_substitutions(
    case: Case, pods: Sequence[Mapping[str, Any]], workloads: Sequence[Mapping[str, Any]]
) -> dict[str, str]:
    """Placeholders for the names and uids of the case's pods, their owners and its
    workloads; the case's top owner wins a name clash (a LeaderWorkerSet's leader
    StatefulSet has its name)."""
    subs: dict[str, str] = {}

    def add(kind: str, name: str | None, uid: str | None) -> None:
        label = _SHORT_KIND.get(kind.lower(), kind.lower())
        if name:
            subs[name] = f"<{label}>"
        if uid:
            subs[uid] = f"<{label} uid>"

    for pod in pods:
        for ref in pod["metadata"].get("ownerReferences") or []:
            add(ref.get("kind", "owner"), ref.get("name"), ref.get("uid"))
    for obj in workloads:
        add(obj.get("kind", "owner"), obj["metadata"].get("name"), obj["metadata"].get("uid"))
    for pod in pods:
        add("pod", pod["metadata"].get("name"), pod["metadata"].get("uid"))
    top_kind = {"volcano": "job", "pod": "pod"}.get(case.kind, case.kind)
    for obj in workloads:
        if obj["metadata"].get("name") == case.workload and (
            obj.get("kind", "").lower() == top_kind
        ):
            add(top_kind, case.workload, obj["metadata"].get("uid"))
    return subs


def summarize(
    pods: Mapping[str, str | None],
    podgroups: Mapping[str, Mapping[str, Any]],
    substitutions: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The compared summary of one case in one run.

    ``pods``: pod name -> the PodGroup it names (None: not grouped); ``podgroups``: name ->
    ``{"minMember", "queue", "priorityClassName", "preemptibility", "owner"}`` (owner: kind).
    Returns :data:`FIELDS`: ``grouped`` "annotated/pods", ``podgroups`` the count of distinct
    PodGroups the pods name, then the sorted distinct values over those PodGroups."""
    named = sorted({pg for pg in pods.values() if pg})
    found = [podgroups[n] for n in named if n in podgroups]

    def distinct(key: str) -> list[Any]:
        values = {pg.get(key) if pg.get(key) is not None else "" for pg in found}
        return sorted(values, key=lambda v: (isinstance(v, str), v))

    return {
        "grouped": f"{sum(1 for pg in pods.values() if pg)}/{len(pods)}",
        "podgroups": len(named),
        "name": sorted({name_pattern(n, substitutions or {}) for n in named}),
        "owner": distinct("owner"),
        "min_member": distinct("minMember"),
        "queue": distinct("queue"),
        "priority_class": distinct("priorityClassName"),
        "preemptibility": distinct("preemptibility"),
    }


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value))


def compare(case: Case, runs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The comparison of one case's runs (``runs[grouper]`` has ``summary`` and optionally
    ``error``/``missing``): the differing fields and a verdict (see the module docstring)."""
    ours, kai = runs.get("ours") or {}, runs.get("kai") or {}
    incomplete = [
        name
        for name, r in runs.items()
        if r.get("error") or r.get("missing") or r.get("summary") is None
    ] + [g for g in GROUPERS if g not in runs]
    differences: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    if incomplete:
        verdict = "incomplete"
        problems.append(f"incomplete runs: {', '.join(incomplete)}")
    else:
        o, k = ours["summary"], kai["summary"]
        differences = {f: {"ours": o[f], "kai": k[f]} for f in FIELDS if o[f] != k[f]}
        declared = case.difference
        if declared is None:
            verdict = "same" if not differences else "UNDECLARED"
            if differences:
                problems.append(f"undeclared difference in {', '.join(differences)}")
        else:
            want_ours, want_kai = _jsonable(dict(declared.ours)), _jsonable(dict(declared.kai))
            for f in sorted(set(differences) - set(want_ours)):
                problems.append(f"{f} differs but is not declared")
            for f in sorted(want_ours):
                if o[f] != want_ours[f] or k[f] != want_kai[f]:
                    problems.append(
                        f"{f}: declared ours={want_ours[f]!r} kai={want_kai[f]!r}, "
                        f"measured ours={o[f]!r} kai={k[f]!r}"
                    )
            verdict = "deliberate" if not problems else "NOT-AS-DECLARED"
    return {
        "case": case.name,
        "kind": case.kind,
        "summary": case.summary,
        "verdict": verdict,
        "differences": differences,
        "problems": problems,
        "declared_difference": (
            None
            if case.difference is None
            else {
                "ours": dict(case.difference.ours),
                "kai": dict(case.difference.kai),
                "reason": case.difference.reason,
            }
        ),
        "runs": {name: dict(r) for name, r in runs.items()},
    }


def consistent(comparisons: Iterable[Mapping[str, Any]]) -> bool:
    """True when every case agrees or differs exactly as declared."""
    return all(c["verdict"] in ("same", "deliberate") for c in comparisons)


def _cell(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) if v != "" else "-" for v in value) or "-"
    return str(value)


_HEADINGS = {"podgroups": "pgs", "min_member": "min", "priority_class": "class"}


def table(comparisons: Sequence[Mapping[str, Any]]) -> str:
    """A human table: per case and grouper, the summary (:data:`FIELDS`); then the verdict
    and, for a failure, what is wrong."""
    rows: list[tuple[str, str, list[str]]] = []
    for c in comparisons:
        for g in GROUPERS:
            s = (c["runs"].get(g) or {}).get("summary")
            cells = [_cell(s[f]) for f in FIELDS] if s else ["(no result)"] + [""] * 7
            rows.append((c["case"] if g == GROUPERS[0] else "", g, cells))
    widths = [
        max([len(_HEADINGS.get(f, f))] + [len(r[2][i]) for r in rows]) for i, f in enumerate(FIELDS)
    ]
    case_w = max([4] + [len(c["case"]) for c in comparisons])

    def line(case: str, grouper: str, cells: Sequence[str]) -> str:
        body = "  ".join(f"{v:<{w}}" for v, w in zip(cells, widths, strict=True))
        return f"{case:<{case_w}}  {grouper:<7}  {body}".rstrip()

    lines = [line("case", "grouper", [_HEADINGS.get(f, f) for f in FIELDS])]
    for i, c in enumerate(comparisons):
        for case, grouper, cells in rows[i * len(GROUPERS) : (i + 1) * len(GROUPERS)]:
            lines.append(line(case, grouper, cells))
        diff = ", ".join(c["differences"]) or "-"
        lines.append(f"{'':<{case_w}}  -> {c['verdict']} (differs in: {diff})")
        lines.extend(f"{'':<{case_w}}     ! {p}" for p in c["problems"])
    return "\n".join(lines)
