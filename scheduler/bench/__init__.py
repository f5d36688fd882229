"""Benchmark scripts printing one JSON line each: ``python -m scheduler.bench solver|openb``.

- :mod:`.solver` - the gang placement solver on synthetic clusters
- :mod:`.openb` - trace replay on the OpenB traces (fragmentation study)
- :mod:`.synthetic` - synthetic clusters and scenario builders
"""

__all__: list[str] = []
