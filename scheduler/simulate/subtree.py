"""Queue-tree views of per-queue numbers: subtree sums and the depth-first display order.

The simulator samples what each queue's *own* pods hold; a parent queue's fair share covers
its whole subtree, so anything shown next to it (plots, peaks, GPU-hours) must be summed up
the tree first.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping

from scheduler.simulate.ordering import natural_key

__all__ = ["subtree_sums", "tree_order"]


def subtree_sums(own: Mapping[str, float], parents: Mapping[str, str]) -> dict[str, float]:
    """Per queue: its own value plus every descendant's (``parents``: queue -> parent, "" for
    a root). Queues missing from ``parents`` count only for themselves."""
    totals: dict[str, float] = defaultdict(float)
    for queue, value in own.items():
        q = queue
        seen: set[str] = set()
        while q and q not in seen:  # ``seen`` guards a broken tree with a cycle of parents
            seen.add(q)
            totals[q] += value
            q = parents.get(q, "")
    return dict(totals)


def tree_order(parents: Mapping[str, str]) -> Iterator[tuple[int, str]]:
    """``(depth, queue)`` depth-first from the roots, siblings in natural order, so children
    sit under their parent. A queue whose parent is unknown is shown as a root."""
    children: dict[str, list[str]] = defaultdict(list)
    for name, parent in parents.items():
        children[parent if parent in parents else ""].append(name)
    done: set[str] = set()

    def walk(name: str, depth: int) -> Iterator[tuple[int, str]]:
        if name in done:
            return
        done.add(name)
        yield depth, name
        for child in sorted(children.get(name, []), key=natural_key):
            yield from walk(child, depth + 1)

    for root in sorted(children.get("", []), key=natural_key):
        yield from walk(root, 0)
    # Queues in a cycle of parents have no root above them: list them too, at the end.
    for name in sorted(set(parents) - done, key=natural_key):
        yield from walk(name, 0)
