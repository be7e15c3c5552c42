#!/usr/bin/env bash
# Builds the local cluster's binaries from pinned Go modules into a cache
# outside the repository, keyed by version. A binary already in the cache is
# never rebuilt, so only the first run on a machine pays for the build.
set -euo pipefail

# shellcheck source=cluster-versions.env
source "$(dirname "$0")/cluster-versions.env"
CACHE="${INFERGRID_CACHE:-$HOME/.cache/infergrid}"
BIN="$CACHE/bin"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

# Kubernetes maps each staging module to v0.0.0 via replace; the published
# staging modules share the release's minor and patch under a v0 major.
STAGING=(api apiextensions-apiserver apimachinery apiserver cli-runtime client-go
  cloud-provider cluster-bootstrap code-generator component-base component-helpers
  controller-manager cri-api cri-client csi-translation-lib dynamic-resource-allocation
  endpointslice externaljwt kms kube-aggregator kube-controller-manager kube-proxy
  kube-scheduler kubectl kubelet metrics mount-utils pod-security-admission
  sample-apiserver sample-cli-plugin sample-controller)

log() { echo "[build-binaries] $*" >&2; }

# scratch_module DIR MODULE VERSION [REPLACE...]: a throwaway main module that
# requires MODULE at VERSION, with extra replace directives.
scratch_module() {
  local dir=$1 module=$2 version=$3; shift 3
  rm -rf "$dir"; mkdir -p "$dir"
  {
    echo "module infergrid.local/build"
    echo "go 1.25"
    echo "require $module $version"
    for r in "$@"; do echo "replace $r"; done
  } >"$dir/go.mod"
  (cd "$dir" && go mod download "$module")
}

build_kubernetes() {
  local out="$BIN/kubernetes-$K8S_VERSION" dir="$CACHE/src/kubernetes-$K8S_VERSION"
  local want=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet)
  local missing=0
  for b in "${want[@]}"; do [[ -x "$out/$b" ]] || missing=1; done
  [[ $missing == 0 ]] && { log "kubernetes $K8S_VERSION cached"; return; }
  log "building kubernetes $K8S_VERSION (cold: tens of minutes on 2 cores)"
  local v0="v0.${K8S_VERSION#v1.}" reps=()
  for m in "${STAGING[@]}"; do reps+=("k8s.io/$m => k8s.io/$m $v0"); done
  scratch_module "$dir" k8s.io/kubernetes "$K8S_VERSION" "${reps[@]}"
  local stamp="k8s.io/component-base/version" minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local ld="-s -w -X $stamp.gitVersion=$K8S_VERSION -X $stamp.gitMajor=1 -X $stamp.gitMinor=$minor"
  ld+=" -X $stamp.gitTreeState=clean -X $stamp.buildDate=1970-01-01T00:00:00Z"
  ld+=" -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  mkdir -p "$out"
  for b in "${want[@]}"; do
    [[ -x "$out/$b" ]] && continue
    (cd "$dir" && go build -trimpath -ldflags "$ld" -o "$out/$b.tmp" "k8s.io/kubernetes/cmd/$b")
    mv "$out/$b.tmp" "$out/$b"; log "built $b"
  done
}

build_etcd() {
  local out="$BIN/etcd-$ETCD_VERSION" dir="$CACHE/src/etcd-$ETCD_VERSION"
  [[ -x "$out/etcd" ]] && { log "etcd $ETCD_VERSION cached"; return; }
  log "building etcd $ETCD_VERSION"
  local reps=()
  for m in api/v3 client/pkg/v3 client/v3 pkg/v3; do
    reps+=("go.etcd.io/etcd/$m => go.etcd.io/etcd/$m $ETCD_VERSION")
  done
  scratch_module "$dir" go.etcd.io/etcd/server/v3 "$ETCD_VERSION" "${reps[@]}"
  mkdir -p "$out"
  (cd "$dir" && go build -trimpath -ldflags "-s -w" -o "$out/etcd.tmp" go.etcd.io/etcd/server/v3)
  mv "$out/etcd.tmp" "$out/etcd"; log "built etcd"
}

# containerd, its runc shim and ctr from containerd's own module, without cgo: the
# snapshotters that need it (btrfs, devmapper, zfs) are left out, overlayfs stays.
build_containerd() {
  local out="$BIN/containerd-$CONTAINERD_VERSION" dir="$CACHE/src/containerd-$CONTAINERD_VERSION"
  local want=(containerd containerd-shim-runc-v2 ctr) missing=0
  for b in "${want[@]}"; do [[ -x "$out/$b" ]] || missing=1; done
  [[ $missing == 0 ]] && { log "containerd $CONTAINERD_VERSION cached"; return; }
  log "building containerd $CONTAINERD_VERSION (cold: a few minutes)"
  scratch_module "$dir" github.com/containerd/containerd/v2 "$CONTAINERD_VERSION"
  mkdir -p "$out"
  local v="github.com/containerd/containerd/v2/version"
  for b in "${want[@]}"; do
    (cd "$dir" && go build -trimpath -tags "no_btrfs no_devmapper no_zfs" \
      -ldflags "-s -w -X $v.Version=$CONTAINERD_VERSION" \
      -o "$out/$b.tmp" "github.com/containerd/containerd/v2/cmd/$b")
    mv "$out/$b.tmp" "$out/$b"; log "built $b"
  done
}

# go_install NAME MODULE@VERSION PACKAGE: modules without local replaces.
go_install() {
  local name=$1 modver=$2 pkg=$3 out="$BIN/$1-${2#*@}"
  [[ -x "$out/$name" ]] && { log "$name ${modver#*@} cached"; return; }
  log "building $name ${modver#*@}"
  mkdir -p "$out"
  GOBIN="$out" go install -trimpath -ldflags "-s -w" "$pkg@${modver#*@}"
}

# KWOK ships no default stages; its module holds the node and pod lifecycle
# stages, which are gathered next to the binary as one config file. Node
# heartbeats go through Leases, which KWOK renews often and cheaply, so a
# loaded machine does not let nodes (and then their pods) turn NotReady.
kwok_stages() {
  local out="$BIN/kwok-$KWOK_VERSION/stages-lease.yaml"
  [[ -s "$out" ]] && return
  local src
  src="$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage"
  [[ -d "$src" ]] || go mod download "sigs.k8s.io/kwok@$KWOK_VERSION" >/dev/null 2>&1
  for f in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
    pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
    cat "$src/$f.yaml"; echo "---"
  done >"$out.tmp"
  mv "$out.tmp" "$out"
}

main() {
  mkdir -p "$BIN"
  build_etcd
  go_install kwok "sigs.k8s.io/kwok@$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok
  kwok_stages
  go_install helm "helm.sh/helm/v3@$HELM_VERSION" helm.sh/helm/v3/cmd/helm
  build_kubernetes
  build_containerd
  log "cache: $(du -sh "$CACHE" | cut -f1) in $CACHE"
}
main "$@"
