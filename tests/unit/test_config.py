"""The config file: shipped keys parse, unknown keys and bad values are errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from scheduler.config import ConfigError, SchedulerConfig, load_config, parse_config

REPO = Path(__file__).resolve().parents[2]


def test_defaults_without_a_file() -> None:
    cfg = load_config(None)
    assert cfg == SchedulerConfig()
    assert cfg.cycle_period == 1.0
    assert cfg.placement.gpu_strategy == "binpack"
    assert cfg.default_queue == "default-queue"
    assert cfg.staleness_grace_period == 60.0


def test_shipped_configmap_parses() -> None:
    doc = yaml.safe_load((REPO / "manifests" / "30-configmap.yaml").read_text())
    cfg = parse_config(yaml.safe_load(doc["data"]["config.yaml"]))
    assert cfg.placement.gpu_strategy == "binpack"
    assert cfg.placement.cpu_strategy == "binpack"
    assert cfg.cycle_period == 1.0
    assert cfg.placement.time_limit_seconds == 0.5
    assert cfg.default_queue == "default-queue"
    assert cfg.staleness_grace_period == 60.0
    assert cfg.pod_grouper is True  # 70-podgrouper.yaml ships beside it


def test_every_key_is_applied(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "placement: {gpu: spread, cpu: binpack, scoring: fragmentation, solverWorkers: 1,"
        " greedyOnly: true, takeBack: false, consolidationMaxPods: 4, takeBackGangs: 2}\n"
        "cyclePeriod: 250ms\nsolverTimeLimit: 2s\ndefaultQueue: team-a\n"
        "stalenessGracePeriod: 1m30s\nschedulerName: other\nbindAttempts: 5\n"
        "eventInterval: 10s\ndebounce: 0s\nnominationTimeout: 45s\npodGrouper: true\n"
        "leaderElection: {leaseName: x, leaseNamespace: ns, leaseDuration: 6s,"
        " renewDeadline: 4s, retryPeriod: 1s}\n"
    )
    cfg = load_config(path)
    assert cfg.placement.gpu_strategy == "spread"
    assert cfg.placement.cpu_strategy == "binpack"
    assert cfg.placement.scoring == "fragmentation"
    assert cfg.placement.workers == 1
    assert cfg.placement.greedy_only is True
    assert cfg.placement.take_back is False
    assert cfg.placement.consolidation_max_pods == 4
    assert cfg.placement.take_back_gangs == 2
    assert cfg.nomination_timeout == 45.0
    assert cfg.pod_grouper is True
    assert cfg.placement.time_limit_seconds == 2.0
    assert cfg.cycle_period == 0.25
    assert cfg.default_queue == "team-a"
    assert cfg.staleness_grace_period == 90.0
    assert cfg.scheduler_name == "other"
    assert cfg.bind_attempts == 5
    assert cfg.event_interval == 10.0
    assert cfg.debounce == 0.0
    le = cfg.leader_election
    assert (le.lease_name, le.lease_namespace) == ("x", "ns")
    assert (le.lease_duration, le.renew_deadline, le.retry_period) == (6.0, 4.0, 1.0)


def test_empty_file_is_defaults(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_config(path) == SchedulerConfig()


@pytest.mark.parametrize(
    ("data", "key", "words"),
    [
        ({"cyclePeriodd": "1s"}, "cyclePeriodd", "unknown key"),
        ({"placement": {"gpu": "binpack", "gppu": "spread"}}, "placement.gppu", "unknown key"),
        ({"placement": {"gpu": "pack"}}, "placement.gpu", "binpack or spread"),
        ({"placement": "binpack"}, "placement", "mapping"),
        ({"placement": {"scoring": "fgd"}}, "placement.scoring", "packing or fragmentation"),
        ({"cyclePeriod": "soon"}, "cyclePeriod", "duration"),
        ({"cyclePeriod": "0s"}, "cyclePeriod", "positive"),
        ({"solverTimeLimit": -1}, "solverTimeLimit", "positive"),
        ({"defaultQueue": ""}, "defaultQueue", "non-empty"),
        ({"bindAttempts": 0}, "bindAttempts", ">= 1"),
        (
            {"leaderElection": {"leaseDuration": "2s", "renewDeadline": "3s"}},
            "leaderElection.renewDeadline",
            "below leaseDuration",
        ),
        ({"leaderElection": {"leaseNamee": "x"}}, "leaderElection.leaseNamee", "unknown key"),
    ],
)
def test_bad_values_name_the_key(data: dict[str, object], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert info.value.key == key
    assert words in str(info.value)


def test_unknown_key_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"stalenesGracePeriod": "60s"})
    assert "stalenessGracePeriod" in info.value.message


def test_top_level_must_be_a_mapping() -> None:
    with pytest.raises(ConfigError, match="mapping"):
        parse_config(["cyclePeriod", "1s"])


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("placement: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
