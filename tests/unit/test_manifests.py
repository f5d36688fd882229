"""Static checks of crds/, manifests/ (plain YAML and the Helm chart) and examples/."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

__all__: list[str] = []

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "crds"
MANIFESTS = ROOT / "manifests"
CHART = MANIFESTS / "chart"
EXAMPLES = ROOT / "examples"

Doc = dict[str, Any]

# What the scheduler needs, as (apiGroup, resource, verb); nothing more may be granted.
REQUIRED_CLUSTER_PERMISSIONS: set[tuple[str, str, str]] = {
    *{("", "pods", v) for v in ("get", "list", "watch", "delete")},
    ("", "pods/binding", "create"),
    ("", "pods/eviction", "create"),
    ("", "pods/status", "patch"),
    ("", "pods/status", "update"),
    *{("", r, v) for r in ("nodes", "namespaces") for v in ("get", "list", "watch")},
    *{(g, "events", v) for g in ("", "events.k8s.io") for v in ("create", "patch", "update")},
    *{
        ("scheduling.run.ai", r, v)
        for r in ("queues", "podgroups")
        for v in ("get", "list", "watch")
    },
    *{
        ("scheduling.run.ai", r, v)
        for r in ("queues/status", "podgroups/status")
        for v in ("get", "patch", "update")
    },
    *{
        ("scheduling.volcano.sh", r, v)
        for r in ("queues", "podgroups")
        for v in ("get", "list", "watch")
    },
    *{
        ("scheduling.volcano.sh", r, v)
        for r in ("queues/status", "podgroups/status")
        for v in ("patch", "update")
    },
    ("scheduling.volcano.sh", "podgroups", "patch"),
    ("scheduling.volcano.sh", "queues", "create"),
    *{("scheduling.k8s.io", "priorityclasses", v) for v in ("get", "list", "watch")},
    *{("policy", "poddisruptionbudgets", v) for v in ("list", "watch")},
    # Read; volumes patched only to bind WaitForFirstConsumer claims (spec.claimRef).
    *{
        ("", r, v)
        for r in ("persistentvolumeclaims", "persistentvolumes")
        for v in ("get", "list", "watch")
    },
    ("", "persistentvolumes", "patch"),
    *{("storage.k8s.io", "storageclasses", v) for v in ("get", "list", "watch")},
    # DRA: read; a claim's status written before its pods are bound, the claim itself
    # updated only to add the delete-protection finalizer to a claim the scheduler allocates,
    # and the claim for a pod's DRA-backed extended resources created (deleted on failure).
    *{
        ("resource.k8s.io", r, v)
        for r in ("deviceclasses", "resourceslices", "resourceclaims")
        for v in ("get", "list", "watch")
    },
    *{("resource.k8s.io", "resourceclaims", v) for v in ("create", "update", "delete")},
    *{("resource.k8s.io", "resourceclaims/status", v) for v in ("update", "patch")},
    ("resource.k8s.io", "resourceclaims/binding", "update"),
    # GET /debug/snapshot reviews the caller's token and access (scheduler.debug_snapshot).
    ("authentication.k8s.io", "tokenreviews", "create"),
    ("authorization.k8s.io", "subjectaccessreviews", "create"),
    # GPU sharing writes each sharing pod's device ConfigMap (never reads ConfigMaps).
    ("", "configmaps", "create"),
    ("", "configmaps", "update"),
}
REQUIRED_LEASE_PERMISSIONS = {
    ("coordination.k8s.io", "leases", v) for v in ("get", "create", "update", "patch")
}
# GPU sharing's reservation pods, in their own namespace only (manifests/25-gpu-sharing.yaml).
RESERVATION_NAMESPACE = "kai-resource-reservation"
REQUIRED_RESERVATION_PERMISSIONS = {("", "pods", v) for v in ("get", "create", "delete")}


def _load_all(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _plain_manifest_files() -> list[Path]:
    return sorted(MANIFESTS.glob("*.yaml")) + sorted((MANIFESTS / "defaults").glob("*.yaml"))


def _plain_docs() -> list[Doc]:
    return [d for p in _plain_manifest_files() for d in _load_all(p)]


def _by_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def _scheduler_objects(docs: list[Doc]) -> list[Doc]:
    """The scheduler's own objects (the pod grouper's are checked in test_podgrouper_manifests)."""
    return [
        d
        for d in docs
        if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") != "podgrouper"
    ]


def _crd(plural: str) -> Doc:
    docs = _load_all(CRDS / f"scheduling.run.ai_{plural}.yaml")
    assert len(docs) == 1
    return docs[0]


def _triples(rules: list[Doc]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def _rules_block(text: str, after: str) -> list[Doc]:
    """The literal `rules:` list that follows `kind: <after>` in a (possibly templated) file."""
    start = text.index(f"kind: {after}\n")
    rules_at = text.index("rules:\n", start)
    end = text.find("\n---", rules_at)
    block = text[rules_at : end if end != -1 else len(text)]
    assert "{{" not in block, "the rules must be plain YAML in the chart too"
    parsed: list[Doc] = yaml.safe_load(block)["rules"]
    return parsed


ALL_YAML = sorted(
    [*CRDS.glob("*.yaml"), *_plain_manifest_files(), *EXAMPLES.glob("*.yaml")],
    key=str,
)


@pytest.mark.parametrize("path", ALL_YAML, ids=lambda p: str(p.relative_to(ROOT)))
def test_yaml_parses_into_named_objects(path: Path) -> None:
    docs = _load_all(path)
    assert docs, f"{path} is empty"
    for doc in docs:
        assert {"apiVersion", "kind", "metadata"} <= doc.keys(), doc
        assert doc["metadata"].get("name"), doc


def test_chart_crds_are_identical_to_crds_dir() -> None:
    ours = {p.name: p.read_bytes() for p in CRDS.glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert set(ours) == set(chart)
    for name, content in ours.items():
        assert chart[name] == content, f"manifests/chart/crds/{name} differs from crds/{name}"


def test_only_our_two_crds_are_shipped() -> None:
    names = {_load_all(p)[0]["metadata"]["name"] for p in CRDS.glob("*.yaml")}
    assert names == {"queues.scheduling.run.ai", "podgroups.scheduling.run.ai"}
    assert not _by_kind(_plain_docs(), "CustomResourceDefinition"), "CRDs belong in crds/"


def test_queue_crd_shape() -> None:
    crd = _crd("queues")
    assert crd["spec"]["scope"] == "Cluster"
    (version,) = crd["spec"]["versions"]
    assert (
        version["name"] == "v2" and version["storage"] and version["subresources"] == {"status": {}}
    )
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    for name in ("Priority", "Parent", "GPU Quota", "GPU Limit", "GPU Allocated", "Age"):
        assert name in columns and columns[name].get("priority", 0) == 0, name
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert spec["priority"]["default"] == 100
    for resource in ("gpu", "cpu", "memory"):
        props = spec["resources"]["properties"][resource]["properties"]
        assert props["limit"]["default"] == -1, "an omitted limit means unlimited (not KAI's 0)"
        assert {"quota", "overQuotaWeight", "limit"} <= props.keys()
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert {"allocated", "requested", "fairShare", "childQueues", "conditions"} <= status.keys()


def test_podgroup_crd_shape() -> None:
    crd = _crd("podgroups")
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"]["shortNames"] == ["pg"]
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v2alpha2" and version["subresources"] == {"status": {}}
    visible = [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority", 0) == 0]
    assert visible == ["Queue", "MinMember", "Phase", "Age"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    expected = {
        "minMember",
        "queue",
        "priorityClassName",
        "preemptibility",
        "stalenessGracePeriod",
        "markUnschedulable",
        "subGroups",
        "topologyConstraint",
    }
    assert expected <= spec.keys()
    assert spec["preemptibility"]["enum"] == ["preemptible", "non-preemptible"]


def test_every_cel_rule_has_a_message() -> None:
    def walk(node: Any) -> list[Doc]:
        found: list[Doc] = []
        if isinstance(node, dict):
            found += node.get("x-kubernetes-validations", [])
            for value in node.values():
                found += walk(value)
        elif isinstance(node, list):
            for value in node:
                found += walk(value)
        return found

    rules = walk(_crd("queues")) + walk(_crd("podgroups"))
    assert len(rules) >= 8
    for rule in rules:
        assert rule.get("message") or rule.get("messageExpression"), rule["rule"]


@pytest.mark.parametrize("verbs_or_resources", ["verbs", "resources", "apiGroups"])
def test_rbac_has_no_wildcards(verbs_or_resources: str) -> None:
    for kind in ("ClusterRole", "Role"):
        for role in _by_kind(_plain_docs(), kind):
            for rule in role["rules"]:
                assert "*" not in rule[verbs_or_resources], (role["metadata"]["name"], rule)


def test_rbac_grants_exactly_what_the_scheduler_needs() -> None:
    docs = _scheduler_objects(_plain_docs())
    (cluster_role,) = _by_kind(docs, "ClusterRole")
    roles = {r["metadata"]["namespace"]: r for r in _by_kind(docs, "Role")}
    granted = _triples(cluster_role["rules"])
    assert not {t for t in granted if t[1] == "secrets"}
    assert {t[2] for t in granted if t[1] == "configmaps"} == {"create", "update"}
    assert granted == REQUIRED_CLUSTER_PERMISSIONS
    assert set(roles) == {"kai-scheduler", RESERVATION_NAMESPACE}
    assert _triples(roles["kai-scheduler"]["rules"]) == REQUIRED_LEASE_PERMISSIONS
    assert _triples(roles[RESERVATION_NAMESPACE]["rules"]) == REQUIRED_RESERVATION_PERMISSIONS


def test_chart_rbac_rules_match_plain_manifests() -> None:
    plain = (MANIFESTS / "20-rbac.yaml").read_text()
    chart = (CHART / "templates" / "rbac.yaml").read_text()
    for kind in ("ClusterRole", "Role"):
        assert _triples(_rules_block(chart, kind)) == _triples(_rules_block(plain, kind)), kind


def test_rbac_bindings_point_at_the_service_account() -> None:
    docs = _scheduler_objects(_plain_docs())
    (sa,) = _by_kind(docs, "ServiceAccount")
    roles = {(r["kind"], r["metadata"]["name"]) for r in _by_kind(docs, "ClusterRole")}
    roles |= {(r["kind"], r["metadata"]["name"]) for r in _by_kind(docs, "Role")}
    bindings = _by_kind(docs, "ClusterRoleBinding") + _by_kind(docs, "RoleBinding")
    # One binding per role, each to the scheduler's ServiceAccount.
    assert {(b["roleRef"]["kind"], b["roleRef"]["name"]) for b in bindings} == roles
    assert len(bindings) == len(roles)
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "kai-scheduler"}
        ]


def test_deployment_is_hardened_and_probed() -> None:
    docs = _scheduler_objects(_plain_docs())
    (deployment,) = _by_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "kai-scheduler"
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert {"cpu", "memory"} <= container["resources"]["requests"].keys()
    args = container["args"]
    assert args[0] == "run"
    assert "--scheduler-name=kai-scheduler" in args
    assert "--config=/etc/kai-scheduler/config.yaml" in args
    assert any(a.startswith("--leader-elect=") for a in args)
    (service,) = _by_kind(docs, "Service")
    assert (
        service["spec"]["selector"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )


def test_scheduler_config_has_the_documented_keys() -> None:
    (config_map,) = _by_kind(_plain_docs(), "ConfigMap")
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    assert set(config) == {
        "placement",
        "cyclePeriod",
        "solverTimeLimit",
        "defaultQueue",
        "stalenessGracePeriod",
        "podGrouper",
    }
    assert config["podGrouper"] is True  # the pod grouper ships in the same manifests
    assert set(config["placement"]) == {"gpu", "cpu", "scoring"}
    assert {config["placement"]["gpu"], config["placement"]["cpu"]} <= {"binpack", "spread"}
    assert config["placement"]["scoring"] in {"packing", "fragmentation"}
    assert config["defaultQueue"] == "default-queue"
    for key in ("cyclePeriod", "solverTimeLimit", "stalenessGracePeriod"):
        assert re.fullmatch(r"[0-9.]+(ms|s|m)", str(config[key])), key


def test_default_queues_and_priority_classes() -> None:
    docs = _plain_docs()
    queues = {q["metadata"]["name"]: q for q in _by_kind(docs, "Queue")}
    assert set(queues) == {"default-parent-queue", "default-queue"}
    assert queues["default-queue"]["spec"]["parentQueue"] == "default-parent-queue"
    assert "parentQueue" not in queues["default-parent-queue"]["spec"]
    classes = {p["metadata"]["name"]: p["value"] for p in _by_kind(docs, "PriorityClass")}
    assert classes == {"train": 50, "build-preemptible": 75, "build": 100, "inference": 125}
    # Queues must not be in the files `kubectl apply -f crds/ -f manifests/` reads: the Queue
    # kind is unknown to kubectl until the CRD from the same command is established.
    top_level = [d for p in sorted(MANIFESTS.glob("*.yaml")) for d in _load_all(p)]
    assert not _by_kind(top_level, "Queue")


def test_chart_default_values_match_plain_manifests() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["replicas"] == 1 and values["leaderElection"]["enabled"] == "auto"
    assert values["defaultQueues"]["enabled"] is True
    assert values["defaultQueues"]["childName"] == "default-queue"
    assert values["defaultQueues"]["parentName"] == "default-parent-queue"
    assert values["placementStrategy"] in ("binpack", "spread")
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "kai-scheduler"
