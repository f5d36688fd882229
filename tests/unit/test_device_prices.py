"""Dual prices of share sizes and what a device's free room is worth at them."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cluster import GPU, Node, Resources
from scheduler.cluster.node import GPU_MODEL_LABEL
from scheduler.framework.scoring import PodDemand
from scheduler.plugins.device_prices import best_fill, gap_costs, share_prices
from scheduler.plugins.fragmentation import PRICE_WEIGHT, FragmentationScorer, TaskType, WorkloadMix


def _fills(sizes: list[int]) -> list[tuple[int, ...]]:
    """Every multiset of ``sizes`` that fits in one device (brute force)."""
    out = []
    for counts in itertools.product(*[range(1000 // s + 1) for s in sizes]):
        if sum(c * s for c, s in zip(counts, sizes, strict=True)) <= 1000:
            out.append(counts)
    return out


def test_prices_of_one_size_split_a_device_evenly() -> None:
    assert share_prices({500: 7.0}) == pytest.approx({500: 0.5})
    assert share_prices({1000: 3.0, 250: 2.0}) == pytest.approx({1000: 1.0, 250: 0.25})


def test_a_share_that_only_pairs_with_rare_small_ones_is_worth_a_device() -> None:
    """Many 810s, few 190s: each 810 needs its own device, so it is priced at one; the 190s
    ride along for free."""
    prices = share_prices({810: 100.0, 190: 10.0})
    assert prices == pytest.approx({810: 1.0, 190: 0.0})


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from([120, 190, 250, 300, 330, 470, 500, 650, 810, 1000]),
        st.integers(1, 50),
        min_size=1,
        max_size=4,
    )
)
def test_prices_are_the_lp_optimum(demand: dict[int, int]) -> None:
    """Dual feasible: no way to fill a device earns more than one device. And optimal: the
    prices earn as much as the LP's best packing costs, which is at least the devices the
    shares' thousandths need (prices cannot be all zero) and at most what packing each size
    on its own needs."""
    prices = share_prices({s: float(n) for s, n in demand.items()})
    assert prices is not None
    sizes = sorted(demand)
    for fill in _fills(sizes):
        assert sum(c * prices[s] for c, s in zip(fill, sizes, strict=True)) <= 1 + 1e-6
    earned = sum(prices[s] * n for s, n in demand.items())
    assert earned >= sum(s * n for s, n in demand.items()) / 1000 - 1e-6
    assert earned <= sum(n / (1000 // s) for s, n in demand.items()) + 1e-6


def test_best_fill_finds_the_most_valuable_device() -> None:
    worth, pattern = best_fill([300, 500], [0.4, 0.55])
    assert worth == pytest.approx(1.2)  # 3 x 300 beats 500 + 300 (0.95) and 2 x 500 (1.1)
    assert pattern == [3, 0]


def test_gap_costs_are_what_the_room_can_no_longer_earn() -> None:
    costs = gap_costs({500: 0.5, 300: 1 / 3})
    # V(1000) = 1 (two 500s); V(800) = 500 + 300; V(500) = 0.5; V(200) = 0
    assert costs[1000] == pytest.approx(0)
    assert costs[800] == pytest.approx(1000 - 833.333, abs=1e-3)
    assert costs[500] == pytest.approx(500)
    assert costs[200] == pytest.approx(1000)
    assert costs[0] == pytest.approx(1000)
    assert all(a >= b - 1e-9 for a, b in itertools.pairwise(costs))  # more room costs no more


def test_the_scorer_adds_the_weighted_value_lost() -> None:
    """Mostly 500s and a few 300s: a 300 share costs nothing where a 300 or a 500 still fits
    beside it, but on a device with 500 free it spoils a place for a 500."""

    class View:
        node = Node(
            "n",
            Resources({"cpu": 32000, "memory": 64 << 30, GPU: 3}),
            labels=((GPU_MODEL_LABEL, "T4"),),
        )
        free = {"cpu": 8000, "memory": 8 << 30}
        gpu_free = (1000, 800, 500)

    def scorer(weight: float) -> FragmentationScorer:
        mix = WorkloadMix()
        mix.add(TaskType(1000, 1024, 1, 500), 100)
        mix.add(TaskType(1000, 1024, 1, 300), 1)
        return FragmentationScorer(mix, ["T4"], price_weight=weight)

    demand = PodDemand(Resources({"cpu": 1000, "memory": 1 << 30}), 1, 300)
    plain, priced = scorer(0.0), scorer(4.0)
    lost = {0: 0.0, 1: 0.0, 2: 500 / 3}  # (V(g) - V(g - 300) - price of 300) x 1000
    for device, extra in lost.items():
        before = plain.score(View(), demand, [(device, 300)])
        after = priced.score(View(), demand, [(device, 300)])
        # The share's own price (1000 / 3) is paid wherever it goes.
        assert after - before == pytest.approx(4.0 * (extra + 1000 / 3), abs=1e-4)
    assert priced.pick_devices(View(), demand) != (2,)


def test_the_weight_is_a_placement_setting() -> None:
    from scheduler.config import ConfigError, parse_config

    assert parse_config(None).placement.share_price_weight == PRICE_WEIGHT
    assert parse_config({"placement": {"sharePriceWeight": 0}}).placement.share_price_weight == 0
    assert (
        parse_config({"placement": {"sharePriceWeight": 2.5}}).placement.share_price_weight == 2.5
    )
    for bad in (-1, "high", True):
        with pytest.raises(ConfigError, match=r"placement\.sharePriceWeight"):
            parse_config({"placement": {"sharePriceWeight": bad}})


def test_a_kept_scorer_is_kept_only_for_the_same_weight() -> None:
    from scheduler.cluster import GpuRequest, Pod, Snapshot
    from scheduler.plugins.scorer_memory import ScorerMemory

    pods = tuple(
        Pod(
            uid=f"p{i}",
            namespace="ns",
            name=f"p{i}",
            requests=Resources({"cpu": 1000, "memory": 1 << 30}),
            gpu=GpuRequest(1, 300),
        )
        for i in range(3)
    )
    snapshot = Snapshot(pods=pods)
    memory = ScorerMemory()
    first = memory.scorer_for(snapshot, price_weight=4.0)
    assert first.price_weight == 4.0
    assert memory.scorer_for(snapshot, price_weight=4.0) is first
    plain = memory.scorer_for(snapshot, price_weight=0.0)
    assert plain is not first and plain.price_weight == 0.0
    # Without prices a device's room costs nothing beyond fragmentation.
    assert plain.node_fragmentation(1000, 1024, (1000, 700), None) < first.node_fragmentation(
        1000, 1024, (1000, 700), None
    )


def test_prices_cut_short_still_never_value_a_device_above_one() -> None:
    """One round leaves the starting patterns' prices (a 300 alone: 1/3, a 500: 1/2), under
    which 500 + 300 + ... would earn more than a device: they are scaled down."""
    demand = {500: 5.0, 300: 5.0, 190: 5.0}
    short = share_prices(demand, rounds=1)
    assert short is not None
    sizes = sorted(short)
    worth, _ = best_fill(sizes, [short[s] for s in sizes])
    assert worth <= 1 + 1e-9
    assert max(gap_costs(short)) <= 1000 + 1e-6


def test_only_the_most_asked_sizes_are_priced() -> None:
    from scheduler.plugins.device_prices import MAX_SIZES

    demand = {s: float(s) for s in range(100, 100 + MAX_SIZES + 10)}
    prices = share_prices(demand, rounds=3)
    assert prices is not None and len(prices) == MAX_SIZES
    assert min(prices) == 110  # the ten least asked for (100-109) are left out
