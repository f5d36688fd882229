"""What the room left on a GPU device is worth to the pods the cluster runs (LP dual prices).

Online bin packing does best when each share goes where it wastes least of what future
shares could use. The configuration LP of the cluster's own share mix (how many devices,
filled by which patterns of share sizes, the mix needs at least) prices each share size:
its dual ``pi[s]`` is the part of a device a share of size ``s`` is worth when devices are
filled as well as they can be. A device with ``g`` thousandths free can then still earn
``V(g)``: the best total price of shares that fit in ``g`` (an unbounded knapsack).

Placing a share of size ``s`` on a device with ``g`` free loses ``V(g) - V(g - s) - pi[s]``
of value (never negative): zero when the share sits in a pattern the LP would use, more
when it breaks one (a 300 share on a device with 500 free where 500s are common: the 200
left fit nothing the mix asks for). As a per-device node cost, ``V(1000) - V(free)``, its change
is exactly that loss plus the share's own price, which is the same for every place the pod
could go, so a scorer adding it ranks places by the loss.

The prices come from the mix of the pods the cluster runs and waits for (the scorer's
target workload), never from a trace: a cluster whose shares change gets new prices when
its scorer is rebuilt. They ignore CPU, memory and GPU models (the fragmentation measure the
scorer adds them to sees those). On the openb trace (seeds 42-51, batch 64) the term took the
median allocation at 100 % arrived from 96.35-96.38 % (three runs) to 96.62 %; see the
README.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from scheduler.cluster.node import GPU_MILLI

__all__ = ["MAX_SIZES", "best_fill", "gap_costs", "share_prices"]

#: Share sizes priced: the most asked-for ones (a mix with more sizes would make every
#: rebuild slow; the rare ones change little). Sizes left out are priced 0.
MAX_SIZES = 64


def share_prices(demand: Mapping[int, float], rounds: int = 100) -> dict[int, float] | None:
    """Dual price per share size (thousandths of one device, whole devices as
    :data:`GPU_MILLI`) of the configuration LP covering ``demand`` (devices' worth asked per
    size; only the proportions matter); the :data:`MAX_SIZES` most asked-for sizes are
    priced. None when the LP fails.

    Column generation: the LP starts with one pattern per size (as many copies as fit) and
    takes in the pattern the knapsack of the current prices values most while it is worth
    more than one device, at most ``rounds`` times (the openb mix, 21 sizes, settles in
    tens). Prices cut short are scaled down until no fill of a device earns more than one
    device, so what a device's room is worth never exceeds a device (the CP-SAT stage's
    scale relies on it)."""
    asked = [s for s, n in demand.items() if 0 < s <= GPU_MILLI and n > 0]
    sizes = sorted(sorted(asked, key=lambda s: -demand[s])[:MAX_SIZES])
    if not sizes:
        return None
    from ortools.linear_solver import pywraplp  # only a scorer with prices needs it

    solver = pywraplp.Solver.CreateSolver("GLOP")
    if solver is None:
        return None
    total = sum(demand[s] for s in sizes)
    rows = [solver.Constraint(demand[s] / total, solver.infinity()) for s in sizes]
    objective = solver.Objective()
    objective.SetMinimization()

    def add(pattern: Sequence[int]) -> None:
        var = solver.NumVar(0, solver.infinity(), "")
        objective.SetCoefficient(var, 1)
        for row, copies in zip(rows, pattern, strict=True):
            if copies:
                row.SetCoefficient(var, copies)

    for i, s in enumerate(sizes):
        add([GPU_MILLI // s if j == i else 0 for j in range(len(sizes))])
    prices: dict[int, float] = {}
    worth = 0.0
    for _ in range(max(1, rounds)):
        if solver.Solve() != pywraplp.Solver.OPTIMAL:
            return None
        prices = {s: max(0.0, row.dual_value()) for s, row in zip(sizes, rows, strict=True)}
        worth, pattern = best_fill(sizes, [prices[s] for s in sizes])
        if worth <= 1 + 1e-9:
            break
        add(pattern)
    if worth > 1:
        prices = {s: p / worth for s, p in prices.items()}
    return prices


def _fill_values(
    sizes: Sequence[int], prices: Sequence[float]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """Per room ``g`` (0..:data:`GPU_MILLI`), the most shares of ``sizes`` fitting in ``g``
    earn at ``prices`` (an unbounded knapsack), and the index of the last size taken to
    earn it (-1: none)."""
    value = np.zeros(GPU_MILLI + 1)
    last = np.full(GPU_MILLI + 1, -1, dtype=np.int64)
    for i, (s, p) in enumerate(zip(sizes, prices, strict=True)):
        if p <= 0:
            continue
        # Rooms in blocks of s, in order: a block reads the one before it, already holding
        # copies of s, so a room can take any number of them.
        for start in range(s, GPU_MILLI + 1, s):
            stop = min(start + s, GPU_MILLI + 1)
            offer = value[start - s : stop - s] + p
            better = offer > value[start:stop] + 1e-12
            value[start:stop] = np.where(better, offer, value[start:stop])
            last[start:stop] = np.where(better, i, last[start:stop])
    return value, last


def best_fill(sizes: Sequence[int], prices: Sequence[float]) -> tuple[float, list[int]]:
    """The most one device earns at ``prices``, and the copies of each size that earn it."""
    value, last = _fill_values(sizes, prices)
    pattern = [0] * len(sizes)
    g = GPU_MILLI
    while g > 0 and last[g] >= 0:
        pattern[int(last[g])] += 1
        g -= sizes[int(last[g])]
    return float(value[GPU_MILLI]), pattern


def gap_costs(prices: Mapping[int, float]) -> npt.NDArray[np.float64]:
    """Per free thousandths ``g`` (0..:data:`GPU_MILLI`), ``V(GPU_MILLI) - V(g)`` in
    thousandths of a device: what a device with ``g`` free can no longer earn, ``V`` the best
    total price of shares fitting in ``g``."""
    sizes = sorted(prices)
    value, _ = _fill_values(sizes, [prices[s] for s in sizes])
    out: npt.NDArray[np.float64] = (value[GPU_MILLI] - value) * GPU_MILLI
    return out
