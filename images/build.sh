#!/usr/bin/env bash
# Builds the operator image from ./Dockerfile with podman, on a machine that has neither a
# Docker engine nor a container registry (see docs/install.md, "The image", and
# docs/decisions/0060-local-image-build.md):
#
#   1. base images: stand-ins for python:3.11-slim-bookworm, made with debootstrap from the
#      Debian mirror apt already uses (read from apt's sources list) and `podman import`ed:
#        build   python3 + venv + pip (the Dockerfile's build stage, PYTHON_IMAGE)
#        runtime python3 only, slimmed like Debian's -slim images (RUNTIME_IMAGE)
#      cached under ~/.cache/proxymode/image, made once per machine;
#   2. `podman build --pull=never --network=host` with the host's CA bundle bind-mounted into
#      the RUN steps that reach the package index (nothing of it is left in the image);
#   3. the image exported as an OCI archive.
#
# Idempotent: the image carries a content key of its build inputs (the build context, the
# Dockerfile, the base images) as a label and a tag; when an image with that key is in the
# local store, nothing is built. It changes nothing on the host that it does not put back:
# --network=host means no bridge, no firewall rules and no ip_forward change (checked: the
# script fails if ip_forward changed, and restores it), and --force-rm leaves no containers.
#
# Usage: images/build.sh [--archive PATH | --no-archive] [--quiet]
# Output: the last lines are KEY=VALUE pairs (IMAGE, IMAGE_ID, KEY, SIZE_BYTES, ARCHIVE),
# also written to ~/.cache/proxymode/image/last-build.env for the tools that run the image.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${PROXYMODE_IMAGE_CACHE:-${PROXYMODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/proxymode}/image}
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/pyproject.toml" | head -1)
REPO=${PROXYMODE_IMAGE_REPO:-localhost/proxymode/proxymode-operator}
SUITE=bookworm
# What the stand-ins hold. python:3.11-slim-bookworm has CPython 3.11, pip and
# ca-certificates on debian:bookworm-slim; Debian's own python3 is 3.11 too.
# iptables, nftables and iproute2: what `proxymode verify-node` reads on a node (the
# verification Job runs this image; the Dockerfile installs them on the official base).
BUILD_PACKAGES=python3,python3-venv,python3-pip,python-is-python3,ca-certificates,iptables,nftables,iproute2
# Taken out of the build base to make the runtime base (dpkg --purge, in this order).
RUNTIME_PURGE=(python3-pip python3-venv python3.11-venv python3-setuptools python3-wheel
  python3-pip-whl python3-setuptools-whl)
BASE_REVISION=2 # bump when the way the bases are made changes
HOST_CA=/etc/ssl/certs/ca-certificates.crt

archive="default"
quiet=0
while [ $# -gt 0 ]; do
  case "$1" in
    --archive) archive=$2; shift 2 ;;
    --no-archive) archive=""; shift ;;
    --quiet) quiet=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "images/build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

log() { [ "$quiet" -eq 1 ] || echo "image: $*" >&2; }
die() { echo "image: $*" >&2; exit 1; }

command -v podman >/dev/null || die "podman is missing: run sandbox/install-system-deps.sh"
[ "$(id -u)" -eq 0 ] || die "run as root: the rootfs is made with debootstrap and chroot"

mkdir -p "$CACHE"
# One build at a time on this machine (several worktrees may run their tests at once).
exec 9>"$CACHE/lock"
flock 9
# ---- podman's configuration ---------------------------------------------------------------
# runc: crun fails on this host's hybrid cgroup layout. default_ulimits no higher than the
# host's hard limits, or every container fails to start (podman's default asks for more).
nofile=$(ulimit -Hn)
nproc=$(ulimit -Hu)
[ "$nofile" = unlimited ] && nofile=1048576
pid_max=$(cat /proc/sys/kernel/pid_max)
{ [ "$nproc" = unlimited ] || [ "$nproc" -gt "$pid_max" ]; } && nproc=$pid_max
conf="$CACHE/containers.conf"
cat >"$conf.new" <<CONF
# Written by images/build.sh: podman's settings for building and running proxymode's image.
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
mv "$conf.new" "$conf"
export CONTAINERS_CONF="$conf"

# ---- host state: put back what podman changes ---------------------------------------------
ip_forward_before=$(cat /proc/sys/net/ipv4/ip_forward)
cleanup() {
  local rc=$?
  if [ "$(cat /proc/sys/net/ipv4/ip_forward)" != "$ip_forward_before" ]; then
    echo "$ip_forward_before" >/proc/sys/net/ipv4/ip_forward
    echo "image: net.ipv4.ip_forward had changed; put back to $ip_forward_before" >&2
  fi
  if [ -n "${tmp:-}" ]; then
    # A debootstrap cut short may leave /proc, /sys or /dev mounted in the rootfs: unmount
    # them first, and never let rm cross into another file system.
    awk -v t="$tmp/" 'index($2, t) == 1 {print $2}' /proc/mounts | sort -r |
      xargs -r -n1 umount -l 2>/dev/null || true
    rm -rf --one-file-system "$tmp"
  fi
  exit "$rc"
}
tmp=""
trap cleanup EXIT
tmp=$(mktemp -d "${TMPDIR:-/tmp}/proxymode-image.XXXXXX")

