#!/usr/bin/env bash
# Build the local container image used by the tests and the demo, with no
# registry: a busybox root filesystem (Debian's busybox-static) imported with
# `docker import`. Usage: scripts/build-test-image.sh [IMAGE]  (default gpumarket/busybox:local)
set -euo pipefail
image="${1:-gpumarket/busybox:local}"
busybox="$(command -v busybox || true)"
[ -n "$busybox" ] || { echo "busybox not found: apt-get install busybox-static" >&2; exit 2; }
if docker image inspect "$image" >/dev/null 2>&1; then
  echo "image $image already present"; exit 0
fi
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/bin" "$root/tmp" "$root/proc" "$root/sys" "$root/dev" "$root/etc"
cp "$busybox" "$root/bin/busybox"
for applet in sh sleep echo cat ls env true false date wc; do ln -s busybox "$root/bin/$applet"; done
echo "root:x:0:0:root:/:/bin/sh" > "$root/etc/passwd"
tar -C "$root" -c . | docker import --change 'CMD ["/bin/sh"]' --change 'ENV PATH=/bin' - "$image" >/dev/null
echo "built image $image from $busybox"
