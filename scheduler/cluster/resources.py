"""Resource lists in the integer units the scheduler computes with.

``cpu`` is kept in millicores; every other resource (memory and ephemeral-storage in bytes,
``pods``, ``nvidia.com/gpu`` and any extended resource) in whole units. Integers keep node-fit
checks exact and let the CP-SAT model use the same numbers without scaling surprises.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from typing import Any

from scheduler.cluster.quantity import QuantityError, to_int_units, to_milli

__all__ = [
    "CPU",
    "EPHEMERAL_STORAGE",
    "GPU",
    "MEMORY",
    "PODS",
    "Resources",
]

CPU = "cpu"
MEMORY = "memory"
EPHEMERAL_STORAGE = "ephemeral-storage"
PODS = "pods"
GPU = "nvidia.com/gpu"


class Resources(Mapping[str, int]):
    """An immutable, hashable map from resource name to an integer amount.

    Zero entries are dropped so two lists that mean the same compare equal.
    """

    __slots__ = ("_hash", "_items")

    def __init__(self, items: Mapping[str, int] | Iterable[tuple[str, int]] = ()) -> None:
        pairs = items.items() if isinstance(items, Mapping) else items
        self._items: dict[str, int] = {k: int(v) for k, v in pairs if int(v) != 0}
        self._hash: int | None = None

    @classmethod
    def from_k8s(
        cls, quantities: Mapping[str, Any] | None, *, field: str = "resources"
    ) -> Resources:
        """Convert a Kubernetes ``{name: quantity}`` map, naming ``field`` in any error."""
        out: dict[str, int] = {}
        for name, raw in (quantities or {}).items():
            try:
                out[name] = to_milli(raw) if name == CPU else to_int_units(raw)
            except QuantityError as e:
                raise QuantityError(f"{field}.{name}: {e}") from e
            if out[name] < 0:
                raise QuantityError(f"{field}.{name}: quantity {raw!r} must not be negative")
        return cls(out)

    def __getitem__(self, key: str) -> int:
        return self._items.get(key, 0)

    # Mapping's generic views go through __getitem__ per key; the solver's per-pod loops over
    # thousands of nodes are dominated by that, so delegate straight to the dict.
    def get(self, key: str, default: int = 0) -> int:  # type: ignore[override]
        """The amount of ``key``; absent resources are ``default`` (0: none requested)."""
        return self._items.get(key, default)

    def items(self) -> ItemsView[str, int]:
        """(name, amount) pairs, non-zero only."""
        return self._items.items()

    def keys(self) -> KeysView[str]:
        """Resource names with a non-zero amount."""
        return self._items.keys()

    def values(self) -> ValuesView[int]:
        """Non-zero amounts."""
        return self._items.values()

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self._items.items()))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Resources):
            return self._items == other._items
        if isinstance(other, Mapping):
            return self._items == {k: v for k, v in other.items() if v != 0}
        return NotImplemented

    def __repr__(self) -> str:
        return f"Resources({self._items!r})"

    def __add__(self, other: Mapping[str, int]) -> Resources:
        out = dict(self._items)
        for k, v in other.items():
            out[k] = out.get(k, 0) + v
        return Resources(out)

    def __sub__(self, other: Mapping[str, int]) -> Resources:
        out = dict(self._items)
        for k, v in other.items():
            out[k] = out.get(k, 0) - v
        return Resources(out)

    def scaled(self, factor: int) -> Resources:
        """Every amount multiplied by ``factor``."""
        return Resources({k: v * factor for k, v in self._items.items()})

    def fits_in(self, capacity: Mapping[str, int]) -> bool:
        """True when every requested amount is available in ``capacity``."""
        return all(v <= capacity.get(k, 0) for k, v in self._items.items() if v > 0)

    def shortfall(self, capacity: Mapping[str, int]) -> dict[str, int]:
        """Per resource, how much more than ``capacity`` is requested (only positive entries)."""
        return {k: v - capacity.get(k, 0) for k, v in self._items.items() if v > capacity.get(k, 0)}

    def to_dict(self) -> dict[str, int]:
        """A plain, sorted dict (the JSON form)."""
        return dict(sorted(self._items.items()))
