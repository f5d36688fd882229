"""Scenario fields for taking back: running jobs, grace periods, take-back settings, min
runtimes, preemption delay and preemptionPolicy."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from scheduler.cluster.pod import PodPhase
from scheduler.simulate.backend import SimulatedCluster
from scheduler.simulate.scenario import ScenarioError, parse_scenario

BASE: dict[str, Any] = {
    "settings": {"solver": "greedy"},
    "nodes": [
        {"name": "gpu", "count": 2, "gpus": 4, "cpu": 16},
        {"name": "frac", "gpus": 2, "gpuMemory": "40Gi"},
    ],
    "queues": [
        {
            "metadata": {"name": "dept"},
            "spec": {"reclaimMinRuntime": "30m", "resources": {"gpu": {"quota": 8}}},
        },
        {
            "metadata": {"name": "team"},
            "spec": {
                "parentQueue": "dept",
                "preemptMinRuntime": "5m",
                "resources": {"gpu": {"quota": 4}},
            },
        },
    ],
    "priorityClasses": {"polite": {"value": 90, "preemptionPolicy": "Never"}, "batch": 20},
    "jobs": [
        {
            "name": "old",
            "namespace": "ns",
            "queue": "team",
            "duration": "1h",
            "podGroup": {"minMember": 3},
            "running": {"nodes": ["gpu-0", "gpu-0", "gpu-1"], "startTime": "-20m"},
            "pods": {"count": 3, "resources": {"nvidia.com/gpu": 2, "cpu": "4"}},
        },
        {
            "name": "halves",
            "queue": "team",
            "running": {"nodes": "frac"},
            "pods": {
                "count": 3,
                "annotations": {"gpu-fraction": "0.5"},
                "resources": {"cpu": "1"},
            },
        },
        {
            "name": "new",
            "namespace": "ns",
            "queue": "team",
            "at": "1m",
            "priorityClassName": "polite",
            "podGroup": {"preemptionDelay": "2m"},
            "pods": {
                "count": 2,
                "template": {
                    "spec": {
                        "terminationGracePeriodSeconds": 45,
                        "containers": [
                            {"name": "c", "resources": {"requests": {"nvidia.com/gpu": 1}}}
                        ],
                    }
                },
            },
        },
        {
            "name": "single",
            "queue": "team",
            "priorityClassName": "polite",
            "pods": {
                "resources": {"nvidia.com/gpu": 1},
                "template": {
                    "metadata": {
                        "labels": {"kai.scheduler/preemptibility": "non-preemptible"},
                        "annotations": {"kai.scheduler/preemption-delay": "90s"},
                    }
                },
            },
        },
    ],
}


def scenario(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    data.update(changes)
    return data


def test_running_jobs_are_bound_with_device_grants_since_their_start_time() -> None:
    sc = parse_scenario(scenario())
    jobs = {j.name: j for j in sc.jobs}
    old = jobs["old"]
    assert old.running and old.at == 0.0
    assert [p.node_name for p in old.pods] == ["gpu-0", "gpu-0", "gpu-1"]
    assert [p.gpu_grant for p in old.pods] == [
        ((0, 1000), (1, 1000)),
        ((2, 1000), (3, 1000)),
        ((0, 1000), (1, 1000)),
    ]
    assert all(p.phase == PodPhase.RUNNING and p.start_time == -1200.0 for p in old.pods)
    assert old.gangs[0].creation_time == -1200.0
    # Half-GPU pods share devices: two on device 0, the third on device 1.
    halves = jobs["halves"]
    assert [p.gpu_grant for p in halves.pods] == [((0, 500),), ((0, 500),), ((1, 500),)]
    assert all(p.start_time == 0.0 and p.node_name == "frac" for p in halves.pods)
    assert not jobs["new"].running and jobs["new"].pods[0].node_name is None


def test_running_pods_finish_duration_after_their_start() -> None:
    sc = parse_scenario(scenario())
    cluster = SimulatedCluster(sc.nodes, sc.queues)
    old = next(j for j in sc.jobs if j.name == "old")
    cluster.add_pods(old.pods, old.gangs, duration=old.duration)
    record = cluster.gangs["ns/old"]
    assert (record.arrived_at, record.placed_at) == (-1200.0, -1200.0)
    assert cluster.next_completion() == 2400.0
    assert cluster.pending_gangs() == []
    done = cluster.advance(2400.0)
    assert len(done) == 3


def test_queue_min_runtimes_and_gang_fields_reach_the_domain() -> None:
    sc = parse_scenario(scenario())
    queues = {q.name: q for q in sc.queues}
    assert queues["dept"].reclaim_min_runtime == 1800.0
    assert queues["team"].preempt_min_runtime == 300.0
    assert queues["team"].reclaim_min_runtime is None
    jobs = {j.name: j for j in sc.jobs}
    new = jobs["new"]
    gang = new.gangs[0]
    assert gang.preemption_delay_seconds == 120.0
    assert gang.priority == 90 and gang.preemptible and not gang.may_preempt
    assert new.grace == 45.0 and jobs["old"].grace is None
    # A pod without a PodGroup: its label and annotation speak for its gang of one.
    single = jobs["single"].gangs[0]
    assert single.implicit and not single.preemptible and not single.may_preempt
    assert single.preemption_delay_seconds == 90.0
    assert jobs["old"].gangs[0].may_preempt


def test_take_back_and_grace_settings() -> None:
    sc = parse_scenario(scenario())
    assert sc.settings.placement.take_back is True
    assert sc.settings.termination_grace == 0.0
    off = parse_scenario(scenario(settings={"takeBack": False, "terminationGracePeriod": "30s"}))
    assert off.settings.placement.take_back is False
    assert off.settings.termination_grace == 30.0


@pytest.mark.parametrize(
    ("path", "value", "field", "words"),
    [
        (("jobs", 0, "running", "nodes"), ["gpu-0"], "jobs[0].running.nodes", "one node per pod"),
        (("jobs", 0, "running", "nodes"), "nope", "jobs[0].running.nodes[0]", "not defined"),
        (("jobs", 0, "running", "nodes"), ["gpu-0"] * 3, "jobs[0].running.nodes[2]", "device"),
        (("jobs", 0, "running", "startTime"), "10m", "jobs[0].running.startTime", "after the"),
        (("jobs", 0, "running", "startTime"), "-1x", "jobs[0].running.startTime", "duration"),
        (("jobs", 0, "running", "since"), "1m", "jobs[0].running.since", "unknown field"),
        (("jobs", 0, "at"), "1m", "jobs[0].at", "running job exists from the start"),
        (("jobs", 0, "duration"), "10m", "jobs[0].duration", "finished before the start"),
        (("settings", "takeBack"), "yes", "settings.takeBack", "true"),
        (("settings", "terminationGracePeriod"), "-5s", "settings.terminationGracePeriod", ""),
        (
            ("priorityClasses", "polite", "preemptionPolicy"),
            "Sometimes",
            "priorityClasses.polite.preemptionPolicy",
            "Never",
        ),
        (("priorityClasses", "polite", "value"), "high", "priorityClasses.polite.value", "whole"),
        (
            ("jobs", 2, "pods", "template", "spec", "terminationGracePeriodSeconds"),
            -1,
            "jobs[2].pods.template.spec.terminationGracePeriodSeconds",
            ">= 0",
        ),
        (
            ("queues", 1, "spec", "preemptMinRuntime"),
            "soon",
            "queues[1].spec.preemptMinRuntime",
            "",
        ),
        (
            ("jobs", 2, "podGroup", "preemptionDelay"),
            "later",
            "jobs[2].podGroup.preemptionDelay",
            "",
        ),
    ],
)
def test_errors_name_the_field(path: tuple[Any, ...], value: Any, field: str, words: str) -> None:
    data = scenario()
    target: Any = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ScenarioError) as info:
        parse_scenario(data)
    assert info.value.field == field, str(info.value)
    assert words in info.value.message


def test_a_running_pod_must_fit_its_node() -> None:
    data = scenario()
    data["jobs"][0]["pods"]["resources"]["cpu"] = "9"  # 16 cores per node: the second does not fit
    with pytest.raises(ScenarioError) as info:
        parse_scenario(data)
    assert info.value.field == "jobs[0].running.nodes[1]"
    assert "no room" in info.value.message and "cpu" in info.value.message


def test_a_running_pod_must_be_accepted_by_its_node() -> None:
    data = scenario()
    data["nodes"][1]["taints"] = [{"key": "dedicated", "effect": "NoSchedule"}]
    with pytest.raises(ScenarioError) as info:
        parse_scenario(data)
    assert info.value.field == "jobs[1].running.nodes[0]"
    assert "does not accept" in info.value.message
