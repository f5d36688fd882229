#!/usr/bin/env bash
# Build the third-party controllers the e2e tests run against the test control plane:
#
#   testenv/build_controllers.sh              # all three
#   testenv/build_controllers.sh volcano      # volcano.sh/volcano cmd/controller-manager
#   testenv/build_controllers.sh lws          # sigs.k8s.io/lws cmd (the LeaderWorkerSet manager)
#   testenv/build_controllers.sh kwok-stages  # no build: kwok's pod-ready/pod-delete Stages
#
# kwok-stages are copied from the pinned kwok module (testenv/gobuild/kwok) for a second kwok
# whose pods run until deleted (the control plane's kwok completes pods owned by any kind
# "Job" at once, Volcano's included; see testenv/controllers.py).
#
# testenv/build.sh calls it (so scripts/setup.sh, and CI, build them too). Versions are pinned
# in testenv/versions.env (the "# Controllers" section) and by the module files in
# testenv/gobuild/{volcano,lws}; each controller lands in
# .cache/testenv-bin/controllers/<name>-<key>/ (key: hash of its pin and its gobuild module) and
# .cache/testenv-bin/controllers/<name> points at it. With the files there the script only
# checks and returns at once. Next to each binary it copies, verbatim from the same module
# version, what the harness (testenv/controllers.py) applies: the CRDs, the upstream RBAC
# (Volcano's rendered installer/volcano-development.yaml, LWS's Helm chart) and LWS's webhook
# manifests. The Go module proxy refuses version lists: every module is asked for at an exact
# version.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
gobuild="$here/gobuild"
# shellcheck source=versions.env
source "$here/versions.env"

log() { printf '[build-controllers %s] %s\n' "$(date '+%H:%M:%S')" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ $# -gt 0 ]] || set -- volcano lws kwok-stages
command -v go >/dev/null 2>&1 || die "the Go toolchain is not on PATH; install Go >= 1.26"
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod -buildvcs=false"

cache="$root/.cache/testenv-bin/controllers"
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

key_of() { # pin module_dir -> 16 hex chars (this script is part of it: it decides the layout)
    { printf '%s\n' "$1"; cat "$gobuild/$2/go.mod" "$gobuild/$2/go.sum" "${BASH_SOURCE[0]}"; } \
        | sha256sum | cut -c1-16
}

link() { # name key
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

module_dir() { # module_dir module -> its folder in the module cache (downloaded if needed)
    (cd "$gobuild/$1" && go mod download "$2" && go list -m -f '{{.Dir}}' "$2")
}

finish() { # name key
    local dest="$cache/$1-$2"
    chmod -R u+w,go+rX "$staging"  # files copied from the read-only module cache; mktemp's 700
    rm -rf "$dest" && mv "$staging" "$dest"
    link "$1" "$2"
    log "done: .cache/testenv-bin/controllers/$1 -> $1-$2"
}

build_volcano() {
    local mod=volcano.sh/volcano key dest src
    check_pin volcano "$mod" "$VOLCANO_VERSION"
    key="$(key_of "VOLCANO_VERSION=$VOLCANO_VERSION" volcano)"
    dest="$cache/volcano-$key"
    if [[ -x "$dest/vc-controller-manager" && -d "$dest/crds" && -f "$dest/rbac/volcano-development.yaml" ]]; then
        link volcano "$key"
        log "Volcano $VOLCANO_VERSION present in .cache/testenv-bin/controllers/volcano-$key"
        return
    fi
    new_staging volcano
    src="$(module_dir volcano "$mod")" || die "go mod download $mod@$VOLCANO_VERSION failed"
    [[ -d "$src/config/crd/volcano/bases" ]] || die "no config/crd/volcano/bases in $src"
    timed_build "Volcano controller-manager ($VOLCANO_VERSION)" volcano \
        -ldflags "-X $mod/pkg/version.Version=$VOLCANO_VERSION" \
        -o "$staging/vc-controller-manager" "$mod/cmd/controller-manager"
    mkdir -p "$staging/crds" "$staging/rbac"
    cp "$src"/config/crd/volcano/bases/*.yaml "$staging/crds/"
    cp "$src/installer/volcano-development.yaml" "$staging/rbac/"
    finish volcano "$key"
}

build_lws() {
    local mod=sigs.k8s.io/lws key dest src
    check_pin lws "$mod" "$LWS_VERSION"
    key="$(key_of "LWS_VERSION=$LWS_VERSION" lws)"
    dest="$cache/lws-$key"
    if [[ -x "$dest/lws-manager" && -d "$dest/crds" && -d "$dest/webhook" && -d "$dest/chart" ]]; then
        link lws "$key"
        log "LeaderWorkerSet $LWS_VERSION present in .cache/testenv-bin/controllers/lws-$key"
        return
    fi
    new_staging lws
    src="$(module_dir lws "$mod")" || die "go mod download $mod@$LWS_VERSION failed"
    [[ -f "$src/config/webhook/manifests.yaml" ]] || die "no config/webhook/manifests.yaml in $src"
    timed_build "LeaderWorkerSet manager ($LWS_VERSION)" lws \
        -ldflags "-X $mod/pkg/version.GitVersion=$LWS_VERSION" \
        -o "$staging/lws-manager" "$mod/cmd"
    mkdir -p "$staging/crds" "$staging/webhook" "$staging/chart"
    cp "$src"/config/crd/bases/*.yaml "$staging/crds/"
    # manifests.yaml plus the kustomize patches the release applies to it (the pod webhooks'
    # objectSelector), and the Helm chart whose RBAC templates the harness renders.
    cp "$src"/config/webhook/{manifests,mutating-patch,validating-patch}.yaml "$staging/webhook/"
    cp -r "$src/charts/lws" "$staging/chart/"
    finish lws "$key"
}

copy_kwok_stages() {
    local mod=sigs.k8s.io/kwok key dest src f
    check_pin kwok "$mod" "$KWOK_VERSION"
    key="$(key_of "KWOK_VERSION=$KWOK_VERSION" kwok)"
    dest="$cache/kwok-stages-$key"
    if [[ -f "$dest/pod-ready.yaml" && -f "$dest/pod-delete.yaml" ]]; then
        link kwok-stages "$key"
        log "kwok $KWOK_VERSION pod stages present in .cache/testenv-bin/controllers/kwok-stages-$key"
        return
    fi
    new_staging kwok-stages
    src="$(module_dir kwok "$mod")" || die "go mod download $mod@$KWOK_VERSION failed"
    for f in pod-ready pod-delete; do
        cp "$src/kustomize/stage/pod/fast/$f.yaml" "$staging/" || die "no $f.yaml in $src"
    done
    finish kwok-stages "$key"
}

for name in "$@"; do
    case "$name" in
        volcano) build_volcano ;;
        lws) build_lws ;;
        kwok-stages) copy_kwok_stages ;;
        *) die "unknown controller $name (use volcano, lws or kwok-stages)" ;;
    esac
done
