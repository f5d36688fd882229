"""What-if on snapshots: ``--set`` parsing, snapshot files, and the replay's first cycle."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import yaml

from scheduler.cli import main
from scheduler.cluster import GpuRequest, Node, Pod, Queue, Resources, Snapshot
from scheduler.cluster.disruption import DisruptionBudget
from scheduler.cluster.gang import Gang
from scheduler.cluster.pod import PodPhase
from scheduler.cluster.queue import UNLIMITED, QueueResource
from scheduler.cluster.resources import CPU, GPU, PODS
from scheduler.config import SchedulerConfig, parse_config
from scheduler.simulate.whatif import SnapshotCluster, replay_snapshot, shift_times
from scheduler.simulate.whatif_sets import WhatIfError, apply_changes, parse_change
from scheduler.snapshotfile import (
    SnapshotFileError,
    config_to_mapping,
    read_snapshot,
    write_snapshot,
)
from scheduler.solver import PlacementSettings, solve

NOW = 1_700_000_000.0


def _snapshot() -> Snapshot:
    """Two 4-GPU nodes; queue team-a (quota = limit = 4 GPUs) with a 4-pod and a 2-pod gang
    waiting, a running pod of team-b, a finished pod and another scheduler's pod."""
    nodes = tuple(Node(f"n{i}", Resources({CPU: 8000, GPU: 4, PODS: 110})) for i in range(2))
    queues = (
        Queue("team-a", resources=(("gpu", QueueResource(quota=4000, limit=4000)),)),
        Queue("team-b", resources=(("gpu", QueueResource(quota=4000)),)),
    )
    gangs = (
        Gang("ns", "big", min_member=4, queue="team-a", creation_time=NOW - 20),
        Gang("ns", "small", min_member=2, queue="team-a", creation_time=NOW - 10),
        Gang("ns", "run", min_member=1, queue="team-b", creation_time=NOW - 100),
    )
    pods: list[Pod] = []
    for gang, count, age in (("big", 4, 20), ("small", 2, 10)):
        pods += [
            Pod(f"u-{gang}-{i}", "ns", f"{gang}-{i}", Resources({CPU: 100, GPU: 1}),
                gpu=GpuRequest(1), gang=f"ns/{gang}", queue="team-a", creation_time=NOW - age)
            for i in range(count)
        ]  # fmt: skip
    pods.append(
        Pod("u-run", "ns", "run-0", Resources({CPU: 100, GPU: 1}), gpu=GpuRequest(1),
            gang="ns/run", queue="team-b", phase=PodPhase.RUNNING, node_name="n1",
            gpu_grant=((0, 1000),), creation_time=NOW - 100, start_time=NOW - 90)
    )  # fmt: skip
    pods.append(
        Pod("u-done", "ns", "run-old", Resources({CPU: 100}), gang="ns/run", queue="team-b",
            phase=PodPhase.SUCCEEDED, node_name="n0", creation_time=NOW - 200)
    )  # fmt: skip
    pods.append(
        Pod("u-other", "kube-system", "dns", Resources({CPU: 500}), phase=PodPhase.RUNNING,
            node_name="n0", managed=False, creation_time=NOW - 500)
    )  # fmt: skip
    budget = DisruptionBudget("ns", "pdb", ("u-run",), allowed=1)
    return Snapshot(nodes, tuple(pods), gangs, queues, now=NOW, budgets=(budget,))


CONFIG = {"placement": {"gpu": "binpack", "solverWorkers": 1}, "solverTimeLimit": "0.3s"}


# --- --set parsing ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "target", "name", "field", "value"),
    [
        ("queue.team-a.gpu.quota=16", "queue", "team-a", ("gpu", "quota"), "16"),
        ("queue.a.b.cpu.limit=-1", "queue", "a.b", ("cpu", "limit"), "-1"),
        ("queue.q.memory.overQuotaWeight=3", "queue", "q", ("memory", "overQuotaWeight"), "3"),
        ("node.ip-10-0-0-1.ec2.internal.unschedulable=true", "node", "ip-10-0-0-1.ec2.internal",
         ("unschedulable",), True),
        ("config.placement.gpu=spread", "config", "", ("placement", "gpu"), "spread"),
        ("config.solverTimeLimit = 2s", "config", "", ("solverTimeLimit",), "2s"),
    ],
)  # fmt: skip
def test_parse_change_reads_every_form(
    text: str, target: str, name: str, field: tuple[str, ...], value: object
) -> None:
    change = parse_change(text)
    assert (change.target, change.name, change.field, change.value) == (
        target, name, field, value,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("queue.team-a.gpu.quota", "expected PATH=VALUE"),
        ("queue.team-a.gpu=4", "queue.<name>.<resource>.<field>"),
        ("queue.team-a.tpu.quota=4", "unknown queue resource 'tpu'"),
        ("queue.team-a.gpu.weight=4", "unknown queue field 'weight'"),
        ("node.n1.cordoned=true", "node.<name>.unschedulable"),
        ("node.n1.unschedulable=maybe", "must be true or false"),
        ("pod.x.y=1", "unknown target 'pod'"),
        ("config.=1", "config.<key>"),
    ],
)
def test_parse_change_names_the_path_and_the_valid_forms(text: str, says: str) -> None:
    with pytest.raises(WhatIfError) as e:
        parse_change(text)
    assert f"--set {text}" in str(e.value)
    assert says in str(e.value)
    assert "queue.<name>.<gpu|cpu|memory>.<quota|limit|overQuotaWeight>=V" in str(e.value)


