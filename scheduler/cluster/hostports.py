"""Host ports as node resources: a node has one of each host port, a pod asks for its own.

A pod whose container binds a host port (``ports[].hostPort``; with ``hostNetwork: true`` the
API server sets it to the ``containerPort``) can run only on a node where no other pod holds
the same protocol and port. Counted as a resource - each ``(protocol, port)`` in use in the
snapshot gets allocatable 1 on every node, and each pod asks for 1 of each of its own - the
rule is kept by every stage that checks resources (greedy, CP-SAT, validator, explainer)
without a line of its own there.

Conservative on ``hostIP``: two pods on the same protocol and port conflict whatever their
``hostIP`` (Kubernetes lets ``10.0.0.1:80`` and ``10.0.0.2:80`` share a node; this never
places them together). Ports of init containers count too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from scheduler.cluster.node import Node

__all__ = ["HOST_PORT_PREFIX", "host_port_name", "host_port_requests", "with_host_ports"]

#: Resource name prefix: ``kai.scheduler/host-port-tcp-8080``.
HOST_PORT_PREFIX = "kai.scheduler/host-port-"


def host_port_requests(spec: Mapping[str, Any]) -> dict[str, int]:
    """One unit per distinct host port (protocol and number) the pod spec binds."""
    out: dict[str, int] = {}
    for group in ("containers", "initContainers"):
        containers = spec.get(group)
        for container in containers if isinstance(containers, list) else []:
            ports = container.get("ports") if isinstance(container, Mapping) else None
            for port in ports if isinstance(ports, list) else []:
                if not isinstance(port, Mapping):
                    continue
                number = port.get("hostPort")
                if isinstance(number, int) and not isinstance(number, bool) and number > 0:
                    protocol = str(port.get("protocol") or "TCP").lower()
                    out[f"{HOST_PORT_PREFIX}{protocol}-{number}"] = 1
    return out


def host_port_name(resource: str) -> str | None:
    """``TCP/8080`` for a host port resource name, None for any other resource."""
    if not resource.startswith(HOST_PORT_PREFIX):
        return None
    protocol, _, number = resource[len(HOST_PORT_PREFIX) :].rpartition("-")
    return f"{protocol.upper()}/{number}"


def with_host_ports(nodes: Iterable[Node], ports: Iterable[str]) -> tuple[Node, ...]:
    """``nodes``, each with one of every host port resource in ``ports`` (those in use)."""
    nodes = tuple(nodes)
    extra = dict.fromkeys(sorted(set(ports)), 1)
    if not extra:
        return nodes
    return tuple(dataclasses.replace(n, allocatable=n.allocatable + extra) for n in nodes)
