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
root="$(cd "$here/.." && pwd)"
gobuild="$here/gobuild"
# shellcheck source=versions.env
source "$here/versions.env"

log() { printf '[build-peers %s] %s\n' "$(date '+%H:%M:%S')" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ $# -gt 0 ]] || die "usage: $0 kube-scheduler|kai ..."
command -v go >/dev/null 2>&1 || die "the Go toolchain is not on PATH; install Go >= 1.26"
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod -buildvcs=false"

cache="$root/.cache/peer-bin"
mkdir -p "$cache"
tmpdirs=()
cleanup() { [[ ${#tmpdirs[@]} -eq 0 ]] || rm -rf "${tmpdirs[@]}"; }
trap cleanup EXIT
new_staging() { # name -> sets $staging to a fresh folder removed on exit unless moved away
    staging="$(mktemp -d "$cache/.build-$1.XXXXXX")"
    tmpdirs+=("$staging")
}

check_pin() { # module_dir module version
    local dir="$1" mod="$2" ver="$3"
    grep -Eq "^[[:space:]]*(require[[:space:]]+)?${mod//./\\.}[[:space:]]+${ver//./\\.}([[:space:]]|$)" "$gobuild/$dir/go.mod" \
        || die "testenv/gobuild/$dir/go.mod does not require $mod $ver (versions.env); update it with: cd testenv/gobuild/$dir && go get $mod@$ver && go mod tidy"
}

peer_key() { # pin module_dir -> 16 hex chars
    { printf '%s\n' "$1"; cat "$gobuild/$2/go.mod" "$gobuild/$2/go.sum"; } | sha256sum | cut -c1-16
}

link_peer() { # peer key
    ln -sfn "$1-$2" "$cache/$1.tmp" && mv -T "$cache/$1.tmp" "$cache/$1"
}

progress() { # count the package lines of `go build -v`; pass anything else (errors) through
    local n=0 line
    while IFS= read -r line; do
        if [[ "$line" =~ ^[A-Za-z0-9._~/+-]+$ ]]; then
            n=$((n + 1))
            (( n % 100 )) || log "  ... $n packages compiled (now $line)"
        else
            printf '%s\n' "$line" >&2
        fi
    done
    log "  $n packages compiled"
}

timed_build() { # label module_dir go-build-args...
    local label="$1" dir="$2"; shift 2
    local start
    start=$(date +%s)
    log "go build $label ... (a cold build takes minutes on 2 cores; a line per 100 packages)"
    (cd "$gobuild/$dir" && go build -v "$@" 2>&1) | progress \
        || die "go build $label failed (module testenv/gobuild/$dir); see the compiler output above"
    log "built $label in $(($(date +%s) - start))s"
}

build_kube_scheduler() {
    check_pin kubernetes k8s.io/kubernetes "$KUBERNETES_VERSION"
    local key dest
    key="$(peer_key "KUBERNETES_VERSION=$KUBERNETES_VERSION" kubernetes)"
    dest="$cache/kube-scheduler-$key"
    if [[ -x "$dest/kube-scheduler" ]]; then
        link_peer kube-scheduler "$key"
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
    chmod go+rx "$staging"  # mktemp made it 700
    rm -rf "$dest" && mv "$staging" "$dest"
    link_peer kube-scheduler "$key"
    log "done: .cache/peer-bin/kube-scheduler -> kube-scheduler-$key"
}

build_kai() {
    local mod=github.com/NVIDIA/KAI-scheduler
    check_pin kai "$mod" "$KAI_VERSION"
    local key dest
    key="$(peer_key "KAI_VERSION=$KAI_VERSION" kai)"
    dest="$cache/kai-$key"
    if [[ -x "$dest/scheduler" && -x "$dest/binder" && -x "$dest/podgrouper" && -d "$dest/crds" ]]; then
        link_peer kai "$key"
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
    chmod -R u+w,go+rX "$staging"  # files copied from the read-only module cache; mktemp's 700
    rm -rf "$dest" && mv "$staging" "$dest"
    link_peer kai "$key"
    log "done: .cache/peer-bin/kai -> kai-$key"
}

for peer in "$@"; do
    case "$peer" in
        kube-scheduler) build_kube_scheduler ;;
        kai) build_kai ;;
        *) die "unknown peer $peer (use kube-scheduler or kai)" ;;
    esac
done
