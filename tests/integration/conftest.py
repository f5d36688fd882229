"""Fixtures shared by the integration tests (a real API server; nothing here fakes it)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio.client import ApiClient

from scheduler.k8s.client import ClientSettings, make_api_client
from testenv.controlplane import ControlPlane
from tests.integration.support import REPO, install_crds


@pytest.fixture
async def api(control_plane: ControlPlane) -> AsyncIterator[ApiClient]:
    """An admin API client, with our CRDs and the default queues installed."""
    install_crds(control_plane)
    control_plane.kubectl("apply", "-f", str(REPO / "manifests" / "defaults"))
    client = await make_api_client(ClientSettings(kube_config=str(control_plane.kubeconfig)))
    try:
        yield client
    finally:
        await client.close()
