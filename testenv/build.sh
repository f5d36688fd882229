#!/usr/bin/env bash
# Build the test control plane's binaries (kube-apiserver, kube-controller-manager, kubectl,
# etcd, kwok, helm; and kube-scheduler, a peer for the e2e bench's CI run) from their Go modules
# into .cache/testenv-bin/<key>/, where <key> hashes testenv/versions.env and the
# testenv/gobuild module files. Skips work when every binary is
# already there. A cold build on 2 cores took ~8 minutes plus module downloads (kubernetes
# dominates; see testenv/README.md); then testenv/build_controllers.sh (Volcano's job controller
# and the LeaderWorkerSet controller for the e2e tests, ~7 more minutes cold; own cache keys);
# Go's module and build caches make later rebuilds much faster.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
gobuild="$here/gobuild"
# shellcheck source=versions.env
source "$here/versions.env"

log() { printf '[testenv-build %s] %s\n' "$(date '+%H:%M:%S')" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

binaries=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok helm)

command -v go >/dev/null 2>&1 || die "the Go toolchain is not on PATH; install Go >= 1.26 (see testenv/gobuild/*/go.mod)"

# The go.mod files must pin the same versions as versions.env, or the cache key would lie.
check_pin() { # module_dir module version
    local dir="$1" mod="$2" ver="$3"
    grep -Eq "^[[:space:]]*(require[[:space:]]+)?${mod//./\\.}[[:space:]]+${ver//./\\.}([[:space:]]|$)" "$gobuild/$dir/go.mod" \
        || die "testenv/gobuild/$dir/go.mod does not require $mod $ver (versions.env says $ver); update it with: cd testenv/gobuild/$dir && go get $mod@$ver && go mod tidy"
}
check_pin kubernetes k8s.io/kubernetes "$KUBERNETES_VERSION"
check_pin etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
check_pin kwok sigs.k8s.io/kwok "$KWOK_VERSION"
check_pin helm helm.sh/helm/v3 "$HELM_VERSION"
staging="v0.${KUBERNETES_VERSION#v1.}"
if grep -E '^replace k8s\.io/' "$gobuild/kubernetes/go.mod" | grep -vq "=> k8s.io/[^ ]* ${staging//./\\.}\$"; then
    die "testenv/gobuild/kubernetes/go.mod has staging replaces not at $staging (Kubernetes $KUBERNETES_VERSION)"
fi

# Only what these binaries are built from: the peers that build_peers.sh builds for the e2e
# bench (the "# Peers" section of versions.env, testenv/gobuild/kai) must not invalidate them.
modules=(etcd helm kubernetes kwok)
key="$(
    { sed '/^# Peers for the e2e bench/,$d' "$here/versions.env"
      for f in go.mod go.sum; do for m in "${modules[@]}"; do cat "$gobuild/$m/$f"; done; done
      for m in "${modules[@]}"; do cat "$gobuild/$m"/*.go 2>/dev/null || true; done
    } | sha256sum | cut -c1-16
)"
cache="$root/.cache/testenv-bin"
dest="$cache/$key"

link_current() {
    ln -sfn "$key" "$cache/current.tmp" && mv -T "$cache/current.tmp" "$cache/current"
}

missing=()
for b in "${binaries[@]}"; do
    [[ -x "$dest/$b" ]] || missing+=("$b")
done
if [[ ${#missing[@]} -eq 0 ]]; then
    link_current
    log "all binaries present in .cache/testenv-bin/$key (current); nothing to build"
    "$here/build_controllers.sh"  # Volcano and LWS for the e2e tests; their own cache key
    "$here/build_tools.sh"  # promtool for the monitoring tests; its own cache key
    exit 0
fi

log "building ${missing[*]} into .cache/testenv-bin/$key (kubernetes $KUBERNETES_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION, helm $HELM_VERSION)"
log "a cold build takes many minutes on 2 cores; Go's build cache makes the next one fast"
mkdir -p "$dest"
staging_dir="$(mktemp -d "$cache/.build-$key.XXXXXX")"
trap 'rm -rf "$staging_dir"' EXIT

export GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod -buildvcs=false"

timed_build() { # label module_dir go-build-args...
    local label="$1" dir="$2"; shift 2
    local start end
    start=$(date +%s)
    log "go build $label ..."
    if ! (cd "$gobuild/$dir" && go build "$@"); then
        die "go build $label failed (module testenv/gobuild/$dir); see the compiler output above"
    fi
    end=$(date +%s)
    log "built $label in $((end - start))s"
}

want() { # is any of the given binaries missing?
    local b m
    for b in "$@"; do for m in "${missing[@]}"; do [[ "$b" == "$m" ]] && return 0; done; done
    return 1
}

# One go build for the Kubernetes binaries that are missing: they share most packages.
# kube-scheduler adds ~25 s to a build whose Go cache already holds kube-apiserver's packages.
k8s_missing=()
for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    if want "$b"; then k8s_missing+=("$b"); fi
done
if [[ ${#k8s_missing[@]} -gt 0 ]]; then
    # Stamp the real version so helm's kubeVersion checks and kubectl's skew warnings see it.
    vpkg=k8s.io/component-base/version
    minor="${KUBERNETES_VERSION#v1.}"; minor="${minor%%.*}"
    kldflags="-X $vpkg.gitVersion=$KUBERNETES_VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean"
    timed_build "${k8s_missing[*]} ($KUBERNETES_VERSION)" kubernetes \
        -ldflags "$kldflags" -o "$staging_dir/" "${k8s_missing[@]/#/k8s.io/kubernetes/cmd/}"
fi
if want etcd; then
    timed_build "etcd ($ETCD_VERSION)" etcd -o "$staging_dir/etcd" .
fi
if want kwok; then
    timed_build "kwok ($KWOK_VERSION)" kwok -o "$staging_dir/kwok" sigs.k8s.io/kwok/cmd/kwok
fi
if want helm; then
    timed_build "helm ($HELM_VERSION)" helm \
        -ldflags "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
        -o "$staging_dir/helm" helm.sh/helm/v3/cmd/helm
fi

for b in "${missing[@]}"; do
    [[ -x "$staging_dir/$b" ]] || die "expected binary $b was not produced"
    mv -f "$staging_dir/$b" "$dest/$b"
done
for b in "${binaries[@]}"; do
    [[ -x "$dest/$b" ]] || die "binary $b missing from $dest after the build"
done
link_current
log "done: .cache/testenv-bin/current -> $key"
# Volcano's job controller and the LeaderWorkerSet controller for the e2e tests (their own
# keys and folders under .cache/testenv-bin/controllers/; see testenv/build_controllers.sh).
"$here/build_controllers.sh"
# promtool for the monitoring tests (own key, .cache/testenv-bin/tools/; testenv/build_tools.sh).
"$here/build_tools.sh"
