"""Reason codes of pods held back by their ResourceClaims (dynamic resource allocation).

Kept apart from :mod:`scheduler.cluster.dra` so the fairness and explain layers can name them
without importing the CEL library.
"""

from __future__ import annotations

__all__ = ["CLAIM_NOT_READY", "DEVICES_UNAVAILABLE"]

#: A claim of the pod cannot be used yet: not created, missing, unparsable, being deleted,
#: made for another pod, or the DRA API cannot be read (the message says which and the fix).
CLAIM_NOT_READY = "ResourceClaimNotReady"
#: The pod's claims cannot be allocated on any node that could take the pod: too few
#: matching devices are free (or none match the class and selectors).
DEVICES_UNAVAILABLE = "DevicesUnavailable"
