"""`kai-scheduler doctor`'s pure parts: the verdict of each check from API objects (the
shipped manifests where there are some), the RBAC list against manifests/20-rbac.yaml, the
report (rich table, plain text, JSON shape) and exit codes."""

from __future__ import annotations

import io
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from scheduler.cli import main
from scheduler.doctor import judge_cluster as jc
from scheduler.doctor import judge_install as ji
from scheduler.doctor.install import Install, container_flags, install_from
from scheduler.doctor.rbac import CLUSTER_RULES, LEADER_ELECTION_RULES, Permission, permissions
from scheduler.doctor.report import render, render_plain, render_table, to_json
from scheduler.doctor.result import CheckResult, Status, exit_code, worst
from scheduler.metrics import SchedulerMetrics

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
NOW = 1_900_000_000.0


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _shipped_install() -> Install:
    (deployment,) = _docs(MANIFESTS / "40-deployment.yaml")
    (config_map,) = _docs(MANIFESTS / "30-configmap.yaml")
    return install_from("kai-scheduler", [deployment], {"kai-scheduler-config": config_map})


def _pod(name: str, *, running: bool = True, ready: bool = True, **extra: Any) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {
        "metadata": {"name": name, "namespace": "kai-scheduler", **extra.pop("meta", {})},
        "spec": {"nodeName": "n1" if running else "", **extra.pop("spec", {})},
        "status": {"phase": "Running" if running else "Pending", "conditions": conditions,
                   **extra.pop("status", {})},
    }  # fmt: skip


# ---------------------------------------------------------------- RBAC list


def _shipped_rules(kind: str) -> list[dict[str, Any]]:
    (role,) = [d for d in _docs(MANIFESTS / "20-rbac.yaml") if d["kind"] == kind]
    return list(role["rules"])


def test_rbac_list_is_the_shipped_cluster_role_and_role() -> None:
    assert [r.as_k8s() for r in CLUSTER_RULES] == _shipped_rules("ClusterRole")
    assert [r.as_k8s() for r in LEADER_ELECTION_RULES] == _shipped_rules("Role")


def test_permissions_expand_every_verb_group_and_resource() -> None:
    perms = permissions(CLUSTER_RULES)
    assert Permission("create", "", "pods/binding") in perms
    assert Permission("patch", "events.k8s.io", "events") in perms
    assert len(perms) == len(set(perms))
    assert Permission("create", "", "pods/binding").describe() == "create pods/binding"
    assert (
        Permission("patch", "scheduling.run.ai", "queues/status").describe()
        == "patch queues.scheduling.run.ai/status"
    )
    assert Permission("create", "", "pods/eviction").attributes("ns") == {
        "verb": "create", "group": "", "resource": "pods", "subresource": "eviction",
        "namespace": "ns",
    }  # fmt: skip


# ---------------------------------------------------------------- install discovery


def test_install_from_the_shipped_manifests() -> None:
    install = _shipped_install()
    assert install.name == "kai-scheduler"
    assert install.service_account == "kai-scheduler"
    assert install.scheduler_names == ("kai-scheduler",)
    assert install.leader_elect is False
    assert install.metrics_port == 8080
    assert install.config_map == "kai-scheduler-config"
    assert install.config.default_queue == "default-queue"
    assert install.config.pod_grouper is True
    assert install.lease == ("kai-scheduler", "kai-scheduler")
    assert install.config_error == ""


def test_install_reports_a_missing_or_broken_config_map() -> None:
    (deployment,) = _docs(MANIFESTS / "40-deployment.yaml")
    missing = install_from("kai-scheduler", [deployment], {})
    assert "kai-scheduler-config" in missing.config_error
    assert "does not exist" in missing.config_error
    bad = {"data": {"config.yaml": "cyclePeriod: soon\n"}}
    broken = install_from("kai-scheduler", [deployment], {"kai-scheduler-config": bad})
    assert "cyclePeriod" in broken.config_error
    verdict = ji.judge_deployment(broken, [_pod("p")])
    assert verdict.status is Status.FAIL and "kubectl edit configmap" in verdict.fix


def test_container_flags_both_spellings() -> None:
    flags = container_flags(["run", "--leader-elect", "--scheduler-name", "a", "--x=1",
                             "--scheduler-name=b,c"])  # fmt: skip
    assert flags == {"leader-elect": ["true"], "scheduler-name": ["a", "b,c"], "x": ["1"]}


# ---------------------------------------------------------------- deployment and leader


