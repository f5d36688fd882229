"""The chart's alert rules and dashboard through the real tools: promtool (built from the
pinned Prometheus Go module by testenv/build_tools.sh) checks and unit-tests the rules, helm
(testenv/build.sh) renders and lints the chart with the monitoring flags on.

No control plane is needed; these run with the e2e tests because the tools come from setup.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from testenv.binaries import find_bin_dir
from testenv.tools import find_tool, pinned_version
from tests.monitoring.assets import CHART, RULES, RULES_TEST, load_dashboard, load_rules

__all__: list[str] = []

pytestmark = pytest.mark.e2e

FLAGS = ("monitoring.grafanaDashboard.enabled=true", "monitoring.prometheusRule.enabled=true")


def _run(*argv: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def _promtool(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return _run(find_tool("promtool"), *args, cwd=cwd)


def _helm(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    # helm's own state (cache, config) in the test's folder, not in $HOME.
    env = {
        "HOME": str(tmp),
        "PATH": "/usr/bin:/bin",
        **{f"HELM_{k}_HOME": str(tmp / k.lower()) for k in ("CACHE", "CONFIG", "DATA")},
    }
    argv = [str(find_bin_dir() / "helm"), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)


def _render(tmp: Path, *sets: str) -> list[dict[str, Any]]:
    argv = ["template", "kai-scheduler", str(CHART), "-n", "kai-scheduler"]
    for s in sets:
        argv += ["--set", s]
    out = _helm(*argv, tmp=tmp)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_promtool_is_the_pinned_version() -> None:
    out = _promtool("--version")
    assert out.returncode == 0, out.stderr
    assert pinned_version("PROMETHEUS_VERSION") in out.stdout + out.stderr


def test_promtool_checks_the_rules_file() -> None:
    out = _promtool("check", "rules", RULES)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 3 rules found" in out.stdout


def test_promtool_rejects_a_broken_rule(tmp_path: Path) -> None:
    rules = load_rules()
    rules["groups"][0]["rules"][2]["expr"] = "max by (queue) (kai_pending_gang_max_wait_seconds"
    broken = tmp_path / "broken.rules.yaml"
    broken.write_text(yaml.safe_dump(rules))
    out = _promtool("check", "rules", broken)
    assert out.returncode != 0
    assert "KaiGangPendingTooLong" in out.stdout + out.stderr or "parse" in out.stderr


def test_promtool_unit_tests_fire_each_alert_only_when_they_should() -> None:
    out = _promtool("test", "rules", RULES_TEST.name, cwd=RULES_TEST.parent)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_the_unit_tests_fail_when_a_threshold_changes(tmp_path: Path) -> None:
    rules = load_rules()
    rule = rules["groups"][0]["rules"][2]
    rule["expr"] = rule["expr"].replace("> 900", "> 1800")
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "r.yaml").write_text(yaml.safe_dump(rules))
    test = yaml.safe_load(RULES_TEST.read_text())
    test["rule_files"] = ["rules/r.yaml"]
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(test))
    out = _promtool("test", "rules", "t.yaml", cwd=tmp_path)
    assert out.returncode != 0
    assert "KaiGangPendingTooLong" in out.stdout + out.stderr


def test_helm_renders_nothing_of_it_by_default(tmp_path: Path) -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in _render(tmp_path)}
    assert ("ConfigMap", "kai-scheduler-dashboard") not in kinds
    assert not [k for k in kinds if k[0] == "PrometheusRule"]


def test_helm_renders_the_dashboard_configmap_and_the_rules(tmp_path: Path) -> None:
    docs = _render(tmp_path, *FLAGS, "monitoring.grafanaDashboard.annotations.grafana_folder=KAI")
    (cm,) = [d for d in docs if d["metadata"]["name"] == "kai-scheduler-dashboard"]
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["namespace"] == "kai-scheduler"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"  # what the sidecar selects
    assert cm["metadata"]["annotations"] == {"grafana_folder": "KAI"}
    assert json.loads(cm["data"]["kai-scheduler.json"]) == load_dashboard()
    assert len(json.dumps(cm)) < 1_000_000  # a ConfigMap holds at most 1 MiB
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    # The plain rules file is exactly what the chart renders with its defaults.
    assert rule["spec"] == load_rules()


def test_rendered_rules_follow_the_values_and_pass_promtool(tmp_path: Path) -> None:
    docs = _render(
        tmp_path,
        *FLAGS,
        "monitoring.prometheusRule.gangPendingMinutes=30",
        "monitoring.prometheusRule.labels.release=kube-prometheus-stack",
    )
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    pending = rule["spec"]["groups"][0]["rules"][2]
    assert pending["alert"] == "KaiGangPendingTooLong"
    assert pending["expr"].rstrip().endswith("> 1800")
    assert "more than 30 minutes" in pending["annotations"]["summary"]
    path = tmp_path / "rendered.rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    out = _promtool("check", "rules", path)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("monitoring.prometheusRule.gangPendingMinutes=0", "gangPendingMinutes"),
        ("monitoring.grafanaDashboard.enabled=maybe", "/monitoring/grafanaDashboard/enabled"),
    ],
)
def test_the_values_schema_rejects_bad_monitoring_values(
    tmp_path: Path, value: str, message: str
) -> None:
    out = _helm("template", "kai-scheduler", str(CHART), "--set", value, tmp=tmp_path)
    assert out.returncode != 0
    assert message in out.stderr


def test_helm_lint_passes_with_the_flags_on(tmp_path: Path) -> None:
    out = _helm("lint", str(CHART), "--strict", "--set", ",".join(FLAGS), tmp=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
