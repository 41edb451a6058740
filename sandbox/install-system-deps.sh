#!/usr/bin/env bash
# Installs the Debian packages the sandbox and the tests need, when missing:
#   prometheus (prometheus + promtool): the sandbox's Prometheus and PromQL tests;
#   podman, runc, debootstrap: `make image` and tests/image/ (images/build.sh);
#   iproute2, iptables, nftables, curl, prometheus-node-exporter: the real nodes (network
#   namespaces running the real kube-proxy; node_exporter's conntrack collector in each);
#   chromium: the report's charts drawn in a real browser (tests/cli/browser.py).
# Runs apt-get as root (CI and these machines run as root), or through sudo.
set -euo pipefail
need=()
# sbin too: runc, debootstrap, iptables and nft live there, and a non-root PATH may lack it.
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]; }
have promtool || need+=(prometheus)
have podman || need+=(podman)
have runc || need+=(runc)
have debootstrap || need+=(debootstrap)
have ip || need+=(iproute2)
have iptables || need+=(iptables)
have nft || need+=(nftables)
have curl || need+=(curl)
have prometheus-node-exporter || need+=(prometheus-node-exporter)
have chromium || have chromium-browser || need+=(chromium)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install-system-deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# The package's service is not wanted: the sandbox starts its own Prometheus on a free port.
if command -v systemctl >/dev/null 2>&1; then
  $sudo systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
$sudo service prometheus stop >/dev/null 2>&1 || true
# Nor node_exporter's: the sandbox runs one inside each real node's namespace.
if command -v systemctl >/dev/null 2>&1; then
  $sudo systemctl disable --now prometheus-node-exporter >/dev/null 2>&1 || true
fi
$sudo service prometheus-node-exporter stop >/dev/null 2>&1 || true
