"""``kai-scheduler doctor``: readiness checks of an installed scheduler.

- :mod:`.result` - a check's verdict (ok / warn / fail, message, fix) and the exit code;
- :mod:`.install` - what the scheduler's Deployment and ConfigMap say about the install;
- :mod:`.rbac` - the permissions the scheduler needs, written once;
- :mod:`.judge_install`, :mod:`.judge_cluster` - pure verdicts from API objects;
- :mod:`.checks` - the checks against a live API server, one coroutine each;
- :mod:`.report` - rich table, plain text or JSON;
- :mod:`.cli` - the subcommand.
"""

from scheduler.doctor.result import CheckResult, Status, exit_code

__all__ = ["CheckResult", "Status", "exit_code"]
