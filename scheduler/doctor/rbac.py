"""What the scheduler's ServiceAccount must be allowed to do, written once.

These are the rules of the shipped ClusterRole and leader-election Role
(``manifests/20-rbac.yaml``, identical to the chart's ``templates/rbac.yaml``; a unit test
keeps them equal). ``kai-scheduler doctor`` asks the API server about every
(verb, group, resource) they grant, for the ServiceAccount the scheduler's Deployment runs as.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "CLUSTER_RULES",
    "LEADER_ELECTION_RULES",
    "Permission",
    "Rule",
    "permissions",
]


@dataclass(frozen=True, slots=True)
class Rule:
    """One PolicyRule: every verb on every resource of every group listed."""

    groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]

    def as_k8s(self) -> dict[str, Any]:
        """The rule as it is written in a Role (``apiGroups``, ``resources``, ``verbs``)."""
        return {
            "apiGroups": list(self.groups),
            "resources": list(self.resources),
            "verbs": list(self.verbs),
        }


@dataclass(frozen=True, slots=True, order=True)
class Permission:
    """One (verb, group, resource[/subresource]) the scheduler needs."""

    verb: str
    group: str
    #: ``plural`` or ``plural/subresource``.
    resource: str

    def describe(self) -> str:
        """``create pods/binding``, ``watch queues.scheduling.run.ai`` (as kubectl spells it)."""
        plural, _, sub = self.resource.partition("/")
        name = f"{plural}.{self.group}" if self.group else plural
        return f"{self.verb} {name}{'/' + sub if sub else ''}"

    def attributes(self, namespace: str | None) -> dict[str, str]:
        """``resourceAttributes`` of an access review (no namespace: every namespace)."""
        plural, _, sub = self.resource.partition("/")
        out = {"verb": self.verb, "group": self.group, "resource": plural}
        if sub:
            out["subresource"] = sub
        if namespace:
            out["namespace"] = namespace
        return out


#: The scheduler's ClusterRole (the comments in manifests/20-rbac.yaml say why each is needed).
CLUSTER_RULES: tuple[Rule, ...] = (
    Rule(("",), ("pods",), ("get", "list", "watch", "delete")),
    Rule(("",), ("pods/binding", "pods/eviction"), ("create",)),
    Rule(("",), ("pods/status",), ("patch", "update")),
    Rule(("",), ("nodes", "namespaces"), ("get", "list", "watch")),
    Rule(("", "events.k8s.io"), ("events",), ("create", "patch", "update")),
    Rule(("scheduling.run.ai",), ("queues", "podgroups"), ("get", "list", "watch")),
    Rule(("scheduling.run.ai",), ("queues/status", "podgroups/status"), ("get", "patch", "update")),
    Rule(("scheduling.volcano.sh",), ("queues", "podgroups"), ("get", "list", "watch")),
    Rule(("scheduling.volcano.sh",), ("queues/status", "podgroups/status"), ("patch", "update")),
    Rule(("scheduling.volcano.sh",), ("podgroups",), ("patch",)),
    Rule(("scheduling.volcano.sh",), ("queues",), ("create",)),
    Rule(("scheduling.k8s.io",), ("priorityclasses",), ("get", "list", "watch")),
    Rule(("policy",), ("poddisruptionbudgets",), ("list", "watch")),
    Rule(("",), ("persistentvolumeclaims", "persistentvolumes"), ("get", "list", "watch")),
    Rule(("",), ("persistentvolumes",), ("patch",)),
    Rule(("storage.k8s.io",), ("storageclasses",), ("get", "list", "watch")),
    Rule(
        ("resource.k8s.io",),
        ("deviceclasses", "resourceslices", "resourceclaims"),
        ("get", "list", "watch"),
    ),
    Rule(("resource.k8s.io",), ("resourceclaims",), ("create", "update", "delete")),
    Rule(("resource.k8s.io",), ("resourceclaims/status",), ("update", "patch")),
    Rule(("resource.k8s.io",), ("resourceclaims/binding",), ("update",)),
    # /debug/snapshot checks its caller's token and rights (TokenReview, SubjectAccessReview).
    Rule(("authentication.k8s.io",), ("tokenreviews",), ("create",)),
    Rule(("authorization.k8s.io",), ("subjectaccessreviews",), ("create",)),
    # GPU sharing: each sharing pod's device ConfigMap, written (never read) at bind.
    Rule(("",), ("configmaps",), ("create", "update")),
)

#: The Role in the scheduler's namespace: its leader-election Lease.
LEADER_ELECTION_RULES: tuple[Rule, ...] = (
    Rule(("coordination.k8s.io",), ("leases",), ("get", "create", "update", "patch")),
)


def permissions(rules: tuple[Rule, ...]) -> list[Permission]:
    """Every single permission the rules grant, sorted, without duplicates."""
    return sorted(
        {Permission(v, g, r) for rule in rules for g in rule.groups for r in rule.resources
         for v in rule.verbs}
    )  # fmt: skip
