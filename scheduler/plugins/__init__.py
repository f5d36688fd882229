"""Pluggable pieces, one concern per module.

- :mod:`.packing` - binpack/spread placement quality and the default node scorer
- :mod:`.fragmentation` - fragmentation-aware (FGD-style) node scorer
"""

__all__: list[str] = []