# ---- base images ----------------------------------------------------------------------------
# The mirror apt already uses: the first URI of the main archive in the sources list
# (deb822 .sources files or one-line .list files). Never hard-coded.
debian_mirror() {
  local f uri
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    uri=$(awk '/^URIs:/ {for (i = 2; i <= NF; i++) if ($i !~ /security/) {print $i; exit}}' "$f")
    [ -n "$uri" ] && { echo "$uri"; return; }
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    uri=$(awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) {if ($i !~ /security/) {print $i; exit} else break}}' "$f")
    [ -n "$uri" ] && { echo "$uri"; return; }
  done
  return 1
}

arch=$(dpkg --print-architecture)
base_key=$(printf '%s\n' "$BASE_REVISION" "$SUITE" "$arch" "$BUILD_PACKAGES" "${RUNTIME_PURGE[*]}" |
  sha256sum | cut -c1-12)
BUILD_BASE=localhost/proxymode/python-build:$SUITE-$base_key
RUNTIME_BASE=localhost/proxymode/python-runtime:$SUITE-$base_key
base_dir="$CACHE/base-$base_key"

make_bases() {
  command -v debootstrap >/dev/null || die "debootstrap is missing: run sandbox/install-system-deps.sh"
  local mirror rootfs start
  mirror=$(debian_mirror) || die "no Debian mirror found in apt's sources list"
  mkdir -p "$base_dir"
  rootfs="$tmp/rootfs"
  start=$SECONDS
  log "debootstrap --variant=minbase $SUITE (once per machine, about a minute)"
  debootstrap --variant=minbase --include="$BUILD_PACKAGES" "$SUITE" "$rootfs" "$mirror" \
    >"$tmp/debootstrap.log" 2>&1 || { tail -20 "$tmp/debootstrap.log" >&2; die "debootstrap failed"; }
  # What debian:bookworm-slim leaves out, and nothing of this host: no apt lists or .debs,
  # no sources list naming the mirror, no resolv.conf or hostname from the host.
  slim "$rootfs"
  tar -C "$rootfs" --numeric-owner -cf "$base_dir/build.tar.partial" .
  chroot "$rootfs" dpkg --purge "${RUNTIME_PURGE[@]}" >"$tmp/purge.log" 2>&1 ||
    { cat "$tmp/purge.log" >&2; die "could not make the runtime base"; }
  slim "$rootfs"
  tar -C "$rootfs" --numeric-owner -cf "$base_dir/runtime.tar.partial" .
  mv "$base_dir/build.tar.partial" "$base_dir/build.tar"
  mv "$base_dir/runtime.tar.partial" "$base_dir/runtime.tar"
  rm -rf "$rootfs"
  log "base rootfs made in $((SECONDS - start)) s ($base_dir)"
}

