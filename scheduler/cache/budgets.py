"""PodDisruptionBudgets resolved against the cache's pods into
:class:`~scheduler.cluster.disruption.DisruptionBudget` values for the snapshot.

A budget covers the pods of its namespace that its ``spec.selector`` matches (``policy/v1``: an
empty selector matches every pod of the namespace, a missing one none) and that still count:
not finished, not being deleted. ``allowed`` is ``status.disruptionsAllowed``, or 0 while the
disruption controller has not observed the budget's latest spec (the Eviction API refuses then
too).

:class:`BudgetIndex` does work in proportion to what changed, since the cache serves clusters
of tens of thousands of pods:

- a pod event in a namespace without budgets costs a dict lookup;
- a pod event in a namespace with budgets is matched against the budgets of that namespace
  its labels can match (budgets are filed under one of their ``matchLabels`` pairs);
- a new budget, or one whose selector changed, is matched against the pods at the next
  :meth:`BudgetIndex.budgets` call, in one pass over the pods for all such budgets together
  (a relist of hundreds of budgets costs one pass, not one per budget);
- a status-only change (``disruptionsAllowed``) rebuilds that one budget;
- :meth:`BudgetIndex.budgets` returns the same tuple until something changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from scheduler.cluster.disruption import DisruptionBudget
from scheduler.cluster.selectors import LabelSelector, NodeSelectorRequirement

__all__ = ["BudgetIndex", "LabelSelector", "parse_label_selector"]

log = structlog.get_logger("scheduler.cache.budgets")

_LABEL_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def parse_label_selector(raw: Any) -> LabelSelector | None:
    """The selector of ``raw`` (a LabelSelector in JSON form); None when it selects nothing:
    missing, or unreadable (the API server validates selectors, so only a hand-fed object
    gets here; selecting nothing is the safe reading)."""
    if not isinstance(raw, Mapping):
        return None
    labels = raw.get("matchLabels") or {}
    expressions = raw.get("matchExpressions") or []
    if not isinstance(labels, Mapping) or not isinstance(expressions, list):
        return None
    parsed: list[NodeSelectorRequirement] = []
    for e in expressions:
        if not isinstance(e, Mapping) or e.get("operator") not in _LABEL_OPERATORS:
            return None
        values = e.get("values") or []
        if not isinstance(values, list):
            return None
        parsed.append(
            NodeSelectorRequirement(str(e.get("key") or ""), e["operator"], tuple(map(str, values)))
        )
    return LabelSelector(tuple(sorted((str(k), str(v)) for k, v in labels.items())), tuple(parsed))


def _allowed(obj: Mapping[str, Any]) -> int:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    generation = meta.get("generation")
    observed = status.get("observedGeneration")
    if isinstance(generation, int) and (not isinstance(observed, int) or observed < generation):
        return 0
    allowed = status.get("disruptionsAllowed")
    return max(0, allowed) if isinstance(allowed, int) and not isinstance(allowed, bool) else 0


def _pod_facts(obj: Mapping[str, Any]) -> tuple[str, str, Mapping[str, str], bool]:
    """(uid, namespace, labels, counts) of a pod in the store's slim JSON form."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace") or ""
    uid = meta.get("uid") or f"{namespace}/{meta.get('name') or ''}"
    phase = (obj.get("status") or {}).get("phase")
    counts = phase not in ("Succeeded", "Failed") and not meta.get("deletionTimestamp")
    return uid, namespace, meta.get("labels") or {}, counts


@dataclass(slots=True)
class _Budget:
    namespace: str
    name: str
    raw_selector: Any
    selector: LabelSelector | None
    allowed: int
    #: Matching pod uid -> whether it counts (not finished, not being deleted).
    members: dict[str, bool] = field(default_factory=dict)
    built: DisruptionBudget | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class _Selectors:
    """The budgets of one namespace, found from a pod's labels without trying each: a budget
    with ``matchLabels`` is filed under one of its pairs (a pod without that pair cannot
    match it); only the others (expressions only, or empty) are tried on every pod. A
    namespace with thousands of budgets (one per job) then costs a few lookups per pod."""

    __slots__ = ("anchored", "rest")

    def __init__(self) -> None:
        self.anchored: dict[tuple[str, str], dict[str, _Budget]] = {}
        self.rest: dict[str, _Budget] = {}

    def __bool__(self) -> bool:
        return bool(self.anchored or self.rest)

    def add(self, budget: _Budget) -> None:
        selector = budget.selector
        assert selector is not None
        if selector.match_labels:
            self.anchored.setdefault(selector.match_labels[0], {})[budget.key] = budget
        else:
            self.rest[budget.key] = budget

    def remove(self, budget: _Budget) -> None:
        selector = budget.selector
        assert selector is not None
        if not selector.match_labels:
            self.rest.pop(budget.key, None)
            return
        pair = selector.match_labels[0]
        group = self.anchored.get(pair)
        if group is not None:
            group.pop(budget.key, None)
            if not group:
                del self.anchored[pair]

    def matching(self, labels: Mapping[str, str]) -> list[_Budget]:
        found = [b for b in self.rest.values() if b.selector and b.selector.matches(labels)]
        if self.anchored:
            for pair in labels.items():
                group = self.anchored.get(pair)
                if group:
                    found += [
                        b for b in group.values() if b.selector and b.selector.matches(labels)
                    ]
        return found


