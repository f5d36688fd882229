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
# .cache/testenv-bin/controllers/<name>-<key>/ (key: hash of its pin, its gobuild module and the
# build scripts, this one and build_common.sh) and .cache/testenv-bin/controllers/<name> points
# at it. With the files there the script only checks and returns at once. Next to each binary
# it copies, verbatim from the same module version, what the harness (testenv/controllers.py)
# applies: the CRDs, the upstream RBAC (Volcano's rendered installer/volcano-development.yaml,
# LWS's Helm chart) and LWS's webhook manifests. The Go module proxy refuses version lists:
# every module is asked for at an exact version.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
log_tag=build-controllers
# shellcheck source=build_common.sh
source "$here/build_common.sh"

[[ $# -gt 0 ]] || set -- volcano lws kwok-stages
require_go
use_cache "$root/.cache/testenv-bin/controllers"

key_of() { # pin module_dir -> 16 hex chars (these scripts are part of it: they decide the layout)
    cache_key "$1" "$2" "${BASH_SOURCE[0]}" "$here/build_common.sh"
}

module_dir() { # module_dir module -> its folder in the module cache (downloaded if needed)
    (cd "$gobuild/$1" && go mod download "$2" && go list -m -f '{{.Dir}}' "$2")
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
