#!/usr/bin/env bash
# Builds the sandbox's control-plane binaries from the Go module proxy and caches
# them outside the repository. Idempotent: when a cache directory for the current
# pins exists and is complete, it only prints that directory.
#
# Output (last line of stdout): the directory holding etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kube-proxy, kubectl, kwok and helm.
#
# The cache key hashes every input that changes the result (the wrapper modules,
# their mains, the tool pins, the Go version), so changing a pin rebuilds.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${PROXYMODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/proxymode}"

# Pins. The Kubernetes version lives in k8sbin/go.mod; these are the other tools.
KWOK_VERSION=v0.8.0
HELM_MODULE=helm.sh/helm/v3
HELM_VERSION=v3.22.0

k8s_version="$(awk '$1=="k8s.io/kubernetes" && $2 ~ /^v1\./ {print $2} $1=="require" && $2=="k8s.io/kubernetes" {print $3}' "$here/k8sbin/go.mod" | head -1)"
[ -n "$k8s_version" ] || { echo "build-binaries: no k8s.io/kubernetes pin in k8sbin/go.mod" >&2; exit 1; }
minor="${k8s_version#v1.}"; minor="${minor%%.*}"

key="$(
  {
    go version
    echo "kwok=$KWOK_VERSION helm=$HELM_MODULE@$HELM_VERSION"
    find "$here/k8sbin" "$here/etcdbin" -type f \( -name '*.go' -o -name 'go.mod' -o -name 'go.sum' \) \
      -print0 | sort -z | xargs -0 sha256sum | sed "s|$here/||"
    sha256sum < "${BASH_SOURCE[0]}"
  } | sha256sum | cut -c1-16
)"
out="$cache/bin-$k8s_version-$key"
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubectl kwok helm)

complete() {
  local b
  for b in "${binaries[@]}"; do [ -x "$out/$b" ] || return 1; done
}

if complete; then
  echo "$out"
  exit 0
fi

echo "build-binaries: building Kubernetes $k8s_version, etcd, kwok $KWOK_VERSION, helm $HELM_VERSION into $out" >&2
tmp="$out.partial.$$"
rm -rf "$tmp"; mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
export CGO_ENABLED=0

# ldflags make /version report the real release instead of v0.0.0-master.
ld="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld="$ld -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ld="$ld -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
start=$(date +%s)
(cd "$here/k8sbin" && go build -trimpath -ldflags "$ld" -o "$tmp/" ./cmd/...)
(cd "$here/etcdbin" && go build -trimpath -ldflags "-s -w" -o "$tmp/" ./cmd/...)
GOBIN="$tmp" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
GOBIN="$tmp" go install -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
  "$HELM_MODULE/cmd/helm@$HELM_VERSION"

for b in "${binaries[@]}"; do
  [ -x "$tmp/$b" ] || { echo "build-binaries: $b was not produced" >&2; exit 1; }
done
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "build-binaries: done in $(( $(date +%s) - start ))s" >&2
echo "$out"
