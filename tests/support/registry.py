"""A real image registry for the cold-start tests and bench/cold_start.py: Debian's
`docker-registry` (distribution 2.8) serving a temporary directory on 127.0.0.1 (dockerd
takes registries on 127.0.0.0/8 as insecure-allowed: plain HTTP, no TLS to set up), and
images of chosen size: push_random writes a busybox layer and layers of random bytes
(incompressible, so the pull moves every byte) straight through the registry's HTTP API
(seconds a GiB); build_image + `docker push` is the slower path through the engine
(`docker import` of a busybox root filesystem, `docker build --network none` for more
layers; ~4 MiB/s pushes here). Either way the image is not in the local engine afterwards,
so the next pull is cold.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

CONFIG = """version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
"""


def registry_binary() -> str | None:
    return shutil.which("docker-registry") or shutil.which("registry")


@dataclass
class Registry:
    """A running registry: `host` ("127.0.0.1:PORT"), its process and storage root."""

    host: str
    proc: subprocess.Popen
    root: Path

    def ref(self, name: str, tag: str = "1") -> str:
        return f"{self.host}/{name}:{tag}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.root, ignore_errors=True)


def start(port: int | None = None) -> Registry:
    """Start docker-registry on 127.0.0.1 (`port`, else a free one) over a fresh temporary
    directory; RuntimeError when it does not answer /v2/ within 20 s."""
    binary = registry_binary()
    if binary is None:
        raise RuntimeError("docker-registry not installed (apt-get install docker-registry)")
    if port is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    root = Path(tempfile.mkdtemp(prefix="gm-registry-"))
    (root / "config.yml").write_text(CONFIG.format(root=root / "data", port=port))
    proc = subprocess.Popen([binary, "serve", str(root / "config.yml")],
                            stdout=subprocess.DEVNULL, stderr=open(root / "log", "w"))  # noqa: SIM115
    registry = Registry(f"127.0.0.1:{port}", proc, root)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"docker-registry exited: {(root / 'log').read_text()[-500:]}")
        with contextlib.suppress(OSError), \
                urllib.request.urlopen(f"http://{registry.host}/v2/", timeout=1) as answer:
            if answer.status == 200:
                return registry
        time.sleep(0.1)
    registry.stop()
    raise RuntimeError("docker-registry did not answer /v2/ in 20 s")


def _random_file(path: Path, mib: int) -> None:
    with open(path, "wb") as out:
        for _ in range(mib):
            out.write(os.urandom(1 << 20))


def build_image(ref: str, mib: int, layers: int = 1) -> None:
    """Build `ref` locally: busybox plus `mib` MiB of random bytes spread over `layers`
    layers (the first by `docker import`, the others by `docker build`)."""
    busybox = shutil.which("busybox")
    if busybox is None:
        raise RuntimeError("busybox not found: apt-get install busybox-static")
    per = max(1, mib // max(1, layers))
    with tempfile.TemporaryDirectory(prefix="gm-image-") as tmp:
        root = Path(tmp) / "root"
        (root / "bin").mkdir(parents=True)
        for d in ("tmp", "proc", "sys", "dev", "etc", "data"):
            (root / d).mkdir()
        shutil.copy(busybox, root / "bin" / "busybox")
        for applet in ("sh", "sleep", "echo", "cat", "ls", "true"):
            (root / "bin" / applet).symlink_to("busybox")
        (root / "etc" / "passwd").write_text("root:x:0:0:root:/:/bin/sh\n")
        _random_file(root / "data" / "layer-0", per)
        base = ref if layers == 1 else f"gm-build-{uuid.uuid4().hex[:12]}:base"
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(["docker", "import", "--change", 'CMD ["/bin/sh"]', "--change",
                        "ENV PATH=/bin", "-", base], stdin=tar.stdout, check=True,
                       stdout=subprocess.DEVNULL)
        tar.wait()
        if layers == 1:
            return
        ctx = Path(tmp) / "ctx"
        ctx.mkdir()
        lines = [f"FROM {base}"]
        for i in range(1, layers):
            _random_file(ctx / f"layer-{i}", per)
            lines.append(f"COPY layer-{i} /data/layer-{i}")
        (ctx / "Dockerfile").write_text("\n".join(lines) + "\n")
        subprocess.run(["docker", "build", "-q", "--network", "none", "-t", ref, str(ctx)],
                       check=True, stdout=subprocess.DEVNULL, env={**os.environ,
                                                                 "DOCKER_BUILDKIT": "0"})
        subprocess.run(["docker", "rmi", base], check=False, capture_output=True)


def push_cold(registry: Registry, name: str, mib: int, layers: int = 1,
              tag: str = "1") -> str:
    """An image of `mib` MiB in `layers` layers in `registry` and not in the local engine
    (the next pull is cold): push_random, the registry's own API. Returns its reference."""
    ref = push_random(registry, name, mib, layers, tag)
    remove_local(ref)  # (a previous test's pull of the same name)
    return ref


