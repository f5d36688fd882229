"""``kai-scheduler explain``: one pod or PodGroup, what the last cycle decided and why.

- :mod:`scheduler.inspect.views`: the explanation (frozen dataclasses);
- :mod:`scheduler.inspect.model`: builds it from API objects (pure, unit-tested);
- :mod:`scheduler.inspect.events`: Events newest first, repeats merged (pure);
- :mod:`scheduler.inspect.reads`: reads those objects (GET/LIST only);
- :mod:`scheduler.inspect.render`: prints it (rich, plain text or JSON);
- :mod:`scheduler.inspect.cli`: the subcommand.
"""

from __future__ import annotations

from scheduler.inspect.model import explain_pod, explain_podgroup
from scheduler.inspect.views import Explanation

__all__ = ["Explanation", "explain_pod", "explain_podgroup"]
