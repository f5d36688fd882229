#!/usr/bin/env bash
# The long chaos run: builds what it needs (scripts/setup.sh, idempotent), starts its own
# control plane, streams gangs under seeded faults for --minutes, prints a JSON summary and
# exits 1 if the invariant checker recorded a violation. All arguments go to
# `python -m tests.chaos` (--minutes 10 --seed S --nodes 4 --json FILE ...).
#   scripts/chaos.sh --minutes 10 --seed 42
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh >&2
exec .venv/bin/python -m tests.chaos "$@"
