"""KAI Scheduler: a Kubernetes scheduler for AI/ML workloads on GPU clusters.

The package follows the data flow: ``k8s`` (watch) -> ``cache`` (snapshot) -> ``solver``
(placement) -> ``commit`` (bind/evict/status). ``cluster`` holds the pure domain types that
every stage shares.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
