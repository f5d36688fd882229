"""Dispatch ``python -m scheduler.bench <benchmark> ...``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: benchmark name -> module providing ``add_parser(subparsers)`` and ``run(args) -> int``.
#: Modules are imported lazily so one benchmark's dependencies never break another.
BENCHMARKS = {
    "solver": "scheduler.bench.solver",
    "dra": "scheduler.bench.dra",
    "openb": "scheduler.bench.openb",
    "e2e": "scheduler.bench.e2e",
    "cache": "scheduler.bench.cache",
    "takeback-diff": "scheduler.bench.takeback_diff",
    "podgrouper-diff": "scheduler.bench.podgrouper_diff",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and run the chosen benchmark."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m scheduler.bench")
    subparsers = parser.add_subparsers(dest="bench", required=True, metavar="|".join(BENCHMARKS))
    wanted = argv[0] if argv and argv[0] in BENCHMARKS else None
    for name, module_name in BENCHMARKS.items():
        if wanted is not None and name != wanted:
            subparsers.add_parser(name)
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            if name == wanted:
                parser.error(f"benchmark {name!r} is not available: {e}")
            subparsers.add_parser(name, help=f"(unavailable: {e})")
            continue
        module.add_parser(subparsers)
    args = parser.parse_args(argv)
    module = importlib.import_module(BENCHMARKS[args.bench])
    return int(module.run(args))


if __name__ == "__main__":
    raise SystemExit(main())
