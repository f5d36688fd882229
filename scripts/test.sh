#!/usr/bin/env bash
# The project's test command: setup (idempotent), then pytest (whole suite by default; any
# arguments go to pytest), then a check that no control-plane process outlived pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh

# Every process the control plane starts inherits this marker; finding it afterwards means
# a leak (it is unique per test.sh run, so parallel runs elsewhere do not count).
export KAI_TESTENV_OWNER="test-sh-$$-$(date +%s%N)"

status=0
.venv/bin/python -m pytest "$@" || status=$?
if [[ $status -eq 5 ]]; then
    echo "test.sh: pytest collected no tests (exit 5): treating as failure" >&2
fi

# Find control-plane components (they carry KAI_TESTENV_RUN) that belong to this run.
leftover="$(.venv/bin/python - "$KAI_TESTENV_OWNER" <<'PY'
import os, sys
owner = f"KAI_TESTENV_OWNER={sys.argv[1]}".encode()
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        continue
    if owner in env and any(e.startswith(b"KAI_TESTENV_RUN=") for e in env):
        print(pid, cmd)
PY
)"
if [[ -n "$leftover" ]]; then
    echo "test.sh: testenv processes left running after pytest (killing them):" >&2
    echo "$leftover" >&2
    while read -r pid _; do kill -KILL "$pid" 2>/dev/null || true; done <<<"$leftover"
    [[ $status -ne 0 ]] || status=1
fi
exit "$status"
