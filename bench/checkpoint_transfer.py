"""Checkpoint transfer time: the runner's upload and restore (providers/runner/checkpoint.py)
against moto's S3 server on 127.0.0.1 (tests/support/s3.py), for checkpoints of a few sizes.

    .venv/bin/python bench/checkpoint_transfer.py [--runs 5] [--sizes-mib 1,16,64]

Each checkpoint is 8 files of random bytes (seeded); each run uploads it (sha256 of every
file, the files, then the manifest) and restores it into a fresh directory (download,
size and sha256 checks, rename into place). Prints p50 and max per size. moto keeps the
objects in its process's memory: a real store adds its network; this measures what the
runner itself spends.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from providers.runner.checkpoint import CheckpointStore
from tests.support import s3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sizes-mib", default="1,16,64")
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes_mib.split(",")]
    print(f"nproc {os.cpu_count()}, load {os.getloadavg()[0]:.2f}, runs {args.runs}, "
          f"sizes {sizes} MiB, 8 files each, moto_server on 127.0.0.1")
    proc, server = s3.start()
    try:
        bucket = server.bucket("bench-ckpt")
        rng = random.Random(1)
        for mib in sizes:
            cfg = {"endpoint_url": server.endpoint_url, "bucket": bucket,
                   "prefix": f"size-{mib}/", "region": "",
                   "access_key_id": server.access_key_id,
                   "secret_access_key": server.secret_access_key,
                   "max_bytes": 1 << 40, "restore": True}
            ups, downs = [], []
            with tempfile.TemporaryDirectory() as tmp:
                src = Path(tmp) / "src"
                src.mkdir()
                for i in range(8):
                    (src / f"shard-{i}.bin").write_bytes(rng.randbytes(mib * 2**20 // 8))
                for run in range(args.runs):
                    t0 = time.perf_counter()
                    CheckpointStore(cfg).upload(src, run, "/workspace/checkpoint")
                    t1 = time.perf_counter()
                    CheckpointStore(cfg).restore(Path(tmp) / f"dest-{run}" / "checkpoint")
                    t2 = time.perf_counter()
                    ups.append(t1 - t0)
                    downs.append(t2 - t1)
            print(f"{mib:>4} MiB  upload p50 {statistics.median(ups):.2f} s max "
                  f"{max(ups):.2f} s  restore p50 {statistics.median(downs):.2f} s max "
                  f"{max(downs):.2f} s")
    finally:
        proc.terminate()
        proc.wait(10)
    print(f"load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