def test_deployment_verdicts() -> None:
    install = _shipped_install()
    none = ji.judge_deployment(Install(namespace="ops"), [])
    assert none.status is Status.FAIL and "helm install kai-scheduler" in none.fix
    assert "-n ops" in none.fix
    ok = ji.judge_deployment(install, [_pod("kai-scheduler-abc")])
    assert ok.status is Status.OK and "1/1" in ok.message
    scaled = ji.judge_deployment(Install(**{**install.__dict__, "replicas": 0}), [])
    assert scaled.status is Status.FAIL and "scaled to 0" in scaled.message
    assert "kubectl scale deployment/kai-scheduler -n kai-scheduler --replicas=1" in scaled.fix
    pending = _pod(
        "p",
        running=False,
        status={
            "conditions": [
                {"type": "PodScheduled", "status": "False", "message": "0/3 nodes are available"}
            ]
        },
    )
    stuck = ji.judge_deployment(install, [pending])
    assert stuck.status is Status.FAIL and "0/3 nodes are available" in stuck.message
    crash = _pod(
        "c",
        ready=False,
        status={
            "containerStatuses": [
                {"name": "scheduler", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
            ]
        },
    )
    assert "CrashLoopBackOff" in ji.judge_deployment(install, [crash]).message
    several = Install(**{**install.__dict__, "replicas": 2})
    assert ji.judge_deployment(several, []).status is Status.FAIL


def _lease(holder: str, renewed: float, duration: int = 15) -> dict[str, Any]:
    renew = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(renewed))
    return {"spec": {"holderIdentity": holder, "renewTime": renew,
                     "leaseDurationSeconds": duration}}  # fmt: skip


def test_leader_verdicts() -> None:
    elected = Install(**{**_shipped_install().__dict__, "leader_elect": True})
    pods = [_pod("kai-scheduler-abc")]
    assert ji.judge_leader(_shipped_install(), None, pods, NOW).status is Status.OK
    missing = ji.judge_leader(elected, None, pods, NOW)
    assert (
        missing.status is Status.FAIL and "no Lease kai-scheduler/kai-scheduler" in missing.message
    )
    good = ji.judge_leader(elected, _lease("kai-scheduler-abc_1234", NOW - 2), pods, NOW)
    assert good.status is Status.OK and "kai-scheduler-abc" in good.message
    stale = ji.judge_leader(elected, _lease("kai-scheduler-abc_1234", NOW - 60), pods, NOW)
    assert stale.status is Status.FAIL and "60s ago" in stale.message
    foreign = ji.judge_leader(elected, _lease("laptop_99", NOW - 1), pods, NOW)
    assert foreign.status is Status.WARN and "leaseName" in foreign.fix


# ---------------------------------------------------------------- cycle age


def test_cycle_age_from_the_schedulers_own_metrics() -> None:
    metrics = SchedulerMetrics()
    follower = ji.judge_cycle_from_metrics(metrics.render().decode(), time.time(), 1.0, "pod p")
    assert follower.status is Status.WARN and "not the leader" in follower.message
    metrics.leader.set(1)
    never = ji.judge_cycle_from_metrics(metrics.render().decode(), time.time(), 1.0, "pod p")
    assert never.status is Status.FAIL and "no cycle has run yet" in never.message
    metrics.observe_cycle(0.01, 0.005)
    text = metrics.render().decode()
    ok = ji.judge_cycle_from_metrics(text, time.time(), 1.0, "pod p")
    assert ok.status is Status.OK and ok.source == "metrics" and "1 cycles" in ok.message
    late = ji.judge_cycle_from_metrics(text, time.time() + 120, 1.0, "pod p")
    assert late.status is Status.FAIL and "120s ago" in late.message
    other = ji.judge_cycle_from_metrics("up 1\n", time.time(), 1.0, "http://x/metrics")
    assert other.status is Status.WARN


def test_cycle_age_falls_back_to_the_lease() -> None:
    elected = Install(**{**_shipped_install().__dict__, "leader_elect": True})
    ok = ji.judge_cycle_from_lease(elected, _lease("a_1", NOW - 1), NOW, "timeout")
    assert ok.status is Status.OK and ok.source == "lease" and "timeout" in ok.message
    dead = ji.judge_cycle_from_lease(elected, _lease("a_1", NOW - 99), NOW, "timeout")
    assert dead.status is Status.FAIL
    blind = ji.judge_cycle_from_lease(_shipped_install(), None, NOW, "timeout")
    assert blind.status is Status.WARN and "port-forward" in blind.fix


# ---------------------------------------------------------------- CRDs, queues, classes


def _established(crd: dict[str, Any]) -> dict[str, Any]:
    return {**crd, "status": {"conditions": [{"type": "Established", "status": "True"}]}}