def test_apply_changes_uses_crd_units_and_checks_names_and_values() -> None:
    snap = _snapshot()
    changes = [parse_change(t) for t in ("queue.team-a.gpu.quota=6", "queue.team-a.gpu.limit=-1",
                                         "queue.team-b.cpu.quota=1500",
                                         "node.n0.unschedulable=true",
                                         "config.placement.gpu=spread")]  # fmt: skip
    changed, mapping = apply_changes(snap, CONFIG, changes)
    a = {q.name: q for q in changed.queues}["team-a"].resource("gpu")
    assert (a.quota, a.limit) == (6000, UNLIMITED)  # GPU devices -> thousandths
    assert {q.name: q for q in changed.queues}["team-b"].resource("cpu").quota == 1500
    assert [n.unschedulable for n in changed.nodes] == [True, False]
    assert parse_config(mapping).placement.gpu_strategy == "spread"
    assert parse_config(mapping).placement.time_limit_seconds == 0.3
    assert snap.queues[0].resource("gpu").quota == 4000  # the input is left alone

    for text, says in (
        ("queue.nope.gpu.quota=1", "there is no 'nope'; the snapshot has: team-a, team-b"),
        ("node.n9.unschedulable=true", "there is no 'n9'; the snapshot has: n0, n1"),
        ("queue.team-a.gpu.quota=8", "the gpu limit would be below the quota"),
        ("queue.team-a.gpu.quota=lots", "is not a number"),
        ("config.placement.gpu=sideways", "config placement.gpu"),
        ("config.cyclePeriodd=1s", "unknown key"),
    ):
        with pytest.raises(WhatIfError, match="valid forms") as e:
            apply_changes(snap, CONFIG, [parse_change(text)])
        assert says in str(e.value), (text, str(e.value))


# --- snapshot files -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["snap.json", "snap.json.gz"])
def test_snapshot_file_round_trips_exactly(tmp_path: Path, name: str) -> None:
    snap = _snapshot()
    path = write_snapshot(tmp_path / name, snap, CONFIG, {"by": "test"})
    raw = path.read_bytes()
    assert (raw[:2] == b"\x1f\x8b") == name.endswith(".gz")
    stored = read_snapshot(path)
    assert stored.snapshot.to_json() == snap.to_json()
    assert stored.snapshot == snap
    assert stored.config == CONFIG
    assert stored.source == {"by": "test"}
    # A bare Snapshot JSON (e.g. saved from a cycle report) is a snapshot file too.
    (tmp_path / "bare.json").write_text(snap.to_json())
    assert read_snapshot(tmp_path / "bare.json").config is None


