"""A registry that stalls mid-pull: how long the runner's puller takes to give up, and what
the buyer reads meanwhile (docs/IMAGES.md, "Stalled pulls").

Setup (not timed): Debian's docker-registry on 127.0.0.1:`--registry-port`
(tests/support/registry.py) holding an image of `--mib` MiB of random bytes in `--layers`
layers, pushed and removed from the local engine. Timed: `providers.runner.pull.Puller`
(`--stall` seconds of stall timeout) pulls it on the local Docker Engine; `--stop-after`
seconds after the first downloaded byte the registry gets SIGSTOP. Printed: the distinct
progress texts, the time from SIGSTOP to the failed state, and the error. The registry
gets SIGCONT, then is stopped; the image is removed.

    .venv/bin/python bench/pull_stall.py [--mib 256] [--layers 4] [--stall 10]
        [--stop-after 2] [--registry-port 25500]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from providers.runner.pull import Puller  # noqa: E402
from tests.support import registry as reg  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--stall", type=float, default=10.0)
    ap.add_argument("--stop-after", type=float, default=2.0)
    ap.add_argument("--registry-port", type=int, default=25500)
    args = ap.parse_args()
    server = reg.start(args.registry_port)
    ref = None
    try:
        t = time.monotonic()
        ref = reg.push_cold(server, f"bench/stall-{uuid.uuid4().hex[:8]}", args.mib,
                            args.layers)
        print(f"built and pushed {ref} ({args.mib} MiB, {args.layers} layers) in "
              f"{time.monotonic() - t:.1f} s; load {os.getloadavg()[0]:.2f}")
        puller = Puller(stall_timeout=args.stall, allow_private_registry=True)  # 127.0.0.1
        stopped_at: list[float] = []
        texts: list[tuple[float, str]] = []

        def stop_later() -> None:
            time.sleep(args.stop_after)
            os.kill(server.proc.pid, signal.SIGSTOP)
            stopped_at.append(time.monotonic())

        def watch_pull(ref_: str, on_message) -> None:
            def watch(msg: dict) -> None:
                on_message(msg)
                if msg.get("status") == "Downloading" and not stopper.is_alive() \
                        and not stopped_at:
                    stopper.start()
            puller.docker_pull(ref_, watch)

        stopper = threading.Thread(target=stop_later, daemon=True)
        puller._pull_fn = watch_pull
        cpu0 = time.process_time()
        state = puller.ensure(ref)
        while state.phase == "pulling":
            text = state.text()
            if not texts or texts[-1][1] != text:
                texts.append((time.monotonic() - state.started, text))
            time.sleep(0.05)
        cpu = time.process_time() - cpu0
        for at, text in texts[:: max(1, len(texts) // 15)]:
            print(f"  {at:6.1f} s  {text.split(': ', 1)[1]}")
        print(f"  final: {state.text().split(': ', 1)[1]}")
        if stopped_at:
            print(f"SIGSTOP at {stopped_at[0] - state.started:.1f} s into the pull; failed "
                  f"{state.ended - stopped_at[0]:.1f} s after it (stall timeout "
                  f"{args.stall:g} s); process CPU {cpu * 1000:.0f} ms; "
                  f"load {os.getloadavg()[0]:.2f}")
        else:
            print(f"the pull ended ({state.phase}) before the registry was stopped")
    finally:
        if server.proc.poll() is None:
            os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()
        if ref:
            reg.remove_local(ref)


if __name__ == "__main__":
    main()