def _shipped_crds() -> dict[str, dict[str, Any] | None]:
    out: dict[str, dict[str, Any] | None] = {}
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        for doc in _docs(path):
            out[doc["metadata"]["name"]] = _established(doc)
    return out


def test_crd_verdicts() -> None:
    crds = _shipped_crds()
    assert ji.judge_crds(crds).status is Status.OK
    gone = ji.judge_crds({**crds, "podgroups.scheduling.run.ai": None})
    assert (
        gone.status is Status.FAIL
        and "podgroups.scheduling.run.ai is not installed" in gone.message
    )
    assert "kubectl apply -f crds/" in gone.fix
    queue = crds["queues.scheduling.run.ai"]
    assert queue is not None
    old = {**queue, "spec": {**queue["spec"], "versions": [{"name": "v1", "served": True}]}}
    wrong = ji.judge_crds({**crds, "queues.scheduling.run.ai": old})
    assert wrong.status is Status.FAIL and "does not serve v2 (serves v1)" in wrong.message
    pending = {**queue, "status": {}}
    assert "not Established" in ji.judge_crds({**crds, "queues.scheduling.run.ai": pending}).message


def _queue(name: str, parent: str = "", **resources: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"parentQueue": parent} if parent else {}
    if resources:
        spec["resources"] = resources
    return {"metadata": {"name": name}, "spec": spec}


def test_queue_verdicts() -> None:
    shipped = _docs(MANIFESTS / "defaults" / "queues.yaml")
    ok = ji.judge_queues(shipped, "default-queue")
    assert ok.status is Status.OK and "default-queue <- default-parent-queue" in ok.message
    gone = ji.judge_queues(shipped[:1], "default-queue")
    assert gone.status is Status.FAIL and "queue default-queue does not exist" in gone.message
    assert "kubectl apply -f manifests/defaults/" in gone.fix
    custom = ji.judge_queues(shipped[:1], "team-q")
    assert "create the leaf Queue team-q" in custom.fix
    parent_only = ji.judge_queues(shipped, "default-parent-queue")
    assert parent_only.status is Status.FAIL and "child queues" in parent_only.message
    loop = [*shipped, _queue("a", "b"), _queue("b", "a")]
    cyc = ji.judge_queues(loop, "default-queue")
    assert cyc.status is Status.FAIL and "cycle" in cyc.message and len(cyc.details) == 2
    bad = [*shipped, _queue("x", gpu={"quota": 4, "limit": 2})]
    invalid = ji.judge_queues(bad, "default-queue")
    assert invalid.status is Status.FAIL and "queue x: spec.resources.gpu.limit" in invalid.message
    no_crd = ji.judge_queues(None, "default-queue")
    assert no_crd.status is Status.FAIL and "kubectl apply -f crds/" in no_crd.fix


def test_priority_class_verdicts() -> None:
    shipped = _docs(MANIFESTS / "60-priorityclasses.yaml")
    assert ji.judge_priority_classes(shipped).status is Status.OK
    missing = ji.judge_priority_classes([c for c in shipped if c["metadata"]["name"] != "build"])
    assert missing.status is Status.FAIL and "missing: build " in missing.message
    changed = [{**c, "value": 1} if c["metadata"]["name"] == "train" else c for c in shipped]
    assert ji.judge_priority_classes(changed).status is Status.WARN


# ---------------------------------------------------------------- RBAC, nodes, pending


def test_rbac_verdicts() -> None:
    perms = permissions(CLUSTER_RULES)
    answers = [jc.AccessAnswer(p, None, p.verb != "delete") for p in perms]
    lease = jc.AccessAnswer(Permission("update", "coordination.k8s.io", "leases"), "ns", False)
    subject = "system:serviceaccount:ns:sa"
    fail = jc.judge_rbac([*answers, lease], subject, via_self=False, cluster_role="kai-x")
    assert fail.status is Status.FAIL
    assert fail.message.startswith(f"{subject} may not: delete pods")
    assert "missing: update leases.coordination.k8s.io in ns" in fail.details
    assert "ClusterRole kai-x" in fail.fix
    full = [jc.AccessAnswer(p, None, True) for p in perms]
    assert jc.judge_rbac(full, subject, via_self=False, cluster_role="r").status is Status.OK
    assert jc.judge_rbac(full, subject, via_self=True, cluster_role="r").status is Status.WARN


def _node(name: str, gpus: str | None, ready: bool = True) -> dict[str, Any]:
    resources = {"cpu": "8"} | ({jc.GPU_RESOURCE: gpus} if gpus is not None else {})
    return {"metadata": {"name": name},
            "status": {"capacity": resources, "allocatable": resources,
                       "conditions": [{"type": "Ready", "status": str(ready)}]}}  # fmt: skip


