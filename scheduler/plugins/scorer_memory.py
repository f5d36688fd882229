"""The fragmentation scorer kept from one cycle to the next.

A cycle's fragmentation scorer measures node states against the cluster's own workload mix
(:func:`~scheduler.plugins.fragmentation.snapshot_mix`). Built afresh each cycle it
measures every node state again, though between two cycles only the nodes that took pods
changed, and the mix moved by the few pods that arrived or left: on the openb replay at
batch 64 that re-measuring was a quarter of the cycle.

:class:`ScorerMemory` keeps the last scorer, and with it every node state it measured, while
the cycle's mix stays close to the mix it was built from (L1 distance of the two
distributions of task types at most ``tolerance``); the model-scarcity term, which reads
what is free, is still recomputed each cycle. When the mix has moved further, or the GPU
models changed, the cycle gets a new scorer, which is kept in turn. So what a cycle decides
depends on the mixes of earlier cycles, within ``tolerance``: the same trade the per-pod
replay makes with its refresh interval.
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduler.cluster.snapshot import Snapshot
from scheduler.plugins.fragmentation import (
    PRICE_WEIGHT,
    FragmentationScorer,
    WorkloadMix,
    frozen_capacity,
    snapshot_mix,
)

__all__ = ["ScorerMemory", "mix_distance"]


def mix_distance(a: WorkloadMix, b: WorkloadMix) -> float:
    """L1 distance between the two mixes' task-type distributions (0: same, 2: disjoint)."""
    ta, tb = sum(a.counts.values()), sum(b.counts.values())
    if ta <= 0 or tb <= 0:
        return 0.0 if ta == tb else 2.0
    return sum(
        abs(a.counts.get(t, 0.0) / ta - b.counts.get(t, 0.0) / tb)
        for t in a.counts.keys() | b.counts.keys()
    )


class ScorerMemory:
    """Hands each cycle a fragmentation scorer, reusing the last one when the mix allows."""

    def __init__(self, tolerance: float = 0.05, max_states: int = 100_000) -> None:
        self.tolerance = tolerance
        #: Node states a kept scorer remembers before it starts over (~50 MB): it lives as
        #: long as the scheduler, where a scorer used to live for one cycle.
        self.max_states = max_states
        self._kept: FragmentationScorer | None = None
        #: The mix and models the kept scorer's measure was built from.
        self._basis: WorkloadMix | None = None
        self._models: list[str] = []
        #: Cycles served by the kept scorer, and scorers built (for tests and logs).
        self.reused = 0
        self.built = 0

    def scorer_for(
        self,
        snapshot: Snapshot,
        free: Mapping[str, int] | None = None,
        price_weight: float = PRICE_WEIGHT,
    ) -> FragmentationScorer:
        """A scorer for this cycle; ``free`` (GPU thousandths free per model) turns on the
        model-scarcity term; ``price_weight`` is the scorer's (a changed weight is a new
        measure)."""
        mix, models = snapshot_mix(snapshot)
        capacity = frozen_capacity(free)
        kept, basis = self._kept, self._basis
        if (
            kept is not None
            and basis is not None
            and models == self._models
            and kept.price_weight == max(0.0, price_weight)
            and mix_distance(basis, mix) <= self.tolerance
        ):
            kept.retarget(mix, capacity)
            self.reused += 1
            return kept
        fresh = FragmentationScorer(mix, models, capacity=capacity, price_weight=price_weight)
        fresh.memo_limit = self.max_states
        self._kept, self._basis, self._models = fresh, mix, models
        self.built += 1
        return fresh
