#!/usr/bin/env bash
# Idempotent setup: Python venv with the project (+dev extras), the few Debian packages the
# test control plane needs, and the control plane's binaries (testenv/build.sh). The first run
# on a machine builds Kubernetes from source: expect 10-30 minutes on 2 cores; later runs
# take seconds.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '[setup %s] %s\n' "$(date '+%H:%M:%S')" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Debian packages, installed only when missing (apt-get update only then).
need_pkgs=()
command -v openssl >/dev/null 2>&1 || need_pkgs+=(openssl)
command -v setpriv >/dev/null 2>&1 || need_pkgs+=(util-linux)
if [[ ${#need_pkgs[@]} -gt 0 && "${1:-}" != "--python-only" ]]; then
    command -v apt-get >/dev/null 2>&1 || die "missing ${need_pkgs[*]} and no apt-get to install them"
    log "installing Debian packages: ${need_pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

# Python 3.11+ venv.
if [[ ! -x .venv/bin/python ]]; then
    py=""
    for cand in python3.13 python3.12 python3.11 python3; do
        if command -v "$cand" >/dev/null 2>&1 \
            && "$cand" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
            py="$cand"; break
        fi
    done
    [[ -n "$py" ]] || die "Python >= 3.11 not found"
    log "creating .venv with $py"
    "$py" -m venv .venv
fi
# Reinstall only when pyproject.toml changed since the last successful install.
stamp=.venv/.kai-setup-stamp
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [[ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]]; then
    log "pip install -e '.[dev]'"
    .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
    echo "$want" > "$stamp"
else
    log "python dependencies up to date"
fi

# --python-only: what the demo needs (no cluster, so no Go builds or Debian packages).
if [[ "${1:-}" == "--python-only" ]]; then
    log "setup complete (python only)"
    exit 0
fi

command -v go >/dev/null 2>&1 || die "the Go toolchain (>= 1.26) is required to build the test control plane"
testenv/build.sh
log "setup complete"
