"""The pod grouper: one PodGroup per workload, so the scheduler sees whole workloads.

``kai-scheduler podgrouper`` is its own process (kopf), separate from ``run``: for every pod of
our scheduler that names no PodGroup, it follows ``ownerReferences`` to the workload (the top
owner), creates or updates the workload's PodGroup - owned by it, so garbage collection
removes both - and annotates the pod with ``pod-group-name``. The scheduler reads those
PodGroups like any other and never follows owner references itself. Without the grouper,
``run`` keeps scheduling each such pod as an implicit gang of one.

Modules, in the order data flows:

- :mod:`~scheduler.podgrouper.keys` - the labels and annotations read and written.
- :mod:`~scheduler.podgrouper.owners` - a pod and its owners as plain data.
- :mod:`~scheduler.podgrouper.groupers` - one pure rule per workload kind (KAI's rules).
- :mod:`~scheduler.podgrouper.spec` - the desired PodGroup and who owns which field (pure).
- :mod:`~scheduler.podgrouper.api` - every API request, with the owner cache.
- :mod:`~scheduler.podgrouper.controller` - reconcile a pod; retries; Events; edits reverted.
- :mod:`~scheduler.podgrouper.operator` - kopf handlers, login, probes: the process.
- :mod:`~scheduler.podgrouper.cli` - the ``podgrouper`` subcommand's flags.

See docs/podgrouper.md for the user's view.
"""

__all__: list[str] = []
