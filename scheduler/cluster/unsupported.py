"""Placement rules of a pod the scheduler does not evaluate yet, and its scheduling gates.

The product's rule: a field that affects where a pod may run and is not implemented makes the
pod wait with a reason that names it; it is never silently ignored (the pod would land where
Kubernetes would never put it). :func:`unsupported_fields` lists such fields of a pod spec:

- required pod (anti-)affinity terms with a ``namespaceSelector`` that selects by labels
  (Namespace labels are not watched), and terms or ``DoNotSchedule`` spread constraints
  that cannot be read (:func:`scheduler.cluster.podaffinity.parse_pod_rules` lists them;
  readable ones are honoured, :mod:`scheduler.framework.topology`);
- required node affinity ``matchFields`` on a key other than ``metadata.name`` (the only field
  Kubernetes defines; the rest of node affinity, ``Gt``/``Lt`` included, is evaluated).

``spec.resourceClaims`` (dynamic resource allocation) is honoured: the claims are judged by the
cache (:mod:`scheduler.cache.dra`) and allocated by the solver (:mod:`scheduler.solver.dra_state`).

Preferences are not listed: ``preferredDuringSchedulingIgnoredDuringExecution`` pod (anti-)
affinity and node affinity, and spread constraints with ``whenUnsatisfiable: ScheduleAnyway``,
are applied where they can be (:func:`scheduler.cluster.podaffinity.parse_pod_preferences`);
one left out never makes a placement wrong. Host ports are honoured
(:mod:`scheduler.cluster.hostports`). PersistentVolumeClaims are judged when the snapshot is
built, against the claims and volumes the cache holds (:mod:`scheduler.cluster.volumes`): an
unbound ``WaitForFirstConsumer`` claim is bound at commit to a pre-created volume usable on the
chosen node.

:func:`scheduling_gates` reads ``spec.schedulingGates``: a gated pod is not scheduled, and not
pending work, until the gates are removed (Kubernetes' semantics; the API server itself marks
it ``PodScheduled=False, reason=SchedulingGated`` and refuses to bind it).

Both accept any input: malformed parts are skipped, never raised on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scheduler.cluster.podaffinity import parse_pod_rules

__all__ = [
    "POD_AFFINITY_REQUIRED",
    "POD_ANTI_AFFINITY_REQUIRED",
    "gated_message",
    "podgroup_unsupported_message",
    "scheduling_gates",
    "unsupported_fields",
    "unsupported_message",
]

_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
POD_AFFINITY_REQUIRED = f"spec.affinity.podAffinity.{_REQUIRED}"
POD_ANTI_AFFINITY_REQUIRED = f"spec.affinity.podAntiAffinity.{_REQUIRED}"
_NODE_TERMS = f"spec.affinity.nodeAffinity.{_REQUIRED}.nodeSelectorTerms"
#: Fields listed by name in a message before "and N more".
_SHOWN = 3

#: (path prefix, what to do) per kind of field, in the order of :func:`unsupported_fields`.
_FIXES: tuple[tuple[str, str], ...] = (
    (
        POD_AFFINITY_REQUIRED,
        "list the namespaces in `namespaces` (or use namespaceSelector: {} for all), and give "
        "every term a topologyKey and a labelSelector with In/NotIn/Exists/DoesNotExist",
    ),
    (
        POD_ANTI_AFFINITY_REQUIRED,
        "list the namespaces in `namespaces` (or use namespaceSelector: {} for all), and give "
        "every term a topologyKey and a labelSelector with In/NotIn/Exists/DoesNotExist",
    ),
    (
        _NODE_TERMS,
        "matchFields may only use metadata.name; select nodes by label with matchExpressions",
    ),
    (
        "spec.topologySpreadConstraints",
        "give the constraint a topologyKey, maxSkew >= 1, minDomains >= 1 and a labelSelector "
        "with In/NotIn/Exists/DoesNotExist",
    ),
)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _node_affinity(affinity: Mapping[str, Any]) -> list[str]:
    """``matchFields`` entries on another field than ``metadata.name``."""
    required = _mapping(_mapping(affinity.get("nodeAffinity")).get(_REQUIRED))
    out = []
    for i, term in enumerate(_list(required.get("nodeSelectorTerms"))):
        for j, e in enumerate(_list(_mapping(term).get("matchFields"))):
            if _mapping(e).get("key") != "metadata.name":
                out.append(f"{_NODE_TERMS}[{i}].matchFields[{j}]")
    return out


def unsupported_fields(
    spec: Any, namespace: str = "", labels: Mapping[str, str] | None = None
) -> tuple[str, ...]:
    """Paths of the placement rules in pod ``spec`` the scheduler does not evaluate yet (see
    the module docstring); empty when it can place the pod as Kubernetes would. ``namespace``
    and ``labels`` are the pod's (pod affinity terms are read relative to them)."""
    spec = _mapping(spec)
    affinity = _mapping(spec.get("affinity"))
    out = list(parse_pod_rules(spec, namespace, labels or {}).unsupported)
    out += _node_affinity(affinity)
    return tuple(out)


def scheduling_gates(spec: Any) -> tuple[str, ...]:
    """The names of ``spec.schedulingGates`` (empty when the pod is not gated)."""
    gates = _list(_mapping(spec).get("schedulingGates"))
    return tuple(str(_mapping(g).get("name") or "(unnamed)") for g in gates)


def _shown(field: str) -> str:
    return field


def _names(items: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b, c and 2 more``."""
    shown = list(items[:_SHOWN])
    rest = len(items) - len(shown)
    if rest:
        return f"{', '.join(shown)} and {rest} more"
    if len(shown) == 1:
        return shown[0]
    return f"{', '.join(shown[:-1])} and {shown[-1]}"


def unsupported_message(pod_key: str, fields: Sequence[str]) -> str:
    """What a pod with the :func:`unsupported_fields` ``fields`` shows while it waits."""
    fixes: list[str] = []
    for field in fields:
        fix = next((f for prefix, f in _FIXES if field.startswith(prefix)), "remove it")
        if fix not in fixes:
            fixes.append(fix)
    verb = "is" if len(fields) == 1 else "are"
    return (
        f"pod {pod_key}: {_names([_shown(f) for f in fields])} {verb} not supported yet; "
        f"the pod waits ({'; '.join(fixes)})"
    )


def podgroup_unsupported_message(gang_key: str, fields: Sequence[str]) -> str:
    """What a gang whose PodGroup uses fields that are not implemented yet shows."""
    verb = "is" if len(fields) == 1 else "are"
    return (
        f"PodGroup {gang_key}: {_names(list(fields))} {verb} not supported yet; the gang waits "
        "(remove it from the PodGroup; a preferredTopologyLevel is accepted and not applied yet)"
    )


def gated_message(gated: Sequence[tuple[str, tuple[str, ...]]]) -> str:
    """What a gang waiting for its gated pods shows: ``gated`` holds (pod key, gate names)."""
    gates = list(dict.fromkeys(g for _, names in gated for g in names))
    if len(gated) == 1:
        return (
            f"pod {gated[0][0]} has scheduling gates [{', '.join(gates)}]; "
            "it is scheduled once they are removed"
        )
    return (
        f"pods {_names([k for k, _ in gated])} have scheduling gates [{', '.join(gates)}]; "
        "they are scheduled once the gates are removed"
    )
