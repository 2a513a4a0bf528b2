#!/usr/bin/env bash
# Build a real JupyterLab image with no registry: the root filesystem of the local sshd
# image (busybox, sshd; scripts/build-ssh-image.sh) plus this host's python3 (the
# interpreter, its standard library and every shared library `ldd` lists, at the paths
# they have here) and a venv at /opt/jupyter holding `jupyterlab` from PyPI, `docker
# import`ed. The entrypoint makes the sshd host key, then runs its arguments (a
# template's command) or, with none, `jupyter lab --ip=0.0.0.0 --port=8888 --allow-root
# --no-browser`; JupyterLab reads its token from JUPYTER_TOKEN (the lease's secret).
# Skipped when the image (of this version) exists. Usage: scripts/build-jupyter-image.sh [IMAGE]
# (default gpumarket/jupyter:local; JUPYTERLAB_SPEC overrides the pip requirement).
set -euo pipefail
image="${1:-gpumarket/jupyter:local}"
spec="${JUPYTERLAB_SPEC:-jupyterlab>=4.2,<5}"
version=1  # the gpumarket.image-version label: an image of another version is rebuilt
if [ "$(docker image inspect -f '{{index .Config.Labels "gpumarket.image-version"}}' "$image" 2>/dev/null)" = "$version" ]; then
  echo "image $image already present"; exit 0
fi
here="$(cd "$(dirname "$0")" && pwd)"
"$here/build-ssh-image.sh" gpumarket/sshd:local >/dev/null
py="$(python3 -c 'import os, sys; print(os.path.realpath(sys.executable))')"
stdlib="$(python3 -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')"
root="$(mktemp -d)"
trap 'rm -rf "$root"; docker rm -f "gpumarket-jupyter-base-$$" >/dev/null 2>&1 || true' EXIT

# the sshd image's files: busybox, sshd and its config and libraries
docker create --name "gpumarket-jupyter-base-$$" gpumarket/sshd:local >/dev/null
docker export "gpumarket-jupyter-base-$$" | tar -C "$root" -x
rm -f "$root/.dockerenv"

# the interpreter and its standard library, at the same paths (so it finds its prefix)
mkdir -p "$root$(dirname "$py")" "$root$stdlib" "$root/usr/local/bin"
cp -L "$py" "$root$py"
tar -C "$stdlib" -c --exclude=./site-packages --exclude=./test --exclude=./idlelib \
  --exclude=./tkinter --exclude=./turtledemo --exclude=./ensurepip . | tar -C "$root$stdlib" -x
mkdir -p "$root$stdlib/site-packages"
ln -sf "$py" "$root/usr/local/bin/python3"

# JupyterLab in a venv at /opt/jupyter (made here in the root filesystem, then its
# scripts' #! lines point at /opt/jupyter/bin/python, the path it has in the image)
venv="$root/opt/jupyter"
python3 -m venv --without-pip "$venv"
python3 -m pip --python "$venv/bin/python" install --quiet --disable-pip-version-check \
  --no-warn-script-location pip "$spec" 2> >(grep -v "is ignored: it is neither" >&2)
# rfc3987-syntax (via jsonschema[format-nongpl]) builds a Lark grammar at import: about
# 4 s of Jupyter's start on a loaded host; jsonschema checks URIs without it
"$venv/bin/python" -m pip uninstall --quiet --yes --disable-pip-version-check rfc3987-syntax
ln -sf "$py" "$venv/bin/python"
for script in "$venv"/bin/*; do
  [ -f "$script" ] && [ ! -L "$script" ] && head -c 2 "$script" | grep -q '#!' &&
    sed -i "1s|^#!$venv/bin/python[0-9.]*|#!/opt/jupyter/bin/python|" "$script"
done
sed -i "s|$venv|/opt/jupyter|g" "$venv/pyvenv.cfg"

# every shared library the interpreter and the extension modules load, where the
# loader looks for it (wheels' own libraries are already inside the tree)
find "$root$(dirname "$py")" "$root$stdlib" "$venv" -name '*.so*' -type f > "$root/.so-list"
echo "$root$py" >> "$root/.so-list"
for lib in $(xargs ldd < "$root/.so-list" 2>/dev/null | grep -o '=> /[^ ]*' | cut -c4- | sort -u); do
  case "$lib" in "$root"*) continue ;; esac
  [ -e "$root$lib" ] && continue
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
rm -f "$root/.so-list"

cat > "$root/entrypoint" <<'EOF'
#!/bin/sh
# sshd's host key, made per container (a template's command starts sshd itself)
[ -f /etc/ssh/ssh_host_ed25519_key ] || ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key
[ "$#" -gt 0 ] && exec "$@"
exec jupyter lab --ip=0.0.0.0 --port="${JUPYTER_PORT:-8888}" --allow-root --no-browser
EOF
chmod 755 "$root/entrypoint"
mkdir -p "$root/root/work"
tar -C "$root" -c . | docker import \
  --change 'ENTRYPOINT ["/entrypoint"]' --change 'CMD []' \
  --change 'ENV PATH=/opt/jupyter/bin:/usr/local/bin:/usr/sbin:/usr/bin:/bin' \
  --change 'ENV HOME=/root' --change 'ENV PYTHONUNBUFFERED=1' --change 'WORKDIR /root/work' \
  --change 'EXPOSE 8888/tcp' --change 'EXPOSE 22/tcp' \
  --change "LABEL gpumarket.image-version=$version" - "$image" >/dev/null
echo "built image $image: python $("$py" -c 'import platform; print(platform.python_version())')," \
  "$("$venv/bin/python" -m pip list --disable-pip-version-check 2>/dev/null | grep -i '^jupyterlab ' | tr -s ' ')"
