#!/usr/bin/env bash
# Build a real SSH server image with no registry: this host's Debian `openssh-server`
# (sshd, ssh-keygen and the shared libraries `ldd` lists) and busybox in a root
# filesystem, `docker import`ed. The entrypoint makes an ed25519 host key, writes the
# container's environment (the lease's env and secrets) to /root/.ssh/environment, mode
# 0600, which sshd gives every session (PermitUserEnvironment: `ssh … 'echo $MODEL'` sees
# what the workload sees), then runs the container's command when it has one (a
# template's, e.g. cuda-ssh's `sh -c "… exec /usr/sbin/sshd -D -e"`), else
# `sshd -D -e -p 22`; public keys only, reading /etc/gpumarket/authorized_keys and
# /root/.ssh/authorized_keys (the runner bind-mounts both read-only; docs/RUNNER.md). An
# image of an older build (its label gpumarket.sshd-image is not $version) is rebuilt
# under the same name.
# Usage: scripts/build-ssh-image.sh [IMAGE]  (default gpumarket/sshd:local)
set -euo pipefail
image="${1:-gpumarket/sshd:local}"
version=3  # 2: runs a command it is given; 3: sessions get the container's environment
if [ "$(docker image inspect -f '{{index .Config.Labels "gpumarket.sshd-image"}}' "$image" \
      2>/dev/null)" = "$version" ]; then
  echo "image $image already present"; exit 0
fi
if [ ! -x /usr/sbin/sshd ] || ! command -v busybox >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || { echo "needs openssh-server and busybox-static (apt-get install)" >&2; exit 2; }
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    openssh-server busybox-static >/dev/null
fi
busybox="$(command -v busybox)"
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,usr/sbin,usr/bin,tmp,proc,sys,dev,etc/ssh,etc/gpumarket,run/sshd,root/.ssh,var/empty}
chmod 1777 "$root/tmp"; chmod 700 "$root/root" "$root/root/.ssh"; chmod 755 "$root/run/sshd"
cp "$busybox" "$root/bin/busybox"
"$busybox" --list | while read -r applet; do
  [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
done
cp /usr/sbin/sshd "$root/usr/sbin/sshd"
cp /usr/bin/ssh-keygen "$root/usr/bin/ssh-keygen"
# every shared library the two binaries load, at the path the loader looks for it
for lib in $(ldd /usr/sbin/sshd /usr/bin/ssh-keygen | grep -o '/[^ ]*\.so[^ ]*' | sort -u); do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
cat > "$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
sshd:x:100:65534:sshd privilege separation:/run/sshd:/bin/false
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
printf 'root:x:0:\nnogroup:x:65534:\n' > "$root/etc/group"
# "*": no password can match, and the account is not locked ("!"), so keys still work
printf 'root:*:19000:0:99999:7:::\nsshd:*:19000:0:99999:7:::\n' > "$root/etc/shadow"
chmod 600 "$root/etc/shadow"
printf 'passwd: files\ngroup: files\nshadow: files\n' > "$root/etc/nsswitch.conf"
cat > "$root/etc/ssh/sshd_config" <<'EOF'
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
UseDNS no
PrintMotd no
PrintLastLog no
# the runner's read-only mounts (the buyer's keys of this lease), then the image's own
AuthorizedKeysFile /etc/gpumarket/authorized_keys /root/.ssh/authorized_keys
PidFile /run/sshd.pid
# sessions get the container's environment, written by /entrypoint (root-only file)
PermitUserEnvironment yes
EOF
cat > "$root/entrypoint" <<'EOF'
#!/bin/sh
set -e
[ -f /etc/ssh/ssh_host_ed25519_key ] || ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key
# the lease's env and secrets for SSH sessions: NAME=value lines, root-only, never printed
# (a value spanning lines cannot be one such line and is left out)
umask 077
awk 'BEGIN { for (k in ENVIRON) if (k ~ /^[A-Za-z_][A-Za-z0-9_]*$/ &&
             k !~ /^(HOME|PWD|OLDPWD|SHLVL|HOSTNAME|TERM|_)$/ && ENVIRON[k] !~ /\n/)
             print k "=" ENVIRON[k] }' > /root/.ssh/environment.new
chmod 600 /root/.ssh/environment.new
mv -f /root/.ssh/environment.new /root/.ssh/environment
umask 022
# a command (a template's, such as cuda-ssh's) runs as given; none, or options, go to sshd
case "${1:-}" in ""|-*) exec /usr/sbin/sshd -D -e -p "${SSH_PORT:-22}" "$@" ;; esac
exec "$@"
EOF
chmod 755 "$root/entrypoint"
tar -C "$root" -c . | docker import \
  --change 'ENTRYPOINT ["/entrypoint"]' --change 'ENV PATH=/usr/sbin:/usr/bin:/bin' \
  --change 'EXPOSE 22/tcp' --change "LABEL gpumarket.sshd-image=$version" - "$image" >/dev/null
echo "built image $image from $(/usr/sbin/sshd -V 2>&1 | head -1 || true) and $busybox"
