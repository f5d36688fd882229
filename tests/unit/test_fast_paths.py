"""Hand-inlined fast paths give what the code they stand in for gives.

Each of these was written out for speed (asked thousands of times per cycle at 5,000 nodes):
the queue sort key (instead of QueueStatus's share methods), the renaming of names in a
cached explanation (instead of a regular expression per gang class), and the one-pod units
of the take-back stage (instead of the general unit builder). Random inputs, compared with
the general form.
"""

from __future__ import annotations

import random
import re
from dataclasses import replace

from scheduler.bench.synthetic import ClusterSpec, synthetic_snapshot
from scheduler.cluster.queue import pod_queue_usage
from scheduler.explain.reasons import _rename
from scheduler.fairness.ordering import queue_sort_key
from scheduler.fairness.share import QueueStatus
from scheduler.fairness.usage import add_usage
from scheduler.solver.victim_prospects import lowest_running_priority
from scheduler.solver.victims import _unit, build_units

RESOURCES = ("gpu", "cpu", "memory")


def _usage(rng: random.Random) -> dict[str, int] | None:
    if rng.random() < 0.15:
        return None if rng.random() < 0.5 else {}
    return {r: rng.choice([0, 0, 1, 5, 10, -3, 1000]) for r in RESOURCES if rng.random() < 0.7}


def _reference_sort_key(
    status: QueueStatus, extra: dict[str, int] | None, ask: dict[str, int] | None
) -> tuple[int, float, int, float, str]:
    after = dict(extra or {})
    if ask:
        add_usage(after, dict(ask))
        below = status.within_fair_share(after)
    else:
        below = status.below_fair_share(extra)
    share = status.dominant_share(after)
    return (0 if below else 1, share, -status.priority, status.creation_time, status.name)


def test_queue_sort_key_is_what_the_queue_status_says() -> None:
    rng = random.Random(1)
    for _ in range(20_000):
        status = QueueStatus(name="q", fair_share=_usage(rng) or {}, allocated=_usage(rng) or {})
        extra, ask = _usage(rng), _usage(rng)
        assert queue_sort_key(status, extra, ask) == _reference_sort_key(status, extra, ask)


def _reference_rename(message: str, first: list[str], names: list[str]) -> str:
    found = [i for i, n in enumerate(first) if n in message and n != names[i]]
    if not found:
        return message
    mapping = {first[i]: names[i] for i in found}
    pattern = re.compile("|".join(re.escape(n) for n in sorted(mapping, key=len, reverse=True)))
    return pattern.sub(lambda m: mapping[m.group(0)], message)


def test_rename_replaces_as_one_regular_expression_of_the_names_would() -> None:
    rng = random.Random(0)
    alphabet = "ab/-01"
    for _ in range(20_000):
        k = rng.randint(1, 5)
        first = ["".join(rng.choices(alphabet, k=rng.randint(1, 4))) for _ in range(k)]
        names = ["".join(rng.choices(alphabet + "xy", k=rng.randint(1, 5))) for _ in range(k)]
        message = "".join(rng.choices(alphabet + " ", k=rng.randint(0, 30)))
        assert _rename(message, first, names) == _reference_rename(message, first, names)


def test_one_pod_units_are_built_as_the_general_builder_builds_them() -> None:
    snapshot = synthetic_snapshot(ClusterSpec(60, 8, 20, 0.8, 3, 0, (50, 100), 0.5, 0.0))
    units = build_units(snapshot)
    gangs = snapshot.gang_by_key
    one_pod = [u for u in units if u.whole and len(u.pods) == 1]
    assert one_pod
    for u in one_pod:
        pod = u.pods[0]
        general = _unit(u.id, gangs[u.gang], [pod], [pod_queue_usage(pod)], whole=True)
        assert u == general
        assert u.nodes == general.nodes
        assert list(u.usage) == list(general.usage)


def test_pods_on_a_deleted_node_are_no_victims() -> None:
    """Evicting a pod whose node is gone frees nothing: it is no unit, and its queue's
    lowest running priority does not count it."""
    snapshot = synthetic_snapshot(ClusterSpec(60, 8, 20, 0.8, 3, 0, (50, 100), 0.5, 0.0))
    units = build_units(snapshot)
    assert units
    gone = units[0].nodes
    nodes = tuple(n for n in snapshot.nodes if n.name not in gone)
    left = replace(snapshot, nodes=nodes)
    remaining = build_units(left)
    assert remaining and all(not (u.nodes & gone) for u in remaining)
    on_gone = {u.gang for u in units if u.nodes & gone}
    assert on_gone and on_gone.isdisjoint({u.gang for u in remaining})
    assert lowest_running_priority(snapshot)
    assert lowest_running_priority(replace(snapshot, nodes=())) == {}
    assert build_units(replace(snapshot, nodes=())) == []
