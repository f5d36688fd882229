#!/usr/bin/env bash
# Build the command-line tools the monitoring tests lint with (no control plane involved):
#
#   testenv/build_tools.sh            # all of them (today: promtool)
#   testenv/build_tools.sh promtool   # github.com/prometheus/prometheus/cmd/promtool
#
# promtool checks and unit-tests the chart's alert rules (tests/e2e/test_monitoring_tools.py).
# It is built from the Prometheus Go module at the exact version pinned in testenv/versions.env
# (PROMETHEUS_VERSION) and by testenv/gobuild/promtool/go.mod and go.sum (the Go module proxy
# refuses version lists, so it is asked for that exact version), into
# .cache/testenv-bin/tools/promtool-<key>/ (key: hash of the pin, the module files and these
# build scripts), and .cache/testenv-bin/tools/promtool points at it. Its key is its own: a
# new Prometheus pin never rebuilds the Kubernetes binaries, nor they it.
#
# testenv/build.sh runs it last (so scripts/setup.sh and CI build it once per machine). With
# the binary there it only checks and returns at once. Measured cold on 2 cores (fresh Go
# build cache, modules downloaded): 7 min 22 s, 588 s CPU, 3.2 GB peak memory (testenv/README.md).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
log_tag=build-tools
# shellcheck source=build_common.sh
source "$here/build_common.sh"

[[ $# -gt 0 ]] || set -- promtool
require_go
use_cache "$root/.cache/testenv-bin/tools"

build_promtool() {
    local mod=github.com/prometheus/prometheus key dest
    check_pin promtool "$mod" "$PROMETHEUS_VERSION"
    key="$(cache_key "PROMETHEUS_VERSION=$PROMETHEUS_VERSION" promtool \
        "${BASH_SOURCE[0]}" "$here/build_common.sh")"
    dest="$cache/promtool-$key"
    if [[ -x "$dest/promtool" ]]; then
        link promtool "$key"
        log "promtool ($mod $PROMETHEUS_VERSION) present in .cache/testenv-bin/tools/promtool-$key"
        return
    fi
    new_staging promtool
    # `promtool --version` then names the module version it was built from.
    timed_build "promtool ($mod $PROMETHEUS_VERSION)" promtool \
        -ldflags "-X github.com/prometheus/common/version.Version=$PROMETHEUS_VERSION" \
        -o "$staging/promtool" "$mod/cmd/promtool"
    "$staging/promtool" --version >/dev/null || die "the built promtool does not run"
    finish promtool "$key" go+rx  # only the folder: mktemp made it 700
}

for tool in "$@"; do
    case "$tool" in
        promtool) build_promtool ;;
        *) die "unknown tool $tool (use promtool)" ;;
    esac
done
