#!/usr/bin/env bash
# Builds the real Kubernetes pieces that tests/k8s runs (control plane, datastore,
# KWOK, the KubeRay operator, the Pulumi CLI, the real node: kubelet, kube-proxy,
# containerd, CNI plugins, CoreDNS, kube-router, and SeaweedFS, the object store of the
# run storage tests) from Go modules, into
# a cache outside the work tree:
#
#   ${UERL_K8S_CACHE:-$HOME/.cache/uerl-k8s}/<name>-<version>/bin/
#
# A piece whose directory is complete is reused, so a second run is a no-op.
# Everything comes through the `go` client, from the module proxy of the user's Go
# environment (`go env GOPROXY`, a company mirror say); nothing else is downloaded.
# The user's GOFLAGS are kept (ours are appended). Builds run under `nice -n 19`
# (UERL_BUILD_NICE) with `go build -p 1` so one core stays free for other work.
#
# Usage: tests/k8s/build/build.sh [--force] [PIECE...]
#   PIECE: kubernetes kine kwok kuberay pulumi pulumi-language-python
#          pulumi-kubernetes pulumi-yaml kubernetes-node containerd cni-plugins
#          coredns kube-router seaweedfs (default: all)
#   --force: rebuild the named pieces even if they are cached
#   --print-cache: print the cache directory and exit
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$HERE/versions.env" # the pinned versions

CACHE=${UERL_K8S_CACHE:-$HOME/.cache/uerl-k8s}

# Upstream sources the Go module proxy refuses, copied here by the steering repo.
SHARED=${UERL_SHARED_DIR:-$(cd "$HERE/../../../.." && pwd)/shared}

# In the order the tier's modules need them (tests/k8s/build_wait.py): CI starts the tier
# beside the build, and a module starts once its pieces are built.
ALL_PIECES=(kubernetes kine kwok kuberay pulumi pulumi-language-python pulumi-kubernetes
  pulumi-yaml seaweedfs kubernetes-node containerd cni-plugins coredns kube-router)

version_of() {
  case $1 in
    kubernetes) echo "$KUBERNETES_VERSION" ;;
    kine) echo "$KINE_VERSION" ;;
    kwok) echo "$KWOK_VERSION" ;;
    kuberay) echo "$KUBERAY_VERSION" ;;
    pulumi) echo "$PULUMI_VERSION" ;;
    pulumi-language-python) echo "$PULUMI_VERSION" ;;
    pulumi-kubernetes) echo "$PULUMI_KUBERNETES_VERSION" ;;
    pulumi-yaml) echo "$PULUMI_YAML_VERSION" ;;
    kubernetes-node) echo "$KUBERNETES_VERSION" ;;
    containerd) echo "$CONTAINERD_VERSION" ;;
    cni-plugins) echo "$CNI_PLUGINS_VERSION" ;;
    coredns) echo "$COREDNS_VERSION" ;;
    kube-router) echo "$KUBE_ROUTER_VERSION" ;;
    seaweedfs) echo "$SEAWEEDFS_VERSION" ;;
    *) echo "unknown piece: $1" >&2; return 1 ;;
  esac
}

FORCE=0
PIECES=()
for arg in "$@"; do
  case $arg in
    --force) FORCE=1 ;;
    --print-cache) echo "$CACHE"; exit 0 ;;
    -h | --help) sed -n '2,/^set /{/^#/p}' "$0"; exit 0 ;;
    *) version_of "$arg" >/dev/null; PIECES+=("$arg") ;;
  esac
