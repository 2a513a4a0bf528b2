#!/usr/bin/env bash
# Build the base image of deploy/docker/*.Dockerfile with no registry: the busybox root
# filesystem of gpumarket/busybox:local (scripts/build-test-image.sh) plus this host's
# python3 (interpreter, standard library, the shared libraries `ldd` lists, at the paths
# they have here) and, in /opt/venv, the files of gpumarket's runtime dependencies only
# (its `dependencies`, recursively, without extras: no test or bench packages) copied
# from the Python that runs this script (PYTHON, default the venv's or python3),
# `docker import`ed. Skipped when the image (of this version) exists.
# Usage: scripts/build-python-base-image.sh [IMAGE]  (default gpumarket/python-base:local)
set -euo pipefail
image="${1:-gpumarket/python-base:local}"
version=1
if [ "$(docker image inspect -f '{{index .Config.Labels "gpumarket.image-version"}}' "$image" 2>/dev/null)" = "$version" ]; then
  echo "image $image already present"; exit 0
fi
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-$( [ -x "$here/../.venv/bin/python" ] && echo "$here/../.venv/bin/python" || echo python3)}"
"$here/build-test-image.sh" gpumarket/busybox:local >/dev/null
py="$("$python" -c 'import os, sys; print(os.path.realpath(sys.executable))')"
stdlib="$("$python" -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')"
purelib="$("$python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
pyver="$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
root="$(mktemp -d)"
trap 'rm -rf "$root"; docker rm -f "gpumarket-pybase-$$" >/dev/null 2>&1 || true' EXIT

docker create --name "gpumarket-pybase-$$" gpumarket/busybox:local >/dev/null
docker export "gpumarket-pybase-$$" | tar -C "$root" -x
rm -f "$root/.dockerenv"

mkdir -p "$root$(dirname "$py")" "$root$stdlib" "$root/usr/local/bin"
cp -L "$py" "$root$py"
tar -C "$stdlib" -c --exclude=./site-packages --exclude=./test --exclude=./idlelib \
  --exclude=./tkinter --exclude=./turtledemo --exclude=./ensurepip . | tar -C "$root$stdlib" -x
ln -sf "$py" "$root/usr/local/bin/python3"
ln -sf "$py" "$root/usr/local/bin/python"

# the runtime dependencies' installed files (importlib.metadata's RECORDs)
site="$root/opt/venv/lib/python$pyver/site-packages"
mkdir -p "$site"
"$python" - "$purelib" > "$root/.files" <<'EOF'
import importlib.metadata as md, sys
from pathlib import Path
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
purelib = Path(sys.argv[1]).resolve()
seen, todo = set(), [("gpumarket", frozenset())]
while todo:
    name, extras = todo.pop()
    if (canonicalize_name(name), extras) in seen:
        continue
    seen.add((canonicalize_name(name), extras))
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        continue
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker and not any(req.marker.evaluate({"extra": e})
                                  for e in (extras or {""})):
            continue
        todo.append((req.name, frozenset(req.extras)))
    if canonicalize_name(name) == "gpumarket":
        continue
    for f in dist.files or []:
        path = Path(dist.locate_file(f)).resolve()
        if path.is_file() and path.is_relative_to(purelib):
            print(path.relative_to(purelib))
EOF
tar -C "$purelib" -c -T "$root/.files" | tar -C "$site" -x
mkdir -p "$root/opt/venv/bin"
ln -sf "$py" "$root/opt/venv/bin/python"
printf 'home = %s\ninclude-system-site-packages = false\nversion = %s\n' \
  "$(dirname "$py")" "$("$python" -c 'import platform; print(platform.python_version())')" \
  > "$root/opt/venv/pyvenv.cfg"

find "$root$(dirname "$py")" "$root$stdlib" "$site" -name '*.so*' -type f > "$root/.so-list"
echo "$root$py" >> "$root/.so-list"
for lib in $(xargs ldd < "$root/.so-list" 2>/dev/null | grep -o '=> /[^ ]*' | cut -c4- | sort -u); do
  case "$lib" in "$root"*) continue ;; esac
  [ -e "$root$lib" ] && continue
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
# the dynamic loader itself (busybox-static needed none)
for ld in /lib64/ld-linux-x86-64.so.2 /lib/ld-linux-aarch64.so.1; do
  [ -e "$ld" ] && [ ! -e "$root$ld" ] && mkdir -p "$root$(dirname "$ld")" && cp -L "$ld" "$root$ld"
done
rm -f "$root/.so-list" "$root/.files"
mkdir -p "$root/tmp" && chmod 1777 "$root/tmp"

tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/opt/venv/bin:/usr/local/bin:/usr/sbin:/usr/bin:/bin' \
  --change 'ENV PYTHONUNBUFFERED=1' --change 'ENV PYTHONDONTWRITEBYTECODE=1' \
  --change "LABEL gpumarket.image-version=$version" - "$image" >/dev/null
echo "built image $image: python $("$py" -c 'import platform; print(platform.python_version())')," \
  "$(du -sh "$site" | cut -f1) of runtime packages"
