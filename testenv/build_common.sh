# Shared by testenv/build_controllers.sh and testenv/build_peers.sh, which source it (it is not
# run on its own): the pinned versions, logging, the Go toolchain check, cache folders with
# staging folders removed on exit, the pin check against the gobuild module, cache keys and
# links, and `go build` with progress lines.
#
# The sourcing script sets $here (its own folder, testenv/) and $log_tag (the prefix of its log
# lines) first.

root="$(cd "$here/.." && pwd)"
gobuild="$here/gobuild"
# shellcheck source=versions.env
source "$here/versions.env"

log() { printf '[%s %s] %s\n' "$log_tag" "$(date '+%H:%M:%S')" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

require_go() { # the Go toolchain on PATH; module mode, no VCS stamping
    command -v go >/dev/null 2>&1 || die "the Go toolchain is not on PATH; install Go >= 1.26"
    export GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod -buildvcs=false"
}

use_cache() { # folder -> sets $cache to it (made if missing); staging folders are made there
    cache="$1"
    mkdir -p "$cache"
    tmpdirs=()
    trap cleanup EXIT
}
cleanup() { [[ ${#tmpdirs[@]} -eq 0 ]] || rm -rf "${tmpdirs[@]}"; }
new_staging() { # name -> sets $staging to a fresh folder removed on exit unless moved away
    staging="$(mktemp -d "$cache/.build-$1.XXXXXX")"
    tmpdirs+=("$staging")
}

check_pin() { # module_dir module version
    local dir="$1" mod="$2" ver="$3"
    grep -Eq "^[[:space:]]*(require[[:space:]]+)?${mod//./\\.}[[:space:]]+${ver//./\\.}([[:space:]]|$)" "$gobuild/$dir/go.mod" \
        || die "testenv/gobuild/$dir/go.mod does not require $mod $ver (versions.env); update it with: cd testenv/gobuild/$dir && go get $mod@$ver && go mod tidy"
}

cache_key() { # pin module_dir [more files...] -> 16 hex chars
    { printf '%s\n' "$1"; cat "$gobuild/$2/go.mod" "$gobuild/$2/go.sum" "${@:3}"; } \
        | sha256sum | cut -c1-16
}

link() { # name key: $cache/<name> -> <name>-<key>
    ln -sfn "$1-$2" "$cache/$1.tmp" && mv -T "$cache/$1.tmp" "$cache/$1"
}

finish() { # name key [chmod args]: $staging becomes $cache/<name>-<key>, linked as <name>
    local dest="$cache/$1-$2"
    if [[ $# -gt 2 ]]; then
        chmod "${@:3}" "$staging"
    else
        chmod -R u+w,go+rX "$staging"  # files copied from the read-only module cache; mktemp's 700
    fi
    rm -rf "$dest" && mv "$staging" "$dest"
    link "$1" "$2"
    log "done: ${cache#"$root"/}/$1 -> $1-$2"
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
