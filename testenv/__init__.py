"""A real Kubernetes control plane for the tests: etcd, kube-apiserver, kube-controller-manager
and kwok built from their Go modules (see testenv/build.sh) and run on loopback ports."""

from testenv.binaries import BinariesMissingError, find_bin_dir, repo_root
from testenv.controlplane import ControlPlane, ControlPlaneError
from testenv.nodes import delete_nodes, make_gpu_nodes

__all__ = [
    "BinariesMissingError",
    "ControlPlane",
    "ControlPlaneError",
    "delete_nodes",
    "find_bin_dir",
    "make_gpu_nodes",
    "repo_root",
]
