"""The queue tree: structure, findings for bad trees, and what a pod counts against a queue."""

from __future__ import annotations

import pytest

from scheduler.cluster.pod import GpuRequest, Pod
from scheduler.cluster.queue import Queue, QueueTree, pod_queue_usage
from scheduler.cluster.resources import Resources


def tree(*pairs: tuple[str, str]) -> QueueTree:
    return QueueTree.build([Queue(name, parent=parent) for name, parent in pairs])


def test_healthy_tree_structure() -> None:
    t = tree(("org", ""), ("b", "org"), ("a", "org"), ("a1", "a"), ("solo", ""))
    assert t.findings == ()
    assert t.roots() == ["org", "solo"]
    assert t.children("org") == ["a", "b"]
    assert t.is_leaf("a1") and not t.is_leaf("a")
    assert t.ancestors("a1") == ["a1", "a", "org"]
    assert "a" in t and "zzz" not in t
    assert {q.name for q in t} == {"org", "a", "b", "a1", "solo"}


@pytest.mark.parametrize(
    ("pairs", "broken", "text"),
    [
        # unknown parent, and everything below it
        (
            [("a", "ghost"), ("a1", "a"), ("ok", "")],
            {"a", "a1"},
            "parent queue ghost does not exist",
        ),
        # a two-queue cycle with a child hanging below it
        ([("x", "y"), ("y", "x"), ("x1", "x"), ("ok", "")], {"x", "y", "x1"}, "cycle"),
        # a queue naming itself
        ([("me", "me"), ("ok", "")], {"me"}, "names itself"),
        # a longer cycle
        ([("p", "q"), ("q", "r"), ("r", "p"), ("ok", "")], {"p", "q", "r"}, "form a cycle"),
    ],
)
def test_bad_trees_are_findings(pairs: list[tuple[str, str]], broken: set[str], text: str) -> None:
    t = tree(*pairs)
    assert t.broken == broken
    assert any(text in f.message for f in t.findings)
    assert all(f.field == "spec.parentQueue" for f in t.findings)
    # The rest of the tree still works.
    assert t.roots() == ["ok"]
    assert t.finding_for("ok") is None
    for name in broken:
        finding = t.finding_for(name)
        assert finding is not None and finding.queue == name


def test_descendant_of_broken_queue_names_the_ancestor() -> None:
    t = tree(("a", "ghost"), ("a1", "a"))
    finding = t.finding_for("a1")
    assert finding is not None and "ancestor queue a is invalid" in finding.message


def test_ancestors_stop_on_cycles() -> None:
    t = tree(("x", "y"), ("y", "x"))
    assert t.ancestors("x") == ["x", "y"]


def test_duplicate_names_are_findings() -> None:
    t = QueueTree.build([Queue("a"), Queue("a", priority=5)])
    assert [f.field for f in t.findings] == ["metadata.name"]
    assert t.queues["a"].priority == 5


@pytest.mark.parametrize(
    ("pod", "usage"),
    [
        (
            Pod(
                "u",
                "ns",
                "p",
                Resources({"cpu": 500, "memory": 1024, "nvidia.com/gpu": 2}),
                gpu=GpuRequest(2),
            ),
            {"gpu": 2000, "cpu": 500, "memory": 1024},
        ),
        (Pod("u", "ns", "p", gpu=GpuRequest(1, 500)), {"gpu": 500, "cpu": 0, "memory": 0}),
        (Pod("u", "ns", "p", gpu=GpuRequest(2, 250)), {"gpu": 500, "cpu": 0, "memory": 0}),
        # a memory-sized share on an unknown node counts as a whole device
        (Pod("u", "ns", "p", gpu=GpuRequest(1, 1000, 8000)), {"gpu": 1000, "cpu": 0, "memory": 0}),
        # once bound, the actual grant counts
        (
            Pod(
                "u", "ns", "p", gpu=GpuRequest(1, 1000, 8000), node_name="n", gpu_grant=((0, 200),)
            ),
            {"gpu": 200, "cpu": 0, "memory": 0},
        ),
        (
            Pod("u", "ns", "p", Resources({"nvidia.com/gpu": 1})),
            {"gpu": 1000, "cpu": 0, "memory": 0},
        ),
    ],
)
def test_pod_queue_usage(pod: Pod, usage: dict[str, int]) -> None:
    assert pod_queue_usage(pod) == usage


_FINDINGS_SCRIPT = """
import itertools, json, sys
from scheduler.cluster.queue import Queue, QueueTree
pairs = [("r", "q"), ("q", "p"), ("p", "r"), ("c", "r"), ("y", "x"), ("x", "y"), ("x1", "x")]
out = set()
for order in itertools.islice(itertools.permutations(pairs), 0, None, 7):
    if len(out) > 1:
        break
    t = QueueTree.build([Queue(n, parent=p) for n, p in order])
    out.add(json.dumps([(f.queue, f.message) for f in t.findings]))
print(json.dumps(sorted(out)))
"""


def test_cycle_findings_read_the_same_whatever_the_order_and_hash_seed() -> None:
    """The same broken tree words its findings identically across input orders and runs
    (networkx's cycle search follows set order, which PYTHONHASHSEED changes)."""
    import os
    import subprocess
    import sys

    seen: set[str] = set()
    for seed in ("0", "1", "7", "42", "977"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run(
            [sys.executable, "-c", _FINDINGS_SCRIPT],
            env=env, capture_output=True, text=True, check=True, timeout=120,
        )  # fmt: skip
        seen.update(__import__("json").loads(proc.stdout))
    assert len(seen) == 1, seen
    findings = dict(__import__("json").loads(seen.pop()))
    assert findings["p"] == "queue parents form a cycle: p -> q -> r -> p"
    assert findings["x"] == "queue parents form a cycle: x -> y -> x"
    assert findings["c"].startswith("ancestor queue")
