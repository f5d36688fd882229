"""Holding a GPU share back rather than letting it strand the rest of an idle device.

A pod taking s thousandths of one device, placed alone on an idle device, leaves r = 1000 - s
there that only pods of at most r can use. When almost nothing in the workload fits r (the
part of the scorer's target mix that fits is below :data:`FIT_BELOW`), that remainder is
lost for as long as the pod runs: the pod costs its device r / 1000 more than it uses.

While much of the model's capacity is free that is worth paying: the idle device may never
be needed. Once less of it is free than that fraction (free / capacity < r / 1000), an idle
device is worth more to the pods still to come (whole-GPU pods, shares that pair up) than
to this share, so the share waits: for a device it fills without stranding (one already
partly used, where its remainder is small), or for capacity to free up. It is never
silently held: its gang's outcome says ``HeldToAvoidStranding`` with the numbers.

It is a choice to leave a pod pending while a device is idle, so it is opt-in
(``placement.holdStrandingShares``, with ``placement.scoring: fragmentation``, whose mix
says what fits), and bounded: a pod is held at most ``placement.holdStrandingMaxWait``
after its creation (15 minutes by default), so a busy cluster cannot keep it waiting for
good. The threshold r / 1000 was chosen on the openb trace with 60 % shares
(a sweep of fixed free fractions from 5 % to 70 % for 810-thousandth shares: 20 % was best
at both 100 % and 130 % arrived) and checked on the default trace and on GPU-model pins;
see the README's openb section.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from scheduler.cluster.node import GPU_MILLI

if TYPE_CHECKING:
    from scheduler.plugins.fragmentation import MixArrays

__all__ = ["FIT_BELOW", "HELD_CODE", "fitting_share", "hold_reason"]

#: A remainder is stranded when less than this part of the workload (the mix's weights,
#: GPU task types allowed on the model) fits it.
FIT_BELOW = 0.05
#: The outcome code of a gang held back by this rule.
HELD_CODE = "HeldToAvoidStranding"


def fitting_share(mix: MixArrays, model: int, room: int) -> float:
    """Part of the mix's GPU task types allowed on model index ``model`` (-1: unknown, any
    type counts) that one device with ``room`` thousandths free could hold. 1 when the mix
    knows no GPU task (nothing is called stranded without evidence)."""
    gpu = mix.gpus > 0
    if 0 <= model < mix.allowed.shape[1]:
        gpu &= mix.allowed[:, model]
    total = float(mix.weight[gpu].sum())
    if total <= 0:
        return 1.0
    fits = gpu & (mix.gpus == 1) & (mix.milli <= room)
    return float(np.sum(mix.weight[fits])) / total


def hold_reason(
    count: int,
    milli: int,
    before: int,
    fit: float,
    room: tuple[int, int],
    model: str | None,
) -> str | None:
    """Why a pod taking ``milli`` thousandths of ``count`` device(s), one of which had
    ``before`` free, should wait (None: place it). ``fit``: :func:`fitting_share` of the
    remainder; ``room``: (free, total) GPU thousandths of the model's placeable nodes."""
    if count != 1 or not 0 < milli < GPU_MILLI or before != GPU_MILLI:
        return None
    left = GPU_MILLI - milli
    free, total = room
    if fit >= FIT_BELOW or total <= 0 or free * GPU_MILLI >= left * total:
        return None
    where = f"{model} " if model else ""
    return (
        f"held back: it would leave {left} thousandths of an idle {where}device that "
        f"{fit:.1%} of the workload fits, while only {free / total:.1%} of the {where}GPU "
        f"capacity is free (below the {left / GPU_MILLI:.1%} it would strand); it waits for "
        "a partly used device or for capacity to free up (placement.holdStrandingShares)"
    )
