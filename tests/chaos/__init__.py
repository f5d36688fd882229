"""Chaos testing: a gang stream under seeded faults, judged by an independent invariant checker.

- :mod:`tests.chaos.invariants` - the checker (pure: API dicts in, violations out);
  :mod:`tests.chaos.podview` reads pods and nodes for it without the scheduler's code.
- :mod:`tests.chaos.observer` - feeds it from its own list + watch of the API server.
- :mod:`tests.chaos.workload` - the stream of gangs; :mod:`tests.chaos.plan` - the seeded
  fault schedule; :mod:`tests.chaos.run` - one run, used by ``tests/e2e/test_chaos.py`` and by
  ``python -m tests.chaos`` (the long run). The injectors live in :mod:`testenv.chaos`.

Nothing here imports ``scheduler``: the scheduler runs as a separate process and is judged
only by what the API server shows.
"""
