"""``kai-scheduler explain``'s pure parts: target parsing, the model, Events, rendering."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from scheduler.cli import main
from scheduler.inspect.cli import TargetError, default_namespace, parse_target
from scheduler.inspect.events import merge_events
from scheduler.inspect.model import explain_pod, explain_podgroup, queue_name_of, queue_view
from scheduler.inspect.render import MAX_MEMBERS, render, render_plain, render_rich, to_json

NS = "team"


def pod(
    name: str,
    *,
    group: str | None = None,
    node: str | None = None,
    phase: str = "Pending",
    conditions: list[dict[str, Any]] | None = None,
    nominated: str | None = None,
    scheduler: str = "kai-scheduler",
    labels: dict[str, str] | None = None,
    created: str = "2026-01-01T00:00:00Z",
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "conditions": conditions or []}
    if nominated:
        status["nominatedNodeName"] = nominated
    spec: dict[str, Any] = {"schedulerName": scheduler}
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "annotations": {"pod-group-name": group} if group else {},
            "labels": labels or {},
            "creationTimestamp": created,
        },
        "spec": spec,
        "status": status,
    }


def podgroup(
    name: str, min_member: int = 2, queue: str | None = "team-a", **status: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {"minMember": min_member}
    if queue:
        spec["queue"] = queue
    return {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-pg-{name}"},
        "spec": spec,
        "status": status,
    }


def queue(name: str, parent: str | None = None, **status: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"resources": {"gpu": {"quota": 4, "limit": -1, "overQuotaWeight": 1}}}
    if parent:
        spec["parentQueue"] = parent
    return {"metadata": {"name": name}, "spec": spec, "status": status}


def unschedulable(message: str) -> dict[str, Any]:
    return {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": message,
        "lastTransitionTime": "2026-01-01T00:01:00Z",
    }


def pg_condition(reason: str, message: str, status: str = "True") -> list[dict[str, Any]]:
    return [{"type": "Unschedulable", "status": status, "reason": reason, "message": message}]


def event(
    obj: str, reason: str, message: str, when: str, *, kind: str = "Pod", count: int = 1
) -> dict[str, Any]:
    return {
        "involvedObject": {"kind": kind, "name": obj, "namespace": NS},
        "type": "Warning" if reason != "Scheduled" else "Normal",
        "reason": reason,
        "message": message,
        "lastTimestamp": when,
        "count": count,
        "source": {"component": "kai-scheduler"},
    }


QUEUES = {
    "team-a": queue(
        "team-a",
        parent="dept",
        allocated={"gpu": 2, "cpu": 200, "memory": "134.218"},
        allocatedNonPreemptible={"gpu": 0},
        requested={"gpu": 10},
        fairShare={"gpu": 4, "cpu": 400},
        conditions=[{"type": "Valid", "status": "True", "reason": "Valid", "message": ""}],
    ),
    "dept": queue("dept", allocated={"gpu": 6}, fairShare={"gpu": 16}),
}


# --- targets and namespaces -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("pod/a", ("pod", "a")),
        ("pods/a", ("pod", "a")),
        ("po/a", ("pod", "a")),
        ("podgroup/g", ("podgroup", "g")),
        ("pg/g", ("podgroup", "g")),
        ("podgroups.scheduling.run.ai/g", ("podgroup", "g")),
        ("bare", ("", "bare")),
    ],
)
def test_parse_target(text: str, expected: tuple[str, str]) -> None:
    assert parse_target(text) == expected


@pytest.mark.parametrize("text", ["deployment/x", "pod/", "", "pod/a/b", "/a"])
def test_parse_target_rejects_with_the_fix(text: str) -> None:
    with pytest.raises(TargetError, match="pod/"):
        parse_target(text)


def test_bad_target_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "job/train"]) == 2
    assert "explain takes pod/NAME, podgroup/NAME or NAME" in capsys.readouterr().err


def test_bad_flag_value_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["explain", "pod/a", "--events", "-1"])
    assert stop.value.code == 2
    assert "--events" in capsys.readouterr().err


def test_missing_kubeconfig_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["explain", "pod/a", f"--kube-config={tmp_path / 'none'}", "-n", "x"])
    assert code == 2
    assert "--kube-config" in capsys.readouterr().err


def test_default_namespace_from_the_current_context(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        "current-context: b\ncontexts:\n"
        "- {name: a, context: {cluster: c, namespace: other}}\n"
        "- {name: b, context: {cluster: c, namespace: research}}\n"
    )
    assert default_namespace(str(config)) == "research"
    config.write_text("current-context: a\ncontexts:\n- {name: a, context: {cluster: c}}\n")
    assert default_namespace(str(config)) == "default"
    config.write_text(":: not yaml [")
    assert default_namespace(str(config)) == "default"


# --- the model --------------------------------------------------------------------------


def test_bound_pod_is_placed_with_its_gang_and_queue() -> None:
    members = [pod("t-0", group="t", node="n1", phase="Running"),
               pod("t-1", group="t", node="n2", phase="Running")]  # fmt: skip
    scheduled = event(
        "t-0", "Scheduled", "Successfully assigned team/t-0 to n1", "2026-01-01T00:00:05Z"
    )
    e = explain_pod(members[0], podgroup=podgroup("t"), members=members, queues=QUEUES,
                    events=[scheduled])  # fmt: skip
    assert (e.verdict, e.summary) == ("placed", "bound to node n1")
    assert e.message == "Successfully assigned team/t-0 to n1"
    assert e.gang is not None and (e.gang.bound, e.gang.waiting, e.gang.min_member) == (2, 0, 2)
    assert e.gang.nodes == {"n1": 1, "n2": 1}
    assert (
        e.queue is not None and e.queue.name == "team-a" and e.queue.source == "PodGroup spec.queue"
    )
    gpu = e.queue.resources[0]
    assert (gpu.allocated, gpu.fair_share, gpu.requested, gpu.quota, gpu.limit) == (
        "2", "4", "10", "4", "unlimited")  # fmt: skip
    assert [p.name for p in e.queue.parents] == ["dept"]
    assert e.queue.parents[0].resources[0].fair_share == "16"
    assert not e.notes


def test_waiting_pod_carries_the_condition_reason() -> None:
    why = "PodGroup team/t: queue team-a is at its gpu limit (8/8)"
    p = pod("t-0", group="t", conditions=[unschedulable(why)])
    e = explain_pod(p, podgroup=podgroup("t"), members=[p], queues=QUEUES, events=[])
    assert (e.verdict, e.reason, e.message, e.summary) == ("waiting", "Unschedulable", why, why)
    assert e.since == "2026-01-01T00:01:00Z"
    out = io.StringIO()
    render_plain(e, out)
    assert f"Decision: waiting (Unschedulable): {why}\n" in out.getvalue()


def test_waiting_without_a_condition_falls_back_to_the_event() -> None:
    p = pod("lone")
    ev = event("lone", "FailedScheduling", "0/3 nodes are available", "2026-01-01T00:00:09Z")
    e = explain_pod(p, podgroup=None, members=[p], queues=QUEUES, events=[ev])
    assert (e.verdict, e.message) == ("waiting", "0/3 nodes are available")
    assert e.gang is not None and e.gang.implicit and e.gang.min_member == 1


def test_nothing_written_is_undecided_and_says_what_to_check() -> None:
    p = pod("new", labels={"kai.scheduler/queue": "team-a"})
    e = explain_pod(p, podgroup=None, members=[p], queues=QUEUES, events=[])
    assert e.verdict == "undecided" and "doctor" in e.summary
    assert e.queue is not None and e.queue.source == "label kai.scheduler/queue"


def test_held_pod_shows_the_node_and_what_it_waits_for() -> None:
    p = pod("t-0", group="t", nominated="n3")
    group = podgroup(
        "t",
        phase="Pending",
        conditions=pg_condition("WaitingForEvictions", "waits for team/v-0", "False"),
    )
    e = explain_pod(p, podgroup=group, members=[p], queues=QUEUES, events=[])
    assert e.verdict == "held" and "n3" in e.summary and e.message == "waits for team/v-0"
    assert e.take_back.nominated == {"t-0": "n3"}
    g = explain_podgroup(group, members=[p], queues=QUEUES, events=[])
    assert g.verdict == "held" and "waits for team/v-0" in g.summary


def test_victim_is_evicting_and_queue_take_back_is_shown() -> None:
    disruption = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                  "message": "reclaimed for gang team/big (queue team-b)"}  # fmt: skip
    p = pod("v-0", node="n1", phase="Running", conditions=[disruption])
    queues = dict(QUEUES)
    queues["team-a"] = queue("team-a", conditions=[{"type": "LastEviction", "status": "True",
        "reason": "Reclaim", "message": "1 pod of gang team/v evicted"}])  # fmt: skip
    e = explain_pod(p, podgroup=None, members=[p], queues=queues, events=[],
                    default_queue="team-a")  # fmt: skip
    assert e.verdict == "evicting" and e.reason == "PreemptionByScheduler"
    assert "reclaimed for gang team/big" in e.summary
    assert e.take_back.disruption["v-0"].reason == "PreemptionByScheduler"
    assert [c.type for c in e.take_back.queue] == ["LastEviction"]
    out = io.StringIO()
    render_plain(e, out)
    assert "Take-back:" in out.getvalue() and "LastEviction (Reclaim" in out.getvalue()


def test_pod_of_another_scheduler_says_so() -> None:
    p = pod("web", scheduler="default-scheduler", node="n1")
    e = explain_pod(p, podgroup=None, members=[p], queues={}, events=[])
    assert e.verdict == "not-ours" and not e.ours
    assert "schedulerName default-scheduler, not kai-scheduler" in e.summary
    e = explain_pod(p, podgroup=None, members=[p], queues={}, events=[],
                    scheduler_names=("kai-scheduler", "default-scheduler"))  # fmt: skip
    assert e.ours and e.verdict == "placed"


def test_missing_podgroup_and_queue_are_notes() -> None:
    p = pod("t-0", group="gone")
    e = explain_pod(p, podgroup=None, members=[p], queues={}, events=[])
    notes = " | ".join(e.notes)
    assert "PodGroup gone (annotation), which does not exist" in notes
    assert "queue default-queue (the scheduler's default queue) does not exist" in notes


def test_queue_name_rule_matches_the_scheduler() -> None:
    young = pod("b", labels={"kai.scheduler/queue": "young"}, created="2026-01-02T00:00:00Z")
    old = pod("a", labels={"kai.scheduler/queue": "old"}, created="2026-01-01T00:00:00Z")
    assert queue_name_of(podgroup("g", queue="spec"), [old], "dq") == (
        "spec",
        "PodGroup spec.queue",
    )
    assert queue_name_of(podgroup("g", queue=None), [young, old], "dq")[0] == "old"
    assert queue_name_of(None, [pod("c")], "dq") == ("dq", "the scheduler's default queue")


def test_queue_parents_stop_at_a_cycle_and_a_missing_parent() -> None:
    looped = {"a": queue("a", parent="b"), "b": queue("b", parent="a")}
    assert [p.name for p in queue_view("a", "x", looped).parents] == ["b"]
    view = queue_view("a", "x", {"a": queue("a", parent="nowhere")})
    assert [(p.name, p.found) for p in view.parents] == [("nowhere", False)]


def test_podgroup_verdicts() -> None:
    bound = [pod(f"t-{i}", group="t", node="n1", phase="Running") for i in range(3)]
    e = explain_podgroup(podgroup("t", 3, phase="Running"), members=bound, queues=QUEUES, events=[])
    assert e.verdict == "placed" and e.summary == "3/3 pods bound on n1 (3)"
    why = "gang team/t can never be admitted: it asks 8 GPUs"
    waiting = podgroup(
        "t", 2, phase="Unschedulable", conditions=pg_condition("ExceedsQueueLimit", why)
    )
    e = explain_podgroup(waiting, members=[pod("t-0", group="t")], queues=QUEUES, events=[])
    assert (e.verdict, e.reason, e.message) == ("waiting", "ExceedsQueueLimit", why)
    done = [pod("t-0", group="t", node="n1", phase="Succeeded")]
    assert explain_podgroup(podgroup("t", 1), members=done, queues=QUEUES, events=[]).verdict == (
        "finished")  # fmt: skip
    partial = [pod("t-0", group="t", node="n1"), pod("t-1", group="t")]
    e = explain_podgroup(podgroup("t", 2, phase="Pending"), members=partial, queues=QUEUES,
                         events=[])  # fmt: skip
    assert e.verdict == "pending" and "1/2 pods bound" in e.summary
    e = explain_podgroup(podgroup("t", 0), members=[], queues=QUEUES, events=[])
    assert e.verdict == "undecided" and e.gang is not None and e.gang.min_member == 1
    assert any("no pod names this PodGroup" in n for n in e.notes)


# --- Events -----------------------------------------------------------------------------


def test_events_newest_first_and_repeats_merged() -> None:
    events = [
        event("t-0", "FailedScheduling", "no room", "2026-01-01T00:00:01Z"),
        event("t-1", "FailedScheduling", "no room", "2026-01-01T00:00:07Z", count=2),
        event("t-0", "Scheduled", "assigned", "2026-01-01T00:00:05Z"),
        event("t", "Unschedulable", "no room", "2026-01-01T00:00:03Z", kind="PodGroup"),
    ]
    merged = merge_events(events)
    assert [(e.reason, e.count) for e in merged] == [
        ("FailedScheduling", 3), ("Scheduled", 1), ("Unschedulable", 1)]  # fmt: skip
    assert merged[0].objects == ("pod/t-0", "pod/t-1")
    assert merged[0].last_seen == "2026-01-01T00:00:07Z"
    assert len(merge_events(events, limit=1)) == 1


def test_event_times_of_any_precision_and_field_compare() -> None:
    newer = {"reason": "A", "message": "a", "eventTime": "2026-01-01T00:00:02.500000Z"}
    older = {
        "reason": "B",
        "message": "b",
        "metadata": {"creationTimestamp": "2026-01-01T00:00:02Z"},
    }
    assert [e.reason for e in merge_events([older, newer])] == ["A", "B"]


# --- rendering --------------------------------------------------------------------------


def _waiting_gang(members: int = 2) -> Any:
    why = "queue team-a is at its gpu limit (8/8)"
    group = podgroup("t", members, phase="Unschedulable", conditions=pg_condition("OverLimit", why))
    pods = [pod(f"t-{i}", group="t") for i in range(members)]
    events = [event("t-0", "FailedScheduling", why, "2026-01-01T00:00:07Z")]
    return explain_podgroup(group, members=pods, queues=QUEUES, events=events)


def test_plain_text_has_gang_queue_and_events() -> None:
    out = io.StringIO()
    render(_waiting_gang(), "text", out)  # a StringIO is no terminal: plain text
    text = out.getvalue()
    assert text.startswith("PodGroup team/t\nDecision: waiting (OverLimit): queue team-a")
    assert "Gang: PodGroup t (scheduling.run.ai/v2alpha2), minMember 2: 0 bound, 2 waiting" in text
    gpu = next(line for line in text.splitlines() if line.strip().startswith("gpu"))
    assert gpu.split() == ["gpu", "devices", "2", "0", "10", "4", "4", "unlimited", "1"]
    assert "parent dept: allocated/fair share gpu 6/16" in text
    assert "FailedScheduling  x1  pod/t-0" in text


def test_long_gangs_are_cut_with_a_count() -> None:
    out = io.StringIO()
    render_plain(_waiting_gang(MAX_MEMBERS + 5), out)
    assert "... and 5 more pods" in out.getvalue()


def test_json_is_camel_case_and_complete() -> None:
    out = io.StringIO()
    render(_waiting_gang(), "json", out)
    doc = json.loads(out.getvalue())
    assert doc == to_json(_waiting_gang())
    assert doc["verdict"] == "waiting" and doc["reason"] == "OverLimit"
    gpu = doc["queue"]["resources"][0]
    assert gpu["fairShare"] == "4" and gpu["allocatedNonPreemptible"] == "0"
    assert doc["gang"]["minMember"] == 2 and doc["events"][0]["lastSeen"]
    assert doc["takeBack"] == {"nominated": {}, "disruption": {}, "queue": []}


def test_rich_output_renders_the_same_facts() -> None:
    out = io.StringIO()
    render_rich(_waiting_gang(), Console(file=out, force_terminal=True, width=200))
    text = out.getvalue()
    assert "\x1b[" in text  # styled
    for fact in ("queue team-a is at its gpu limit", "fair share", "FailedScheduling", "dept"):
        assert fact in text, fact
