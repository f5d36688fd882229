"""``python -m scheduler.simulate SCENARIO.yaml``: the simulate subcommand on its own."""

from __future__ import annotations

import argparse
import sys

from scheduler.simulate.cli import configure_parser, run

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` like ``kai-scheduler simulate`` and run it."""
    parser = argparse.ArgumentParser(
        prog="kai-scheduler simulate",
        description="Simulate scheduling cycles on an in-memory cluster.",
        conflict_handler="resolve",
    )
    configure_parser(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