def test_config_to_mapping_reads_back_to_the_same_config() -> None:
    config = parse_config(
        {**CONFIG, "cyclePeriod": "250ms", "schedulerNames": ["kai-scheduler", "volcano"],
         "defaultQueue": "q", "podGrouper": True,
         "placement": {"gpu": "spread", "cpu": "spread", "scoring": "fragmentation",
                       "takeBack": False, "solverWorkers": 3}}
    )  # fmt: skip
    back = parse_config(config_to_mapping(config))
    assert back.placement == config.placement
    assert back.scheduler_names_served == ("kai-scheduler", "volcano")
    assert (back.cycle_period, back.default_queue, back.pod_grouper) == (0.25, "q", True)
    assert parse_config(config_to_mapping(SchedulerConfig())) == SchedulerConfig()


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"\x00\x01\xfe\xff binary", "binary data"),
        (b"{not json", "not JSON"),
        (b'{"kind": "Pod"}', "not a snapshot"),
        (b"\x1f\x8b broken", "broken gzip"),
        (b'{"nodes": [], "version": 99}', "version 99"),
        (b'{"nodes": [], "config": {"cyclePeriod": "soon"}}', "pass --config FILE"),
    ],
)
def test_bad_snapshot_files_are_named(tmp_path: Path, content: bytes, says: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(SnapshotFileError) as e:
        read_snapshot(path)
    assert str(path) in str(e.value) and says in str(e.value)


# --- the replay -----------------------------------------------------------------------------


def test_first_replayed_snapshot_is_the_snapshot_shifted_to_time_zero() -> None:
    snap = _snapshot()
    cluster = SnapshotCluster(snap)
    first = cluster.snapshot_now()
    assert first.to_json() == shift_times(snap).to_json()
    assert first.now == 0.0 and first.pods[0].creation_time == -20.0
    # Shifting keeps every distance to "now", so the solver decides the same.
    settings = PlacementSettings(workers=1, time_limit_seconds=0.3)
    direct = solve(snap, settings)
    shifted = solve(first, settings)
    assert {k: o.placed for k, o in direct.outcomes.items()} == {
        k: o.placed for k, o in shifted.outcomes.items()
    }
    assert sorted((a.pod_key, a.node) for a in direct.assignments) == sorted(
        (a.pod_key, a.node) for a in shifted.assignments
    )


def test_replay_places_one_gang_and_a_limit_change_flips_the_other() -> None:
    snap = _snapshot()
    run = replay_snapshot(snap, CONFIG, cycles=3)
    first = run.decisions[0]
    assert set(first.placed) == {"ns/big"}
    assert first.waiting["ns/small"][0] == "QueueLimit"
    assert len(first.placed["ns/big"]) == 4
    assert run.result.cluster.gangs["ns/small"].placed_at is None

    changes = [parse_change("queue.team-a.gpu.quota=6"), parse_change("queue.team-a.gpu.limit=6")]
    changed, mapping = apply_changes(snap, CONFIG, changes)
    flipped = replay_snapshot(changed, mapping, cycles=3).decisions[0]
    assert set(flipped.placed) == {"ns/big", "ns/small"}


def test_simulate_snapshot_cli_prints_the_decision_and_exits_2_on_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_snapshot(tmp_path / "s.json.gz", _snapshot(), CONFIG)
    assert main(["simulate", "--snapshot", str(path), "--json", "--cycles", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cycles"] == 1 and data["changes"] == []
    assert list(data["decisions"][0]["placed"]) == ["ns/big"]
    gangs = {g["gang"]: g for g in data["gangs"]}
    assert gangs["ns/small"]["status"] == "waiting"

    code = main(["simulate", "--snapshot", str(path), "--set", "queue.team-a.gpu.quota=6",
                 "--set", "queue.team-a.gpu.limit=6", "--cycles", "1"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "What if" in out and "queue.team-a.gpu.quota=6" in out and "ns/small" in out

    assert main(["simulate", "--snapshot", str(path), "--set", "queue.team-a.gpus.quota=1"]) == 2
    err = capsys.readouterr().err
    assert "--set queue.team-a.gpus.quota=1" in err and "valid forms" in err
    binary = tmp_path / "b.bin"
    binary.write_bytes(gzip.compress(b"\x00\xff\x00"))
    assert main(["simulate", "--snapshot", str(binary)]) == 2
    assert "binary data" in capsys.readouterr().err
    assert main(["simulate", "--snapshot", str(path), "--cycles", "0"]) == 2
    assert "--cycles 0" in capsys.readouterr().err


# --- kai-scheduler snapshot: input errors ---------------------------------------------------


def _kubeconfig(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def test_snapshot_cli_names_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "s.json")
    assert main(["snapshot", "--out", str(tmp_path / "no" / "s.json")]) == 2
    assert "folder" in capsys.readouterr().err
    assert main(["snapshot", "--out", out, "--kube-config", str(tmp_path / "none")]) == 2
    assert "--kube-config" in capsys.readouterr().err
    # Nothing listens on port 1: every kind fails, the command says so (exit 1, no file).
    closed = _kubeconfig(tmp_path, "https://127.0.0.1:1")
    config = tmp_path / "config.yaml"
    config.write_text("cyclePeriod: 1s\n")
    assert (
        main(["snapshot", "--out", out, "--kube-config", str(closed), "--config", str(config)]) == 1
    )
    err = capsys.readouterr().err
    assert "could not list Pod, Node" in err and "is reachable" in err
    assert not Path(out).exists()
    assert main(["snapshot", "--out", out, "--kube-config", str(closed), "--config-map", "x"]) == 2
    assert "--config-map: 'x' must look like NAMESPACE/NAME" in capsys.readouterr().err


def test_a_pod_on_a_node_the_cluster_no_longer_has_is_kept_as_captured() -> None:
    """A live cluster can hold a pod bound to a deleted node (not collected yet): the replay
    keeps it as it was and decides the rest, instead of stopping."""
    snap = _snapshot()
    ghost = Pod("u-ghost", "ns", "run-1", Resources({CPU: 100, GPU: 1}), gpu=GpuRequest(1),
                gang="ns/run", queue="team-b", phase=PodPhase.RUNNING, node_name="gone-node",
                creation_time=NOW - 50, start_time=NOW - 40)  # fmt: skip
    snap = Snapshot(snap.nodes, (*snap.pods, ghost), snap.gangs, snap.queues, now=NOW,
                    budgets=snap.budgets)  # fmt: skip
    cluster = SnapshotCluster(snap)
    assert "u-ghost" in cluster.fixed
    assert [p.node_name for p in cluster.snapshot_now().pods if p.uid == "u-ghost"] == ["gone-node"]
    first = replay_snapshot(snap, CONFIG, cycles=2).decisions[0]
    assert set(first.placed) == {"ns/big"}
