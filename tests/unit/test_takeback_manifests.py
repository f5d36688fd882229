"""Taking back in the shipped YAML: the CRDs carry the duration fields (validated as the
scheduler parses them), default queues have quota 0, and docs/taking-back.md documents every
field, label and annotation."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.cluster.podspec import PREEMPTIBILITY_LABEL, PREEMPTION_DELAY_ANNOTATION
from scheduler.cluster.queuespec import SpecError, parse_duration

ROOT = Path(__file__).resolve().parents[2]
RESOURCES = ("gpu", "cpu", "memory")


def _spec_props(crd_dir: Path, plural: str) -> dict[str, Any]:
    text = (crd_dir / f"scheduling.run.ai_{plural}.yaml").read_text()
    (crd,) = [d for d in yaml.safe_load_all(text) if d]
    (version,) = crd["spec"]["versions"]
    props: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    return props


def _duration_regex(prop: dict[str, Any]) -> re.Pattern[str]:
    """The CEL rule's regex of a duration field, as a Python pattern."""
    (rule,) = prop["x-kubernetes-validations"]
    m = re.fullmatch(r"self\.matches\('(.*)'\)", rule["rule"])
    assert m, rule["rule"]
    return re.compile(m.group(1).replace("\\\\", "\\"))


DURATION_FIELDS = [
    ("queues", "preemptMinRuntime"),
    ("queues", "reclaimMinRuntime"),
    ("podgroups", "preemptionDelay"),
]
SAMPLES = ["0", "30s", "5m", "1h30m", "1.5h", "500ms", "10us", "100ns", "2µs", "1m0.5s"]
BAD = ["", "ten", "-5m", "5 m", "1d", "m5", "-1", "1h 30m", "0x"]


@pytest.mark.parametrize("crd_dir", [ROOT / "crds", ROOT / "manifests" / "chart" / "crds"])
@pytest.mark.parametrize(("plural", "field"), DURATION_FIELDS)
def test_duration_fields_are_validated_as_the_scheduler_parses_them(
    crd_dir: Path, plural: str, field: str
) -> None:
    prop = _spec_props(crd_dir, plural)[field]
    assert prop["type"] == "string"
    regex = _duration_regex(prop)
    for raw in SAMPLES:
        assert regex.fullmatch(raw), raw
        parse_duration(raw, field)
    for raw in BAD:
        assert not regex.fullmatch(raw), raw
        with pytest.raises(SpecError):
            parse_duration(raw, field)
    (rule,) = prop["x-kubernetes-validations"]
    assert rule["message"].startswith(f"spec.{field} must be a duration")


def _default_queue_docs() -> list[dict[str, Any]]:
    docs = yaml.safe_load_all((ROOT / "manifests" / "defaults" / "queues.yaml").read_text())
    return [d for d in docs if d]


def test_plain_default_queues_have_quota_zero_and_no_limit() -> None:
    queues = _default_queue_docs()
    assert {q["metadata"]["name"] for q in queues} == {"default-parent-queue", "default-queue"}
    for q in queues:
        for r in RESOURCES:
            assert q["spec"]["resources"][r] == {"quota": 0, "limit": -1, "overQuotaWeight": 1}


def test_chart_default_queues_have_quota_zero_and_no_limit() -> None:
    values = yaml.safe_load((ROOT / "manifests" / "chart" / "values.yaml").read_text())
    for key in ("parentResources", "childResources"):
        for r in RESOURCES:
            got = values["defaultQueues"][key][r]
            assert got == {"quota": 0, "limit": -1, "overQuotaWeight": 1}, (key, r)


def test_examples_readme_shows_the_default_quota() -> None:
    text = (ROOT / "examples" / "README.md").read_text()
    rows = [line.split() for line in text.splitlines() if line.startswith("default-")]
    assert rows, "the queue table of examples/README.md lists the default queues"
    for row in rows:
        quota = row[2] if row[0] == "default-parent-queue" else row[3]
        assert quota == "0", row


def test_taking_back_doc_covers_every_field() -> None:
    text = (ROOT / "docs" / "taking-back.md").read_text()
    for needle in (
        "preemptMinRuntime",
        "reclaimMinRuntime",
        "preemptionDelay",
        PREEMPTION_DELAY_ANNOTATION,
        PREEMPTIBILITY_LABEL,
        "preemptibility",
        "preemptionPolicy: Never",
        "consolidation_max_pods",
        "DisruptionTarget",
        "PreemptionByScheduler",
        "PodDisruptionBudget",
        "minMember",
        "quota: 0",
    ):
        assert needle in text, needle
    assert "```yaml" in text
