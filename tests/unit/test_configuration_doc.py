"""docs/configuration.md documents every key the config loader accepts, and nothing else.

The accepted keys are read from the loader itself (its "unknown key ... use one of" error for
each level), so a key added to scheduler/config.py without a row in the doc fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from scheduler.config import ConfigError, SchedulerConfig, parse_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
NESTED = ("placement", "leaderElection", "gpuSharing")


def accepted(data: dict[str, object], prefix: str) -> set[str]:
    """Keys the loader accepts at one level: the list its unknown-key error gives."""
    with pytest.raises(ConfigError) as e:
        parse_config(data)
    assert e.value.key == f"{prefix}zzzUnknown"
    known = e.value.message.split("use one of: ", 1)[1]
    return {f"{prefix}{k.strip()}" for k in known.split(",")}


def loader_keys() -> set[str]:
    keys = accepted({"zzzUnknown": 1}, "")
    for section in NESTED:
        keys |= accepted({section: {"zzzUnknown": 1}}, f"{section}.")
    return keys


def documented_keys() -> set[str]:
    """Keys in the first column of the doc's tables."""
    return set(re.findall(r"^\| `([A-Za-z.]+)` \|", DOC.read_text(), flags=re.MULTILINE))


def test_every_accepted_key_is_documented() -> None:
    keys = loader_keys()
    assert {"bindAttempts", "debounce", "eventInterval", "leaderElection", "schedulerName"} <= keys
    assert "placement.gpu" in keys and "leaderElection.retryPeriod" in keys
    missing = keys - documented_keys()
    assert not missing, f"config keys missing from {DOC.name}: {sorted(missing)}"


def test_the_doc_names_no_key_the_loader_refuses() -> None:
    extra = documented_keys() - loader_keys()
    assert not extra, f"{DOC.name} documents keys the loader does not accept: {sorted(extra)}"


def test_the_doc_example_loads_and_changes_what_it_says() -> None:
    block = re.search(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    assert block is not None
    config = parse_config(yaml.safe_load(block.group(1)))
    assert config.placement.cpu_strategy == "spread"
    assert config.scheduler_names_served == ("kai-scheduler", "volcano")


@pytest.mark.parametrize(
    ("key", "default"),
    [
        ("bindAttempts", f"`{SchedulerConfig().bind_attempts}`"),
        ("cyclePeriod", f"`{SchedulerConfig().cycle_period:g}s`"),
        ("eventInterval", f"`{SchedulerConfig().event_interval:g}s`"),
        ("maxRequestsInFlight", f"`{SchedulerConfig().max_requests_in_flight}`"),
        ("schedulerName", f"`{SchedulerConfig().scheduler_name}`"),
        ("defaultQueue", f"`{SchedulerConfig().default_queue}`"),
        ("solverTimeLimit", f"`{SchedulerConfig().placement.time_limit_seconds:g}s`"),
    ],
)
def test_documented_defaults_are_the_loaders(key: str, default: str) -> None:
    row = re.search(rf"^\| `{re.escape(key)}` \|[^|]*\| ([^|]*) \|", DOC.read_text(), re.MULTILINE)
    assert row is not None, key
    assert row.group(1).startswith(default), (key, row.group(1), default)
