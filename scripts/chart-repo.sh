#!/usr/bin/env bash
# Package the Helm chart into a chart repository that `helm repo add` understands:
#
#   scripts/chart-repo.sh OUT_DIR [--url BASE_URL]
#
# writes OUT_DIR/kai-scheduler/ with index.yaml and one kai-scheduler-<version>.tgz per chart
# version: the chart in manifests/chart (the working tree, so uncommitted edits are included)
# plus every earlier release listed in RELEASES below, packaged from the git commit that
# shipped it. Serve OUT_DIR over HTTP(S) and the repository URL is <base>/kai-scheduler/:
#
#   helm repo add kai-scheduler https://charts.example.org/kai-scheduler/
#   helm install kai-scheduler kai-scheduler/kai-scheduler -n kai-scheduler
#
# Without --url the index holds relative chart URLs (kai-scheduler-<version>.tgz), which helm
# resolves against the repository URL, so the folder can be served from anywhere; with
# --url BASE_URL they are absolute (BASE_URL/kai-scheduler/kai-scheduler-<version>.tgz).
#
# Earlier releases come from git rather than from committed tarballs: the history already holds
# them byte for byte, a tarball in the tree would be a second copy that can drift from the
# commit it claims to be, and binary blobs do not review. It needs a clone with that history
# (a shallow clone fails with the `git fetch` that fixes it).
#
# helm: $HELM if set, else `helm` on PATH, else the one testenv/build.sh builds
# (.cache/testenv-bin/current/helm). Exit codes: 0 ok, 1 failure, 2 bad arguments or setup.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# Earlier chart releases: "<chart version> <git commit that shipped it>". When the chart's
# version is bumped, add the last commit of the old version here.
RELEASES=(
    "0.1.0 ffdfc5c"
)
CHART_NAME="kai-scheduler"

usage() {
    cat >&2 <<EOF
usage: scripts/chart-repo.sh OUT_DIR [--url BASE_URL]
  OUT_DIR       folder to write; the repository is OUT_DIR/$CHART_NAME/ (index.yaml + charts)
  --url BASE    absolute base URL OUT_DIR is served at (default: relative chart URLs)
EOF
}
bad() { printf 'chart-repo.sh: %s\n' "$*" >&2; exit 2; }
fail() { printf 'chart-repo.sh: %s\n' "$*" >&2; exit 1; }

out="" base_url=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --url) [[ $# -ge 2 && -n "$2" ]] || { usage; bad "--url needs a value, e.g. --url https://charts.example.org"; }
               base_url="${2%/}"; shift 2 ;;
        --url=*) base_url="${1#--url=}"; base_url="${base_url%/}"
                 [[ -n "$base_url" ]] || bad "--url needs a value, e.g. --url https://charts.example.org" ;;
        -*) usage; bad "unknown flag $1" ;;
        *) [[ -z "$out" ]] || { usage; bad "only one OUT_DIR may be given (got '$out' and '$1')"; }
           out="$1"; shift ;;
    esac
done
[[ -n "$out" ]] || { usage; bad "OUT_DIR is required"; }
if [[ -n "$base_url" && ! "$base_url" =~ ^https?://[^/]+ ]]; then
    bad "--url must be an http:// or https:// URL (got '$base_url')"
fi

helm="${HELM:-}"
if [[ -z "$helm" ]]; then
    helm="$(command -v helm 2>/dev/null || true)"
    [[ -n "$helm" ]] || helm="$root/.cache/testenv-bin/current/helm"
fi
[[ -x "$helm" ]] || bad "helm not found at '$helm': install helm 3, set HELM=/path/to/helm, or run scripts/setup.sh (builds .cache/testenv-bin/current/helm)"

chart_version() { # Chart.yaml -> its version field
    sed -n -E 's/^version:[[:space:]]*"?([^"[:space:]]+)"?[[:space:]]*$/\1/p' "$1"
}

current="$(chart_version "$root/manifests/chart/Chart.yaml")"
[[ -n "$current" ]] || fail "manifests/chart/Chart.yaml has no version field"

repo="$out/$CHART_NAME"
if [[ -e "$repo" ]]; then
    # Only ever replace a folder this script wrote: index.yaml and chart archives.
    stray="$(find "$repo" -mindepth 1 -maxdepth 1 ! -name index.yaml ! -name "$CHART_NAME-*.tgz" -print -quit)"
    [[ -z "$stray" ]] || bad "$repo holds '$stray', which this script did not write: choose an empty OUT_DIR"
fi
mkdir -p "$out"
staging="$(mktemp -d "$out/.chart-repo.XXXXXX")"
trap 'rm -rf "$staging"' EXIT
mkdir "$staging/$CHART_NAME" "$staging/src"

for release in "${RELEASES[@]}"; do
    read -r version commit <<<"$release"
    [[ "$version" != "$current" ]] \
        || fail "manifests/chart/Chart.yaml says version $current, which was already released at $commit: bump the chart version"
    git -C "$root" cat-file -e "$commit^{commit}" 2>/dev/null \
        || fail "commit $commit (chart $version) is not in this clone: fetch the history with 'git fetch --unshallow' (or 'git fetch origin $commit')"
    src="$staging/src/$version"
    mkdir "$src"
    git -C "$root" archive "$commit" manifests/chart | tar -x -C "$src"
    shipped="$(chart_version "$src/manifests/chart/Chart.yaml")"
    [[ "$shipped" == "$version" ]] \
        || fail "the chart at $commit has version '$shipped', not $version: fix RELEASES in scripts/chart-repo.sh"
    "$helm" package "$src/manifests/chart" -d "$staging/$CHART_NAME" >/dev/null
done
"$helm" package "$root/manifests/chart" -d "$staging/$CHART_NAME" >/dev/null

index_args=()
[[ -z "$base_url" ]] || index_args=(--url "$base_url/$CHART_NAME")
"$helm" repo index "$staging/$CHART_NAME" "${index_args[@]}"

rm -rf "$repo"
mv "$staging/$CHART_NAME" "$repo"

versions="$(printf '%s\n' "${RELEASES[@]%% *}" "$current" | paste -sd' ' -)"
printf 'chart repository %s: %s %s\n' "$repo" "$CHART_NAME" "$versions"
printf 'serve %s and add it with: helm repo add %s %s/%s/\n' "$out" "$CHART_NAME" "${base_url:-<base url>}" "$CHART_NAME"
