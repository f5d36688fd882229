"""``kai-scheduler simulate``: the live scheduling cycle on an in-memory cluster.

- :mod:`.scenario` - scenario YAML (settings, nodes, Queue objects) -> a validated Scenario
- :mod:`.workload` - the scenario's jobs and PodGroups -> pods and gangs with arrival times
- :mod:`.running` - jobs already running at the start: fit checks and GPU device grants
- :mod:`.fields` - field readers whose errors name the field path (:class:`ScenarioError`)
- :mod:`.backend` - :class:`SimulatedCluster`, the in-memory :class:`scheduler.cycle.Backend`
  (binds, evictions with grace periods, job restarts, nominations)
- :mod:`.records` - what the backend remembers per pod, gang, eviction and nomination
- :mod:`.engine` - the simulated-time loop (arrivals, a cycle every period, completions)
- :mod:`.evictions` - evictions grouped per gang, totals by action and queue
- :mod:`.report` / :mod:`.plots` - tables, JSON summary and PNG plots of a run
- :mod:`.cli` - the ``simulate`` subcommand (scenario mode; trace mode in :mod:`.replay`)

Submodules are imported on use: the scenario loader must not pull in the solver or matplotlib.
"""

__all__: list[str] = []
