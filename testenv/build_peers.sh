#!/usr/bin/env bash
# Build the peer schedulers that `python -m scheduler.bench e2e` compares ours with, on demand
# (never in CI's setup: KAI alone is a multi-minute cold build on 2 cores).
#
#   testenv/build_peers.sh kube-scheduler   # k8s.io/kubernetes/cmd/kube-scheduler, pinned version
#   testenv/build_peers.sh kai              # NVIDIA KAI-Scheduler: scheduler, binder, podgrouper
#   testenv/build_peers.sh kube-scheduler kai
#
# Each peer lands in .cache/peer-bin/<peer>-<key>/ (key: hash of its pin in versions.env and its
# testenv/gobuild module files) and .cache/peer-bin/<peer> points at it; with the binaries there
# the script only checks and returns in about a second. KAI's CRDs and RBAC (deployments/ in its
# module) are copied next to its binaries, so the bench applies exactly the version it runs.
# Versions are pinned in testenv/versions.env; the Go module proxy refuses version lists, so
# every module is asked for at an exact version.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
log_tag=build-peers
# shellcheck source=build_common.sh
source "$here/build_common.sh"

[[ $# -gt 0 ]] || die "usage: $0 kube-scheduler|kai ..."
require_go
use_cache "$root/.cache/peer-bin"

build_kube_scheduler() {
    check_pin kubernetes k8s.io/kubernetes "$KUBERNETES_VERSION"
    local key dest
    key="$(cache_key "KUBERNETES_VERSION=$KUBERNETES_VERSION" kubernetes)"
    dest="$cache/kube-scheduler-$key"
    if [[ -x "$dest/kube-scheduler" ]]; then
        link kube-scheduler "$key"
        log "kube-scheduler $KUBERNETES_VERSION present in .cache/peer-bin/kube-scheduler-$key"
        return
    fi
    # The test binaries may already hold it (testenv/build.sh builds it too when listed there).
    local tb="$root/.cache/testenv-bin/current/kube-scheduler"
    new_staging kube-scheduler
    if [[ -x "$tb" ]] && "$tb" --version 2>/dev/null | grep -q "$KUBERNETES_VERSION\$"; then
        cp "$tb" "$staging/kube-scheduler"
        log "kube-scheduler $KUBERNETES_VERSION copied from .cache/testenv-bin/current"
    else
        local vpkg=k8s.io/component-base/version minor="${KUBERNETES_VERSION#v1.}"
        minor="${minor%%.*}"
        timed_build "kube-scheduler ($KUBERNETES_VERSION)" kubernetes \
            -ldflags "-X $vpkg.gitVersion=$KUBERNETES_VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean" \
            -o "$staging/kube-scheduler" k8s.io/kubernetes/cmd/kube-scheduler
    fi
    finish kube-scheduler "$key" go+rx  # only the folder: mktemp made it 700
}

build_kai() {
    local mod=github.com/NVIDIA/KAI-scheduler
    check_pin kai "$mod" "$KAI_VERSION"
    local key dest
    key="$(cache_key "KAI_VERSION=$KAI_VERSION" kai)"
    dest="$cache/kai-$key"
    if [[ -x "$dest/scheduler" && -x "$dest/binder" && -x "$dest/podgrouper" && -d "$dest/crds" ]]; then
        link kai "$key"
        log "KAI-Scheduler $KAI_VERSION present in .cache/peer-bin/kai-$key"
        return
    fi
    new_staging kai
    log "downloading $mod@$KAI_VERSION and its dependencies (exact versions from testenv/gobuild/kai/go.sum)"
    (cd "$gobuild/kai" && go mod download "$mod") || die "go mod download $mod@$KAI_VERSION failed"
    local src
    src="$(cd "$gobuild/kai" && go list -m -f '{{.Dir}}' "$mod")"
    [[ -d "$src/deployments/kai-scheduler/crds" ]] || die "no deployments/kai-scheduler/crds in $src"
    timed_build "KAI-Scheduler scheduler binder podgrouper ($KAI_VERSION)" kai \
        -ldflags "-X $mod/pkg/scheduler/version.gitVersion=$KAI_VERSION" -o "$staging/" \
        "$mod/cmd/scheduler" "$mod/cmd/binder" "$mod/cmd/podgrouper"
    mkdir -p "$staging/crds" "$staging/rbac"
    cp "$src"/deployments/kai-scheduler/crds/*.yaml "$staging/crds/"
    cp "$src"/deployments/kai-scheduler/templates/rbac/{scheduler,binder,podgrouper}.yaml "$staging/rbac/"
    finish kai "$key"
}

for peer in "$@"; do
    case "$peer" in
        kube-scheduler) build_kube_scheduler ;;
        kai) build_kai ;;
        *) die "unknown peer $peer (use kube-scheduler or kai)" ;;
    esac
done