class BudgetIndex:
    """Budgets by key and the pods each covers (see the module docstring). Not thread-safe."""

    def __init__(self) -> None:
        self._budgets: dict[str, _Budget] = {}
        #: Budgets with a selector, per namespace (a budget without one covers nothing).
        self._by_namespace: dict[str, _Selectors] = {}
        #: Pod uid -> keys of the budgets that match it (only pods some budget matches).
        self._member_of: dict[str, set[str]] = {}
        #: Budgets to match against every pod of their namespace at the next :meth:`budgets`.
        self._rescan: dict[str, _Budget] = {}
        self._result: tuple[DisruptionBudget, ...] | None = ()

    # --- pods ----------------------------------------------------------------------------

    def pod_changed(self, obj: Mapping[str, Any]) -> None:
        """A pod was added or changed (``obj`` as the store keeps it: metadata and phase)."""
        meta = obj.get("metadata") or {}
        # A pod never changes namespace, and a budget's removal forgets its members: a pod of
        # a namespace without budgets is in none.
        selectors = self._by_namespace.get(meta.get("namespace") or "")
        if not selectors:
            return
        uid, _, labels, counts = _pod_facts(obj)
        old = self._member_of.get(uid, set())
        matched = selectors.matching(labels)
        new = {b.key for b in matched}
        for key in old - new:
            budget = self._budgets.get(key)
            if budget is not None and budget.members.pop(uid, None) is not None:
                self._dirty(budget)
        for budget in matched:
            if budget.members.get(uid) != counts:
                budget.members[uid] = counts
                self._dirty(budget)
        if new:
            self._member_of[uid] = new
        else:
            self._member_of.pop(uid, None)

    def pod_removed(self, uid: str) -> None:
        """A pod is gone."""
        for key in self._member_of.pop(uid, ()):
            budget = self._budgets.get(key)
            if budget is not None and budget.members.pop(uid, None) is not None:
                self._dirty(budget)

    # --- budgets -------------------------------------------------------------------------

    def budget_changed(self, key: str, obj: Mapping[str, Any]) -> bool:
        """A PodDisruptionBudget was added or changed; True when it may now allow more than
        before (selector changed, more disruptions allowed), which may unblock a plan."""
        meta = obj.get("metadata") or {}
        raw_selector = (obj.get("spec") or {}).get("selector")
        allowed = _allowed(obj)
        old = self._budgets.get(key)
        if old is not None and old.raw_selector == raw_selector:
            if old.allowed == allowed:
                return False
            loosened = allowed > old.allowed
            old.allowed = allowed
            self._dirty(old)
            return loosened
        if old is not None:
            self.budget_removed(key)
        selector = parse_label_selector(raw_selector)
        if raw_selector is not None and selector is None:
            log.warning("pdb_selector_unreadable", pdb=key, selector=raw_selector)
        budget = _Budget(
            meta.get("namespace") or "", meta.get("name") or "", raw_selector, selector, allowed
        )
        self._budgets[key] = budget
        if selector is not None:
            self._by_namespace.setdefault(budget.namespace, _Selectors()).add(budget)
            self._rescan[key] = budget
        self._result = None
        return old is not None

    def budget_removed(self, key: str) -> bool:
        """A PodDisruptionBudget was deleted; True when it existed."""
        budget = self._budgets.pop(key, None)
        if budget is None:
            return False
        self._forget_members(budget)
        selectors = self._by_namespace.get(budget.namespace)
        if selectors is not None and budget.selector is not None:
            selectors.remove(budget)
            if not selectors:
                del self._by_namespace[budget.namespace]
        self._rescan.pop(key, None)
        self._result = None
        return True

    def budgets(
        self, pods: Callable[[], Iterable[Mapping[str, Any]]]
    ) -> tuple[DisruptionBudget, ...]:
        """Every budget that covers at least one pod, by key. ``pods`` gives every pod the
        store holds; it is only called when new or changed selectors must be matched.

        A budget's ``pod_uids`` are in the order the cache came to know them (sorting tens of
        thousands of uids per change of a big budget would cost more than the rest of the
        snapshot); they are a set in meaning.
        """
        if self._rescan:
            self._match_all(pods())
        if self._result is None:
            built = []
            for key in sorted(self._budgets):
                budget = self._budgets[key]
                if budget.built is None:
                    uids = tuple([u for u, counts in budget.members.items() if counts])
                    budget.built = DisruptionBudget(
                        budget.namespace, budget.name, uids, budget.allowed
                    )
                if budget.built.pod_uids:
                    built.append(budget.built)
            self._result = tuple(built)
        return self._result

    def _forget_members(self, budget: _Budget) -> None:
        for uid in budget.members:
            keys = self._member_of.get(uid)
            if keys is not None:
                keys.discard(budget.key)
                if not keys:
                    del self._member_of[uid]
        budget.members.clear()
        self._dirty(budget)

    def _match_all(self, pods: Iterable[Mapping[str, Any]]) -> None:
        by_namespace: dict[str, _Selectors] = {}
        for budget in self._rescan.values():
            self._forget_members(budget)
            by_namespace.setdefault(budget.namespace, _Selectors()).add(budget)
        self._rescan.clear()
        for obj in pods:
            namespace = (obj.get("metadata") or {}).get("namespace") or ""
            selectors = by_namespace.get(namespace)
            if selectors is None:
                continue
            uid, _, labels, counts = _pod_facts(obj)
            for budget in selectors.matching(labels):
                budget.members[uid] = counts
                self._member_of.setdefault(uid, set()).add(budget.key)

    def _dirty(self, budget: _Budget) -> None:
        budget.built = None
        self._result = None