def test_gpu_node_verdicts() -> None:
    none = jc.judge_gpu_nodes([_node("cpu", None), _node("zero", "0")])
    assert none.status is Status.WARN and "none of 2 nodes" in none.message
    assert "device plugin" in none.fix
    ok = jc.judge_gpu_nodes([_node("a", "8"), _node("b", "8"), _node("cpu", None)])
    assert ok.status is Status.OK and "2 nodes" in ok.message and "16 GPUs" in ok.message
    assert jc.judge_gpu_nodes([_node("a", "8", ready=False)]).status is Status.WARN


def _pending(name: str, minutes_ago: float, scheduler: str = "kai-scheduler", **status: Any):
    return {"metadata": {"name": name, "namespace": "t", "uid": f"u-{name}",
                         "creationTimestamp": _iso(NOW - minutes_ago * 60)},
            "spec": {"schedulerName": scheduler, **status.pop("spec", {})},
            "status": {"phase": "Pending", **status}}  # fmt: skip


def test_stuck_pods_and_why() -> None:
    cond = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                            "message": "queue team-a is at its GPU limit"}]}  # fmt: skip
    pods = [
        _pending("old", 30, **cond),
        _pending("young", 1),
        _pending("other", 30, scheduler="default-scheduler"),
        _pending("quiet", 20),
        _pending("gated", 10, spec={"schedulingGates": [{"name": "wait"}]}),
    ]
    stuck = jc.stuck_pods(pods, ("kai-scheduler",), NOW, 5)
    assert [p["metadata"]["name"] for p in stuck] == ["old", "quiet", "gated"]
    events = {
        "u-quiet": [
            {"reason": "Old", "message": "x", "lastTimestamp": _iso(NOW - 600)},
            {"reason": "NotReady", "message": "gang waits", "lastTimestamp": _iso(NOW - 60)},
        ]
    }
    verdict = jc.judge_pending_pods(stuck, events, ("kai-scheduler",), NOW, 5)
    assert verdict.status is Status.WARN and "3 pod(s)" in verdict.message
    assert verdict.details == (
        "t/old (30 min): Unschedulable: queue team-a is at its GPU limit",
        "t/quiet (20 min): NotReady: gang waits",
        "t/gated (10 min): scheduling gates wait are not removed",
    )
    clear = jc.judge_pending_pods([], {}, ("kai-scheduler",), NOW, 5)
    assert clear.status is Status.OK


# ---------------------------------------------------------------- Volcano and LWS


def _crd(name: str, version: str) -> dict[str, Any]:
    return _established({"metadata": {"name": name},
                         "spec": {"versions": [{"name": version, "served": True}]}})  # fmt: skip


def test_volcano_verdicts_never_fail() -> None:
    names = ("kai-scheduler",)
    absent = jc.judge_volcano(dict.fromkeys(jc.VOLCANO_CRDS), names)
    assert absent.status is Status.OK and "not installed" in absent.message
    both = {n: _crd(n, "v1beta1") for n in jc.VOLCANO_CRDS}
    ok = jc.judge_volcano(both, names)
    assert ok.status is Status.OK and "--scheduler-name=volcano" in ok.message
    half = jc.judge_volcano({jc.VOLCANO_CRDS[0]: both[jc.VOLCANO_CRDS[0]]}, names)
    assert half.status is Status.WARN
    old = {n: _crd(n, "v1alpha1") for n in jc.VOLCANO_CRDS}
    assert jc.judge_volcano(old, names).status is Status.WARN


def test_lws_provider_and_verdicts() -> None:
    config = {"apiVersion": "config.lws.x-k8s.io/v1alpha1", "kind": "Configuration",
              "gangSchedulingManagement": {"schedulerProvider": "volcano"}}  # fmt: skip
    maps = [{"metadata": {"name": "other"}, "data": {"x": "not: [yaml"}},
            {"metadata": {"name": "lws-manager-config"},
             "data": {"controller_manager_config.yaml": yaml.safe_dump(config)}}]  # fmt: skip
    provider = jc.lws_provider(maps)
    assert provider == ("lws-manager-config", "volcano")
    lws = _crd(jc.LWS_CRD, "v1")
    kw: dict[str, Any] = {"lws_namespace": "lws-system"}
    absent = jc.judge_lws(None, None, volcano_podgroups=False, podgrouper_ready=False, **kw)
    assert absent.status is Status.OK
    ok = jc.judge_lws(lws, provider, volcano_podgroups=True, podgrouper_ready=False, **kw)
    assert ok.status is Status.OK and "Volcano PodGroup per group" in ok.message
    no_volcano = jc.judge_lws(lws, provider, volcano_podgroups=False, podgrouper_ready=False, **kw)
    assert no_volcano.status is Status.WARN
    plain = jc.lws_provider(
        [
            {
                "metadata": {"name": "c"},
                "data": {"c.yaml": yaml.safe_dump({**config, "gangSchedulingManagement": {}})},
            }
        ]
    )
    assert plain == ("c", "")
    grouped = jc.judge_lws(lws, plain, volcano_podgroups=False, podgrouper_ready=True, **kw)
    assert grouped.status is Status.OK and "pod grouper" in grouped.message
    alone = jc.judge_lws(lws, None, volcano_podgroups=False, podgrouper_ready=False, **kw)
    assert alone.status is Status.WARN and "podgrouper.enabled=true" in alone.fix