done
[[ ${#PIECES[@]} -gt 0 ]] || PIECES=("${ALL_PIECES[@]}")

command -v go >/dev/null || { echo "build.sh: go is not on PATH" >&2; exit 1; }

# GOPROXY is the user's (`go env GOPROXY`): never set here. Never a toolchain
# download; static binaries.
export GOTOOLCHAIN=local
export CGO_ENABLED=0

# Off CI one core stays free for other work (go build -p 1, nice 19); on CI
# nothing else runs, so the builds take every core. UERL_BUILD_JOBS overrides.
if [[ -n ${UERL_BUILD_JOBS:-} ]]; then
  JOBS=$UERL_BUILD_JOBS
elif [[ -n ${CI:-} ]]; then
  JOBS=$(nproc)
else
  JOBS=1
fi
# Appended to the user's GOFLAGS (from the environment or `go env -w`), not in
# place of them; a flag given twice takes its last value.
USER_GOFLAGS=$(go env GOFLAGS)
GOFLAGS="${USER_GOFLAGS:+$USER_GOFLAGS }-p=$JOBS"
# No DWARF from the compiler: `-ldflags -w` drops it from every binary anyway, and
# generating it is compile time spent for nothing (a gcflags of the user's is replaced).
GOFLAGS+=" -gcflags=all=-dwarf=false"
[[ " $GOFLAGS " == *" -buildvcs="* ]] || GOFLAGS+=" -buildvcs=false"
export GOFLAGS
# Off CI the lowest priority; CI's build is its critical path (UERL_BUILD_NICE=0).
NICE=(nice -n "${UERL_BUILD_NICE:-19}")
echo "build.sh: GOPROXY=$(go env GOPROXY) GOFLAGS=$GOFLAGS"

# go build inside one of the wrapper modules beside this script (their go.mod and
# go.sum are committed, so the build is read-only against them).
wrapper_build() { # DIR OUT LDFLAGS PKG...
  local dir=$1 out=$2 ldflags=$3
  shift 3
  (cd "$HERE/$dir" && "${NICE[@]}" go build -mod=readonly -trimpath -ldflags "$ldflags" -o "$out/" "$@")
}

# go install PKG@VERSION... of a module whose go.mod has no replace directives
# (its own go.sum is then used as is).
module_install() { # OUT LDFLAGS PKG@VERSION...
  local out=$1 ldflags=$2
  shift 2
  (cd "$out" && GOBIN="$out" "${NICE[@]}" go install -trimpath -ldflags "$ldflags" "$@")
}

require() { # WRAPPER-DIR MODULE VERSION: the wrapper's go.mod must pin the same version
  grep -q "^[[:space:]]*\(require \)\?$2 $3\$" "$HERE/$1/go.mod" ||
    { echo "$1/go.mod does not require $2 $3 (versions.env)" >&2; return 1; }
}

kubernetes_ldflags() { # the version the binaries report (or they say v0.0.0-master)
  local v=$KUBERNETES_VERSION minor ldflags="-s -w" key val pkg
  minor=${v#v*.}
  minor=${minor%%.*}
  local -A vars=(
    [gitVersion]=$v
    [gitMajor]=$(echo "${v#v}" | cut -d. -f1)
    [gitMinor]=$minor
    [gitTreeState]=clean
    [buildDate]=1970-01-01T00:00:00Z
  )
  for key in "${!vars[@]}"; do
    val=${vars[$key]}
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldflags+=" -X $pkg.$key=$val"
    done
  done
  echo "$ldflags"
}

build_kubernetes() { # OUT
  require kubernetes k8s.io/kubernetes "$KUBERNETES_VERSION"
  wrapper_build kubernetes "$1" "$(kubernetes_ldflags)" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubectl
}

build_kine() {
  module_install "$1" "-s -w -X github.com/k3s-io/kine/pkg/version.Version=$KINE_VERSION" \
    "github.com/k3s-io/kine@$KINE_VERSION"
}

build_kwok() {
  # A wrapper module whose k8s.io/* and other shared dependencies are raised to the
  # kubernetes piece's versions, so most of its packages come from the build cache.
  require kwok sigs.k8s.io/kwok "$KWOK_VERSION"
  wrapper_build kwok "$1" "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}" \
    sigs.k8s.io/kwok/cmd/kwok
}

build_kuberay() {
  # A wrapper module: `go install ...@version` of it asks the proxy for the
  # module's version list (deprecation check), which the proxy here refuses.
  require kuberay github.com/ray-project/kuberay/ray-operator "$KUBERAY_VERSION"
  wrapper_build kuberay "$1" "-s -w" github.com/ray-project/kuberay/ray-operator
  mv "$1/ray-operator" "$1/kuberay-operator"
}

build_seaweedfs() {
  require seaweedfs github.com/seaweedfs/seaweedfs "$SEAWEEDFS_VERSION"
  wrapper_build seaweedfs "$1" "-s -w" github.com/seaweedfs/seaweedfs/weed
}

build_pulumi() {
  require pulumi github.com/pulumi/pulumi/pkg/v3 "$PULUMI_VERSION"
  wrapper_build pulumi "$1" \
    "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$PULUMI_VERSION" \
    github.com/pulumi/pulumi/pkg/v3/cmd/pulumi
}

# A source tree from ../shared/third_party copied into the cache, with the
# committed go.mod and go.sum of WRAPPER-DIR in place of its own (those point at
# upstream's monorepo or at versions the proxy refuses), so `go build
# -mod=readonly` needs no checksum-database look-ups and never writes to them.
# The only read of ../shared/third_party: the Go module proxy refuses these two; a clone
# without them gets one line saying what to put where, and patched_source fails.
patched_source() { # SHARED-SUBDIR WRAPPER-DIR DEST
  local from=$SHARED/third_party/$1 what also=
  if [[ ! -d $from ]]; then
    case $1 in
      pulumi-language-python-*)
        what="github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3 $PULUMI_VERSION"
        also=" (with upstream's sdk/python/cmd/pulumi-language-python-exec beside its main.go)" ;;
      pulumi-kubernetes-provider-*)
        what="github.com/pulumi/pulumi-kubernetes/provider/v4 $PULUMI_KUBERNETES_VERSION"
        also=" (the tree of commit 94977969d641, which pulumi-kubernetes/go.mod is for)" ;;
      *) what=$1 ;;
    esac
    echo "build.sh: missing the upstream source of Go module $what, which the module proxy" \
      "does not serve: put it, unmodified, in $from$also" >&2
    return 1
  fi
  rm -rf "$3"
  mkdir -p "$(dirname "$3")"
  cp -r "$from" "$3"
  chmod -R u+w "$3"
  cp "$HERE/$2/go.mod" "$HERE/$2/go.sum" "$3/"
}

build_pulumi-language-python() { # OUT
  # The bundled Python language host and its exec shim, beside the CLI as in
  # Pulumi's release archive (the CLI then uses them without a warning).
  local src=$CACHE/.src-pulumi-language-python-$PULUMI_VERSION
  require pulumi-language-python github.com/pulumi/pulumi/sdk/v3 "$PULUMI_VERSION"
  patched_source "pulumi-language-python-$PULUMI_VERSION" pulumi-language-python "$src" || return 1
  (cd "$src" && "${NICE[@]}" go build -mod=readonly -trimpath \
    -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$PULUMI_VERSION" \
    -o "$1/pulumi-language-python" .) || return 1
  install -m 0755 "$src/pulumi-language-python-exec" "$1/" || return 1
  # The plugin that serves the program's dynamic resources (infra's KubeRayCRDs), a shell
  # script of the SDK module's, shipped beside the language host as in the release archive.
  install -m 0755 "$(go env GOMODCACHE)/github.com/pulumi/pulumi/sdk/v3@$PULUMI_VERSION/python/dist/pulumi-resource-pulumi-python" \
    "$1/" || return 1
  rm -rf "$src"
}

build_pulumi-kubernetes() { # OUT
  # The provider's main package embeds a schema that upstream generates from a
  # schema.json absent from the source; make it with the provider's own
  # generator from the OpenAPI v2 document of the Kubernetes release the tier
  # runs (api/openapi-spec/swagger.json of k8s.io/kubernetes: what its
  # kube-apiserver serves at /openapi/v2).
  local v=${PULUMI_KUBERNETES_VERSION#v} src=$CACHE/.src-pulumi-kubernetes-$PULUMI_KUBERNETES_VERSION
  local cmd swagger
  patched_source "pulumi-kubernetes-provider-$PULUMI_KUBERNETES_VERSION/provider" pulumi-kubernetes "$src" || return 1
  cmd=$src/cmd/pulumi-resource-kubernetes
  mkdir -p "$src/cmd/uerl-gen-schema"
  cp "$HERE/pulumi-kubernetes/genschema/main.go" "$src/cmd/uerl-gen-schema/" || return 1
  swagger=$(cd "$HERE/kubernetes" && go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')/api/openapi-spec/swagger.json
  (cd "$src" && "${NICE[@]}" go run -mod=readonly -trimpath ./cmd/uerl-gen-schema \
    "$swagger" "$cmd/terraform-mapping.json" "$v" "$cmd") || return 1
  (cd "$src" && "${NICE[@]}" go build -mod=readonly -trimpath \
    -ldflags "-s -w -X github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version.Version=$v" \
    -o "$1/pulumi-resource-kubernetes" ./cmd/pulumi-resource-kubernetes) || return 1
  rm -rf "$src"
}

build_pulumi-yaml() { # OUT
  # Pulumi YAML's language host, beside the CLI as in Pulumi's release archive, built in a
  # wrapper module: its main.go is upstream's cmd/pulumi-language-yaml with the schemas
  # asked of the CLI (v1.25.0 would start the Python language host itself, with flags
  # v3.259.0's no longer takes). pulumi-yaml v1.25.0 compiles only against the Pulumi
  # pkg/sdk v3.206.0 it asks for (v3.246.0's and v3.259.0's plugin APIs changed), so those
  # are its own; every other shared module (gRPC, protobuf, OpenTelemetry, golang.org/x, ...)
  # is at the CLI's version (pulumi/go.mod), so those packages come from its build cache.
  require pulumi-yaml github.com/pulumi/pulumi-yaml "$PULUMI_YAML_VERSION"
  wrapper_build pulumi-yaml "$1" \
    "-s -w -X github.com/pulumi/pulumi-yaml/pkg/version.Version=${PULUMI_YAML_VERSION#v}" . &&
    mv "$1/pulumi-yaml" "$1/pulumi-language-yaml"
}

# ---- the real node (tests/k8s/node.py) ----------------------------------------

build_kubernetes-node() { # OUT
  # Its own wrapper module, so that adding the node left the control plane's
  # cached build (and its go.mod) as it was.
  require kubernetes-node k8s.io/kubernetes "$KUBERNETES_VERSION"
  wrapper_build kubernetes-node "$1" "$(kubernetes_ldflags)" \
    k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy
}

build_containerd() { # OUT
  # no_btrfs: the btrfs snapshotter needs cgo.
  local m=github.com/containerd/containerd/v2 v=$CONTAINERD_VERSION
  GOFLAGS="$GOFLAGS -tags=no_btrfs" module_install "$1" \
    "-s -w -X $m/version.Version=$v" \
    "$m/cmd/containerd@$v" "$m/cmd/containerd-shim-runc-v2@$v" "$m/cmd/ctr@$v"
}

build_cni-plugins() { # OUT
  local m=github.com/containernetworking/plugins v=$CNI_PLUGINS_VERSION
  module_install "$1" "-s -w -X $m/pkg/utils/buildversion.BuildVersion=$v" \
    "$m/plugins/main/bridge@$v" "$m/plugins/ipam/host-local@$v" \
    "$m/plugins/main/loopback@$v" "$m/plugins/meta/portmap@$v"
}

build_coredns() { # OUT
  # A wrapper with only the plugins the node's Corefile uses (build/coredns/main.go):
  # the release's every plugin (cloud DNS providers, etcd, ...) took 21 min cold here.
  require coredns github.com/coredns/coredns "$COREDNS_VERSION"
  wrapper_build coredns "$1" "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" .
}

build_kube-router() { # OUT
  local m=github.com/cloudnativelabs/kube-router/v2
  module_install "$1" \
    "-s -w -X $m/pkg/version.Version=$KUBE_ROUTER_VERSION -X $m/pkg/version.BuildDate=1970-01-01T00:00:00Z" \
    "$m/cmd/kube-router@$KUBE_ROUTER_VERSION"
}

# CPU seconds (user + system) of this shell's finished children: the clock ticks in
# /proc/self/stat's cutime and cstime fields.
children_cpu_s() {
  local stat
  read -r -a stat <"/proc/$$/stat"
  echo $(((stat[15] + stat[16]) / $(getconf CLK_TCK)))
}

# What a piece's binaries were built from beyond its version: the wrapper module's go.mod
# and go.sum (a dependency aligned there rebuilds the piece; the cache is keyed by version).
recipe_of() { # PIECE
  local dir=$HERE/$1
  if [[ -f $dir/go.mod ]]; then
    cat "$dir/go.mod" "$dir/go.sum" 2>/dev/null | sha256sum | cut -c1-16
  fi
}

status=0
summary=()
for piece in "${PIECES[@]}"; do
  version=$(version_of "$piece")
  dest="$CACHE/$piece-$version"
  recipe=$(recipe_of "$piece")
  # A piece built before its recipe gained a binary, or from another wrapper module, is
  # built again.
  if [[ $FORCE == 0 && -f "$dest/.complete" ]] &&
    [[ $(sed -n 's/^recipe=//p' "$dest/.complete") == "$recipe" ]] &&
    [[ $piece != pulumi-language-python || -x "$dest/bin/pulumi-resource-pulumi-python" ]]; then
    echo "reused $piece $version: $dest/bin ($(ls "$dest/bin" | tr '\n' ' '))"
    continue
  fi
  echo "building $piece $version -> $dest/bin"
  tmp="$CACHE/.tmp-$piece-$version"
  rm -rf "$tmp"
  mkdir -p "$tmp/bin"
  start=$SECONDS
  cpu_start=$(children_cpu_s)
  # Inside `if` bash ignores `set -e`: each build function returns on its first failure.
  if "build_$piece" "$tmp/bin"; then
    {
      echo "piece=$piece"
      echo "version=$version"
      echo "go=$(go env GOVERSION)"
      echo "recipe=$recipe"
      echo "seconds=$((SECONDS - start))"
      echo "cpu_seconds=$(($(children_cpu_s) - cpu_start))"
    } >"$tmp/.complete"
    rm -rf "$dest"
    mv "$tmp" "$dest"
    echo "built $piece $version in $((SECONDS - start))s: $(du -sh "$dest" | cut -f1) in $dest/bin ($(ls "$dest/bin" | tr '\n' ' '))"
    summary+=("$(printf '%-24s %6d s %7d s  built' "$piece" $((SECONDS - start)) $(($(children_cpu_s) - cpu_start)))")
  else
    rm -rf "$tmp"
    echo "FAILED to build $piece $version (after $((SECONDS - start))s)" >&2
    summary+=("$(printf '%-24s %6d s %7d s  FAILED' "$piece" $((SECONDS - start)) $(($(children_cpu_s) - cpu_start)))")
    status=1
  fi
done
if [[ ${#summary[@]} -gt 0 ]]; then
  echo "build.sh: what was built (wall, CPU user+system; the rest reused)"
  printf '  %s\n' "${summary[@]}"
fi
exit $status
