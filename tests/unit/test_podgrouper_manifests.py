"""The pod grouper in the shipped YAML: its own ServiceAccount, least-privilege ClusterRole and
hardened Deployment in manifests/70-podgrouper.yaml, the same rules in the Helm chart (on by
default, with a switch), and flags the CLI accepts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from scheduler.cli import _normalise, build_parser
from scheduler.podgrouper.cli import settings_from_args

ROOT = Path(__file__).resolve().parents[2]
PLAIN = ROOT / "manifests" / "70-podgrouper.yaml"
CHART = ROOT / "manifests" / "chart"
TEMPLATE = CHART / "templates" / "podgrouper.yaml"

Doc = dict[str, Any]

#: Exactly what the grouper uses, as (apiGroup, resource, verb).
REQUIRED: set[tuple[str, str, str]] = {
    *{("", "pods", v) for v in ("get", "list", "watch", "patch")},
    ("batch", "jobs", "get"),
    ("batch", "cronjobs", "get"),
    ("apps", "replicasets", "get"),
    ("apps", "deployments", "get"),
    ("apps", "statefulsets", "get"),
    ("leaderworkerset.x-k8s.io", "leaderworkersets", "get"),
    *{("scheduling.run.ai", "podgroups", v) for v in ("get", "list", "watch", "create", "patch")},
    ("scheduling.run.ai", "queues", "get"),
    ("scheduling.k8s.io", "priorityclasses", "get"),
    ("", "events", "create"),
}


def _docs() -> list[Doc]:
    return [d for d in yaml.safe_load_all(PLAIN.read_text()) if d]


def _one(kind: str) -> Doc:
    (doc,) = [d for d in _docs() if d["kind"] == kind]
    return doc


def _triples(rules: list[Doc]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def _template_rules() -> list[Doc]:
    text = TEMPLATE.read_text()
    start = text.index("rules:\n", text.index("kind: ClusterRole\n"))
    block = text[start : text.index("\n---", start)]
    assert "{{" not in block, "the rules must be plain YAML in the chart too"
    rules: list[Doc] = yaml.safe_load(block)["rules"]
    return rules


def test_podgrouper_role_grants_exactly_what_it_uses() -> None:
    role = _one("ClusterRole")
    granted = _triples(role["rules"])
    assert granted == REQUIRED
    for rule in role["rules"]:
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[key], rule
    assert not {t for t in granted if t[1] in ("secrets", "configmaps")}
    assert not {t for t in granted if t[2] in ("delete", "deletecollection", "update")}
    assert ("", "pods/binding", "create") not in granted, "binding is the scheduler's alone"


def test_podgrouper_has_its_own_service_account_and_binding() -> None:
    sa = _one("ServiceAccount")
    assert sa["metadata"] == {
        "name": "kai-podgrouper",
        "namespace": "kai-scheduler",
        "labels": sa["metadata"]["labels"],
    }
    binding = _one("ClusterRoleBinding")
    assert binding["roleRef"]["name"] == _one("ClusterRole")["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "kai-podgrouper", "namespace": "kai-scheduler"}
    ]


def test_podgrouper_deployment_is_hardened_probed_and_runs_the_subcommand() -> None:
    deploy = _one("Deployment")
    assert deploy["metadata"]["namespace"] == "kai-scheduler"
    assert deploy["spec"]["replicas"] == 1
    pod = deploy["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "kai-podgrouper"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert {"cpu", "memory"} <= container["resources"]["requests"].keys()
    args = container["args"]
    assert args[0] == "podgrouper"
    # The flags are the CLI's own: they parse, and mean what the manifest says.
    parsed = build_parser(with_simulate=False).parse_args(_normalise(args))
    settings, connection = settings_from_args(parsed)
    assert settings.grouper.scheduler_names == frozenset({"kai-scheduler"})
    assert settings.grouper.default_queue == "default-queue"
    assert connection.kube_config is None, "in-cluster ServiceAccount"
    port = container["ports"][0]["containerPort"]
    assert f"--metrics-address=:{port}" in args


def test_cli_takes_several_scheduler_names_like_run() -> None:
    argv = ["podgrouper", "--scheduler-name=a,b", "--scheduler-name", "c", "--default-queue=q"]
    settings, _ = settings_from_args(build_parser(with_simulate=False).parse_args(argv))
    assert settings.grouper.scheduler_names == frozenset({"a", "b", "c"})
    assert settings.grouper.default_queue == "q"


def test_scheduler_service_does_not_select_the_podgrouper() -> None:
    service = yaml.safe_load((ROOT / "manifests" / "50-service.yaml").read_text())
    labels = _one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert not service["spec"]["selector"].items() <= labels.items()


def test_chart_podgrouper_rules_match_plain_manifest() -> None:
    assert _triples(_template_rules()) == _triples(_one("ClusterRole")["rules"])


def test_chart_podgrouper_is_on_by_default_with_a_switch() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["podgrouper"]["enabled"] is True
    assert values["podgrouper"]["replicas"] == 1
    text = TEMPLATE.read_text()
    assert text.startswith("{{- if .Values.podgrouper.enabled }}")
    assert text.rstrip().endswith("{{- end }}")
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    assert schema["properties"]["podgrouper"]["properties"]["enabled"] == {"type": "boolean"}


def test_docs_describe_the_grouper() -> None:
    text = (ROOT / "docs" / "podgrouper.md").read_text()
    for needle in (
        "kai.scheduler/batch-min-member",
        "kai.scheduler/skip-podgrouper",
        "kai.scheduler/queue",
        "priorityClassName",
        "kai.scheduler/preemptibility",
        "pod-group-name",
        "LeaderWorkerSet",
        "QueueNotFound",
        "PodGroupEditReverted",
        "OwnerDeleted",
        "podgrouper.enabled",
    ):
        assert needle in text, needle
