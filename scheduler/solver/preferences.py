"""Choosing among nodes by a pod's preferences (preferred affinity, ScheduleAnyway spread,
preferred node affinity), after the greedy has ranked them for packing.

The greedy hands over the first allowed nodes in packing order (:data:`PREFERENCE_CANDIDATES`,
at most :data:`PER_CLASS_CANDIDATES` of a node class); :func:`preferred` picks one, the way
kube-scheduler adds its normalised plugin scores when the packing score is kube-scheduler's
own, else with the preferences first.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.plugins.podtopology import SPREAD_IGNORED, Preference

__all__ = ["PER_CLASS_CANDIDATES", "PREFERENCE_CANDIDATES", "PREFERENCE_WEIGHTS", "preferred"]

#: Nodes a pod with preferences chooses among: the first allowed ones in packing order
#: (at most :data:`PER_CLASS_CANDIDATES` of a class). A preference never costs a scan of
#: every node.
PREFERENCE_CANDIDATES = 32
PER_CLASS_CANDIDATES = 8
#: Weights of the preference parts (pod affinity, spread, node affinity): kube-scheduler's
#: default weights of InterPodAffinity, PodTopologySpread and NodeAffinity (2 each; its
#: NodeResourcesFit and NodeResourcesBalancedAllocation weigh 1 each, 100 points a score).
PREFERENCE_WEIGHTS = (2.0, 2.0, 2.0)
#: Highest score of one kube-scheduler score plugin, after normalising.
_MAX_NODE_SCORE = 100.0


def preferred(
    candidates: Sequence[str], prefer: Preference, points: Sequence[float | None]
) -> str | None:
    """The candidate that meets the preferences best (the first such, in packing order).

    When every candidate has a kube-scheduler resource score (``points``), the parts are
    normalised as kube-scheduler normalises its scores and added to it with its default
    weights, so a weak preference can lose to a much emptier node as it does there.
    Otherwise the preferences outrank packing, which only orders the candidates."""
    if not candidates:
        return None
    parts = [prefer(n) for n in candidates]
    if all(p is not None for p in points) and len(points) == len(candidates):
        totals = [float(p or 0.0) for p in points]
        columns = _kube_normalised(parts)
    else:
        totals = [0.0] * len(candidates)
        columns = [_min_max([p[i] for p in parts]) for i in range(len(PREFERENCE_WEIGHTS))]
    for weight, column in zip(PREFERENCE_WEIGHTS, columns, strict=True):
        for j, v in enumerate(column):
            totals[j] += weight * v
    best = max(totals)
    return candidates[totals.index(best)]


def _min_max(column: Sequence[float]) -> list[float]:
    """``column`` scaled to [0, 1] between its lowest and highest value (all 0 when equal)."""
    low, high = min(column), max(column)
    if high <= low:
        return [0.0] * len(column)
    return [(v - low) / (high - low) for v in column]


def _kube_normalised(parts: Sequence[tuple[float, float, float]]) -> list[list[float]]:
    """The preference parts normalised to 0-100 as kube-scheduler's NormalizeScore does:

    - InterPodAffinity: between the lowest and highest score (all 0 when equal);
    - PodTopologySpread (the part is minus the matching pods): ``100 * (max + min - s) /
      max`` over the matching counts ``s`` (100 when every count is 0), 0 for a node
      without a constraint's key. Its per-constraint weights (log of the domain count) and
      ``maxSkew - 1`` offsets are left out: with one constraint they change how far apart
      nodes score, not their order;
    - NodeAffinity: ``100 * s / max`` (all 0 when the highest is 0).
    """
    near = [_MAX_NODE_SCORE * v for v in _min_max([p[0] for p in parts])]
    counts = [-p[1] if p[1] > -SPREAD_IGNORED / 2 else None for p in parts]
    valid = [c for c in counts if c is not None]
    spread = [0.0] * len(parts)
    if valid:
        low, high = min(valid), max(valid)
        for j, c in enumerate(counts):
            if c is not None:
                spread[j] = (
                    _MAX_NODE_SCORE if high <= 0 else _MAX_NODE_SCORE * (high + low - c) / high
                )
    top = max(p[2] for p in parts)
    wanted = [_MAX_NODE_SCORE * p[2] / top if top > 0 else 0.0 for p in parts]
    return [near, spread, wanted]