def _layer_tar(path: Path, files: list[tuple[str, Path | None, str]]) -> tuple[str, int]:
    """Write an uncompressed layer tar of `files` (name, source file or None for a directory,
    symlink target or ""); return (sha256 hex digest, size in bytes)."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, source, link in files:
            info = tarfile.TarInfo(name)
            info.mtime = 0
            if link:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            elif source is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = source.stat().st_size, 0o755
                with open(source, "rb") as data:
                    tar.addfile(info, data)
    digest = hashlib.sha256()
    with open(path, "rb") as data:
        while chunk := data.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest(), path.stat().st_size


def _put_blob(registry: Registry, name: str, path: Path | None, body: bytes = b"",
              digest: str = "") -> None:
    """Monolithic blob upload (registry HTTP API v2: POST then PUT ?digest=)."""
    start = urllib.request.Request(f"http://{registry.host}/v2/{name}/blobs/uploads/",
                                   method="POST", data=b"")
    with urllib.request.urlopen(start, timeout=30) as answer:
        location = answer.headers["Location"]
    if location.startswith("/"):
        location = f"http://{registry.host}{location}"
    url = f"{location}{'&' if '?' in location else '?'}digest=sha256:{digest}"
    size = path.stat().st_size if path is not None else len(body)
    with (open(path, "rb") if path is not None else contextlib.nullcontext(body)) as data:
        put = urllib.request.Request(url, method="PUT", data=data, headers={
            "Content-Type": "application/octet-stream", "Content-Length": str(size)})
        with urllib.request.urlopen(put, timeout=600) as answer:
            if answer.status != 201:
                raise RuntimeError(f"blob upload answered {answer.status}")


def push_random(registry: Registry, name: str, mib: int, layers: int = 1,
                tag: str = "1") -> str:
    """Write an image straight into `registry` through its HTTP API (no docker build or
    push: about disk speed): `layers` layers sharing `mib` MiB of random bytes
    (/data/layer-I), the first with busybox, as build_image; an OCI manifest. Nothing
    lands in the local engine, so the next pull is cold. Returns its reference."""
    busybox = shutil.which("busybox")
    if busybox is None:
        raise RuntimeError("busybox not found: apt-get install busybox-static")
    per = max(1, mib // max(1, layers))
    with tempfile.TemporaryDirectory(prefix="gm-push-") as tmp:
        work = Path(tmp)
        passwd = work / "passwd"
        passwd.write_text("root:x:0:0:root:/:/bin/sh\n")
        base = [(d, None, "") for d in ("bin", "tmp", "proc", "sys", "dev", "etc", "data")]
        base += [("bin/busybox", Path(busybox), ""), ("etc/passwd", passwd, "")]
        base += [(f"bin/{a}", None, "busybox") for a in ("sh", "sleep", "echo", "cat", "ls",
                                                         "true", "wc")]
        plan = [[*base, ("data/layer-0", work / "random-0", "")]]
        plan += [[(f"data/layer-{i}", work / f"random-{i}", "")] for i in range(1, layers)]
        blobs = []
        for i, files in enumerate(plan):
            _random_file(work / f"random-{i}", per)
            tar = work / f"layer-{i}.tar"
            digest, size = _layer_tar(tar, files)
            (work / f"random-{i}").unlink()
            _put_blob(registry, name, tar, digest=digest)
            tar.unlink()
            blobs.append((digest, size))
        config = json.dumps({
            "architecture": "amd64", "os": "linux",
            "config": {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"]},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{d}" for d, _ in blobs]},
        }).encode()
        config_digest = hashlib.sha256(config).hexdigest()
        _put_blob(registry, name, None, config, config_digest)
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": f"sha256:{config_digest}", "size": len(config)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                        "digest": f"sha256:{d}", "size": n} for d, n in blobs],
        }).encode()
        put = urllib.request.Request(
            f"http://{registry.host}/v2/{name}/manifests/{tag}", method="PUT", data=manifest,
            headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
        with urllib.request.urlopen(put, timeout=30) as answer:
            if answer.status != 201:
                raise RuntimeError(f"manifest upload answered {answer.status}")
    return registry.ref(name, tag)


def remove_local(ref: str) -> None:
    """Remove `ref` from the local engine, with the containers made from it (only ever
    this module's own test images); no error when it is not there."""
    found = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", ref],
                           capture_output=True, text=True)
    image_id = found.stdout.strip() if found.returncode == 0 else ""
    if image_id:
        users = subprocess.run(["docker", "ps", "-aq", "--filter", f"ancestor={image_id}"],
                               capture_output=True, text=True).stdout.split()
        if users:
            subprocess.run(["docker", "rm", "-f", *users], check=False, capture_output=True)
    subprocess.run(["docker", "rmi", "-f", image_id or ref], check=False,
                   capture_output=True)