# ---------------------------------------------------------------- report and exit codes


def _results() -> list[CheckResult]:
    return [
        CheckResult("api", "API server", Status.OK, "answers"),
        CheckResult("gpu-nodes", "nodes with GPUs", Status.WARN, "none", "install the plugin"),
        CheckResult(
            "crds",
            "CRDs",
            Status.FAIL,
            "queues missing",
            "kubectl apply -f crds/",
            ("detail one",),
            source="x",
        ),
    ]


def test_a_problem_needs_a_fix() -> None:
    with pytest.raises(ValueError, match="needs a fix"):
        CheckResult("x", "X", Status.FAIL, "broken")


def test_exit_codes_and_worst() -> None:
    results = _results()
    assert exit_code(results) == 1 and worst(results) is Status.FAIL
    assert exit_code(results[:2]) == 0 and worst(results[:2]) is Status.WARN
    assert exit_code([]) == 0 and worst([]) is Status.OK


def test_json_shape() -> None:
    out = io.StringIO()
    render(_results(), "json", out)
    doc = json.loads(out.getvalue())
    assert doc == to_json(_results())
    assert doc["status"] == "fail" and doc["exitCode"] == 1
    assert doc["counts"] == {"ok": 1, "warn": 1, "fail": 1}
    assert [c["name"] for c in doc["checks"]] == ["api", "gpu-nodes", "crds"]
    assert doc["checks"][2] == {
        "name": "crds", "title": "CRDs", "status": "fail", "message": "queues missing",
        "fix": "kubectl apply -f crds/", "details": ["detail one"], "source": "x",
    }  # fmt: skip
    assert "source" not in doc["checks"][0]


def test_plain_text_when_not_a_terminal() -> None:
    out = io.StringIO()
    render(_results(), "table", out)  # a StringIO is not a terminal
    text = out.getvalue()
    assert text.splitlines()[0] == "[ok]   api        answers"
    assert "[fail] crds       queues missing" in text
    assert "fix: kubectl apply -f crds/" in text and "- detail one" in text
    assert text.rstrip().endswith("kai-scheduler doctor: fail (1 ok, 1 warn, 1 fail)")
    again = io.StringIO()
    render_plain(_results(), again)
    assert again.getvalue() == text


def test_rich_table() -> None:
    buf = io.StringIO()
    render_table(_results(), Console(file=buf, width=160, color_system=None))
    text = buf.getvalue()
    for cell in ("status", "check", "finding", "fix", "CRDs", "queues missing",
                 "kubectl apply -f crds/", "• detail one", "1 ok, 1 warn, 1 fail"):  # fmt: skip
        assert cell in text, cell


# ---------------------------------------------------------------- the command


@pytest.mark.parametrize(
    "flags",
    [
        ["--pending-minutes", "-1"],
        ["--output", "yaml"],
        ["--timeout", "0"],
        ["--metrics-url", "localhost:8080"],
        ["--kube-api-secure", "maybe"],
    ],
)
def test_bad_flags_exit_2(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["doctor", *flags])
    assert exc.value.code == 2
    assert flags[0] in capsys.readouterr().err


def test_missing_kubeconfig_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor", f"--kube-config={tmp_path / 'nope'}"])
    assert code == 2
    assert "--kube-config" in capsys.readouterr().err


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_api_server_is_one_failed_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    server = f"http://127.0.0.1:{_closed_port()}"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))  # fmt: skip
    code = main(["doctor", f"--kube-config={kubeconfig}", "--output=json", "--timeout=3"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1
    assert [(c["name"], c["status"]) for c in doc["checks"]] == [("api", "fail")]
    assert server in doc["checks"][0]["message"]
