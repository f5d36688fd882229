"""The pure parts of ``python -m scheduler.bench podgrouper-diff``: the cases, the summary of
one run and the verdict of a comparison (the runs themselves are in
tests/e2e/test_podgrouper_vs_kai.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scheduler.bench import podgrouper_diff as pd

REPO = Path(__file__).resolve().parents[2]

AGREED = {
    "grouped": "2/2",
    "podgroups": 1,
    "name": ["pg-<job>-<job uid>"],
    "owner": ["Job"],
    "min_member": [1],
    "queue": ["default-queue"],
    "priority_class": ["train"],
    "preemptibility": [""],
}


def _runs(ours: dict[str, Any], kai: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        "ours": {"summary": ours, "missing": [], "error": None},
        "kai": {"summary": kai, "missing": [], "error": None},
    }


def _case(difference: pd.Difference | None = None) -> pd.Case:
    return pd.Case("job-x", "job", "a test case", difference=difference)


def test_agreement_is_same() -> None:
    c = pd.compare(_case(), _runs(AGREED, dict(AGREED)))
    assert c["verdict"] == "same"
    assert c["differences"] == {} and c["problems"] == []
    assert pd.consistent([c])


def test_an_undeclared_difference_fails() -> None:
    kai = {**AGREED, "queue": ["other"]}
    c = pd.compare(_case(), _runs(AGREED, kai))
    assert c["verdict"] == "UNDECLARED"
    assert c["differences"] == {"queue": {"ours": ["default-queue"], "kai": ["other"]}}
    assert not pd.consistent([c])


def test_a_declared_difference_that_happens_is_deliberate() -> None:
    declared = pd.Difference(
        ours={"podgroups": 1, "name": ["pg-<job>-<job uid>"]},
        kai={"podgroups": 2, "name": ["pg-<pod>-<job uid>"]},
        reason="one per pod",
    )
    kai = {**AGREED, "podgroups": 2, "name": ["pg-<pod>-<job uid>"]}
    c = pd.compare(_case(declared), _runs(AGREED, kai))
    assert c["verdict"] == "deliberate", c["problems"]
    assert set(c["differences"]) == {"podgroups", "name"}
    assert c["declared_difference"]["reason"] == "one per pod"
    assert pd.consistent([c])


def test_a_declared_difference_that_did_not_happen_fails() -> None:
    declared = pd.Difference(ours={"min_member": [2]}, kai={"min_member": [1]}, reason="r")
    c = pd.compare(_case(declared), _runs(AGREED, dict(AGREED)))
    assert c["verdict"] == "NOT-AS-DECLARED"
    assert any("min_member" in p for p in c["problems"])
    assert not pd.consistent([c])


def test_a_declared_difference_with_other_values_fails() -> None:
    declared = pd.Difference(ours={"min_member": [2]}, kai={"min_member": [1]}, reason="r")
    ours = {**AGREED, "min_member": [3]}
    c = pd.compare(_case(declared), _runs(ours, dict(AGREED)))
    assert c["verdict"] == "NOT-AS-DECLARED"


def test_a_difference_beyond_the_declared_one_fails() -> None:
    declared = pd.Difference(ours={"min_member": [2]}, kai={"min_member": [1]}, reason="r")
    ours = {**AGREED, "min_member": [2]}
    kai = {**AGREED, "queue": ["other"]}
    c = pd.compare(_case(declared), _runs(ours, kai))
    assert c["verdict"] == "NOT-AS-DECLARED"
    assert "queue differs but is not declared" in c["problems"]


@pytest.mark.parametrize(
    "kai_run",
    [
        {"summary": dict(AGREED), "missing": [], "error": "not settled"},
        {"summary": dict(AGREED), "missing": ["pg-gone"], "error": None},
        {"summary": None, "missing": [], "error": None},
    ],
)
def test_a_failed_run_is_incomplete(kai_run: dict[str, Any]) -> None:
    runs = {"ours": {"summary": dict(AGREED), "missing": [], "error": None}, "kai": kai_run}
    c = pd.compare(_case(), runs)
    assert c["verdict"] == "incomplete"
    assert not pd.consistent([c])


def test_a_missing_run_is_incomplete() -> None:
    c = pd.compare(_case(), {"ours": {"summary": dict(AGREED), "missing": []}})
    assert c["verdict"] == "incomplete"


def test_a_difference_declares_the_same_known_fields_on_both_sides() -> None:
    with pytest.raises(ValueError):
        pd.Difference(ours={"queue": ["a"]}, kai={"min_member": [1]}, reason="r")
    with pytest.raises(ValueError):
        pd.Difference(ours={}, kai={}, reason="r")
    with pytest.raises(ValueError):
        pd.Difference(ours={"colour": 1}, kai={"colour": 2}, reason="r")


def test_summarize_counts_podgroups_and_lists_distinct_values() -> None:
    pods = {"job-a": "pg-job-a-U1", "job-b": "pg-job-b-U1", "job-c": None}
    podgroups = {
        n: {
            "minMember": 1,
            "queue": "q",
            "priorityClassName": "train",
            "preemptibility": "",
            "owner": "Job",
        }
        for n in ("pg-job-a-U1", "pg-job-b-U1", "pg-other-U9")
    }
    subs = {"job": "<job>", "job-a": "<pod>", "job-b": "<pod>", "U1": "<job uid>"}
    s = pd.summarize(pods, podgroups, subs)
    assert s == {
        "grouped": "2/3",
        "podgroups": 2,
        "name": ["pg-<pod>-<job uid>"],
        "owner": ["Job"],
        "min_member": [1],
        "queue": ["q"],
        "priority_class": ["train"],
        "preemptibility": [""],
    }
    assert set(s) == set(pd.FIELDS)


def test_name_pattern_replaces_whole_names_longest_first() -> None:
    subs = {
        "job": "<job>",
        "job-7x2": "<pod>",
        "0a1b-22": "<job uid>",
        "lws": "<lws>",
    }
    assert pd.name_pattern("pg-job-7x2-0a1b-22", subs) == "pg-<pod>-<job uid>"
    assert pd.name_pattern("pg-job-0a1b-22", subs) == "pg-<job>-<job uid>"
    # Only whole names: "lws" inside "lwsx" is not one.
    assert pd.name_pattern("pg-lwsx-0a1b-22-group-0", subs) == "pg-lwsx-<job uid>-group-0"
    assert pd.name_pattern("pg-a", {}) == "pg-a"


def test_cases_cover_every_kind_and_fit_a_namespace() -> None:
    names = [c.name for c in pd.CASES]
    assert len(names) == len(set(names))
    assert {c.kind for c in pd.CASES} == set(pd.KINDS)
    run = pd.RunNames("k1234", "kai-reference")
    for c in pd.CASES:
        ns = run.namespace(c)
        assert len(ns) <= 63 and ns.startswith(pd.NAMESPACE_PREFIX), ns
        manifest = pd.workload_manifest(c, run)
        assert manifest["metadata"]["name"] == c.workload
        for key, value in c.owner_labels.items():
            assert manifest["metadata"]["labels"][key] == value


def test_docs_name_the_command_and_the_test() -> None:
    text = (REPO / "docs" / "podgrouper.md").read_text()
    section = text.split("## Differences from KAI's pod grouper", 1)[1]
    assert "podgrouper-diff" in section
    assert "tests/e2e/test_podgrouper_vs_kai.py" in section
