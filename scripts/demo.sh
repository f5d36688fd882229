#!/usr/bin/env bash
# The README's first command: set up Python (no cluster, no Go build needed) and run the
# scheduler's real cycle on a simulated cluster (examples/simulate/quickstart.yaml).
# Extra arguments go to `kai-scheduler simulate` (e.g. --json, --out out/).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh --python-only
exec .venv/bin/kai-scheduler simulate examples/simulate/quickstart.yaml "$@"