slim() {
  local r=$1
  rm -rf "$r"/var/cache/apt/archives/*.deb "$r"/var/cache/apt/*.bin "$r"/var/lib/apt/lists/* \
    "$r"/var/log/* "$r"/var/cache/debconf/*-old "$r"/var/lib/dpkg/*-old \
    "$r"/usr/share/doc/* "$r"/usr/share/man/* "$r"/usr/share/info/* "$r"/usr/share/locale/* \
    "$r"/tmp/* "$r"/root/.cache
  # The bytecode Debian's postinst compiled stays: with a read-only root nothing can be cached
  # at run time, and every start would compile the standard library again.
  : >"$r/etc/apt/sources.list"
  rm -f "$r"/etc/apt/sources.list.d/* "$r/etc/resolv.conf" "$r/etc/hostname"
  : >"$r/etc/resolv.conf"
}

import_base() {
  local name=$1 tarball=$2
  podman image exists "$name" && return
  log "podman import $name"
  podman import --quiet \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' \
    "$tarball" "$name" >/dev/null
}

if ! podman image exists "$BUILD_BASE" || ! podman image exists "$RUNTIME_BASE"; then
  [ -f "$base_dir/build.tar" ] && [ -f "$base_dir/runtime.tar" ] || make_bases
  import_base "$BUILD_BASE" "$base_dir/build.tar"
  import_base "$RUNTIME_BASE" "$base_dir/runtime.tar"
  # Bases made another way before: their tags and rootfs tarballs go.
  podman images --format '{{.Repository}}:{{.Tag}}' \
    --filter 'reference=localhost/proxymode/python-*' |
    grep -vxF -e "$BUILD_BASE" -e "$RUNTIME_BASE" | xargs -r -n1 podman untag >/dev/null 2>&1 || true
  find "$CACHE" -maxdepth 1 -name 'base-*' -not -name "base-$base_key" -exec rm -rf {} +
fi

# ---- the image --------------------------------------------------------------------------------
# The content key: what goes into the image. The build context is what .dockerignore lets in
# (its `!path` lines), without bytecode; plus the Dockerfile, .dockerignore, this script (its
# build arguments) and the base images.
context_key() {
  local paths
  mapfile -t paths < <(sed -n 's/^!\(.*\)$/\1/p' "$ROOT/.dockerignore" | sed 's:/$::')
  {
    (cd "$ROOT" && find "${paths[@]}" Dockerfile .dockerignore images/build.sh -type f \
      -not -path '*/__pycache__/*' -not -name '*.pyc' -print0 | LC_ALL=C sort -z |
      xargs -0 sha256sum)
    podman image inspect --format '{{.Id}}' "$BUILD_BASE" "$RUNTIME_BASE"
  } | sha256sum | cut -c1-16
}

key=$(context_key)
IMAGE=$REPO:$VERSION
KEYED=$REPO:key-$key
start=$SECONDS
if podman image exists "$KEYED"; then
  log "$KEYED is in the local store: nothing to build"
  podman tag "$KEYED" "$IMAGE"
else
  log "podman build $IMAGE (key $key)"
  build_args=(--pull=never --network=host --force-rm --layers
    --ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc"
    --build-arg "PYTHON_IMAGE=$BUILD_BASE" --build-arg "RUNTIME_IMAGE=$RUNTIME_BASE"
    --label "io.proxymode.build-key=$key" -t "$KEYED" -f "$ROOT/Dockerfile")
  # The RUN steps that reach the package index trust what the host trusts (a proxy's CA may
  # be in it); bind-mounted per RUN, so none of it is in any layer.
  [ -f "$HOST_CA" ] && build_args+=(-v "$HOST_CA:/etc/ssl/certs/ca-certificates.crt:ro")
  if ! podman build "${build_args[@]}" "$ROOT" >"$tmp/build.log" 2>&1; then
    tail -40 "$tmp/build.log" >&2
    die "podman build failed (whole log above, last 40 lines)"
  fi
  log "built in $((SECONDS - start)) s"
  # Older builds of this repository lose their key tag (podman 4.3 keeps only one of several
  # -t, hence the separate tag below); their layers stay as the build cache.
  podman images --format '{{.Repository}}:{{.Tag}}' --filter "reference=$REPO:key-*" |
    grep -vxF "$KEYED" | xargs -r -n1 podman untag >/dev/null 2>&1 || true
  podman tag "$KEYED" "$IMAGE"
  # Then the stage images of older keys, now untagged (each holds a copy of the virtualenv);
  # the layers the current build shares with them stay.
  for id in $(podman images --quiet --filter dangling=true --filter label=io.proxymode.build-key); do
    [ "$(podman image inspect --format '{{index .Labels "io.proxymode.build-key"}}' "$id")" = "$key" ] ||
      podman rmi "$id" >/dev/null 2>&1 || true
  done
fi
image_id=$(podman image inspect --format '{{.Id}}' "$IMAGE")
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")

# ---- the OCI archive -----------------------------------------------------------------------------
# Made once per key in the cache; --archive PATH puts a copy (a hard link when it can) there.
archive_out=""
if [ -n "$archive" ]; then
  mkdir -p "$CACHE/archives"
  cached="$CACHE/archives/proxymode-operator-$VERSION-$key.oci.tar"
  if [ ! -f "$cached" ]; then
    log "podman save --format oci-archive"
    podman save --quiet --format oci-archive -o "$cached.partial" "$IMAGE"
    mv "$cached.partial" "$cached"
    find "$CACHE/archives" -name 'proxymode-operator-*.oci.tar' -not -name "${cached##*/}" -delete
  fi
  archive_out=$cached
  if [ "$archive" != default ]; then
    mkdir -p "$(dirname "$archive")"
    rm -f "$archive"
    ln "$cached" "$archive" 2>/dev/null || cp "$cached" "$archive"
    archive_out=$(cd "$(dirname "$archive")" && pwd)/${archive##*/}
  fi
fi

# ---- what the host looked like before ---------------------------------------------------------
# No container is removed here: the build runs none (--force-rm drops its own), and a
# container of this image that runs now is somebody's (a test worker beside this one runs the
# operator in it while this one finds the image cached).
[ "$(cat /proc/sys/net/ipv4/ip_forward)" = "$ip_forward_before" ] ||
  die "net.ipv4.ip_forward changed during the build (put back): the build must use --network=host"

mb() { awk -v b="$1" 'BEGIN { printf "%.1f MB", b / 1e6 }'; }
log "$IMAGE: $(mb "$size")${archive_out:+, OCI archive $(mb "$(stat -c %s "$archive_out")") at $archive_out}"
{
  echo "IMAGE=$IMAGE"
  echo "IMAGE_ID=$image_id"
  echo "KEY=$key"
  echo "SIZE_BYTES=$size"
  echo "ARCHIVE=$archive_out"
  echo "CONTAINERS_CONF=$CONTAINERS_CONF"
} | tee "$CACHE/last-build.env.new"
mv "$CACHE/last-build.env.new" "$CACHE/last-build.env"
