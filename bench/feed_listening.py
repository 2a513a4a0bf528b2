"""What asking "who listens on /ws/me/?" costs the feed's publisher as /ws/me/ users grow:
PUBSUB CHANNELS of every user channel (what the publisher asked before issue 17) against
PUBSUB NUMSUB of a batch's 5 users (what it asks now: counters.listening_among).

    .venv/bin/python bench/feed_listening.py --redis redis://127.0.0.1:6379/11

Subscribes N channels named like channels_redis' user groups (under a prefix of its own,
so that no deployment's count changes) on one connection, then times 50 calls of each.
"""

from __future__ import annotations

import argparse
import time

import redis


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/5")
    parser.add_argument("--users", default="100,1000,2500,10000")
    args = parser.parse_args()
    r = redis.Redis.from_url(args.redis)
    print(f"load average {open('/proc/loadavg').read().split()[:3]}")  # noqa: SIM115
    for n in (int(v) for v in args.users.split(",")):
        ps = r.pubsub()
        names = [f"fleetprobe__group__user.{i}" for i in range(n)]
        for i in range(0, n, 500):
            ps.subscribe(*names[i:i + 500])
        while ps.get_message(timeout=0.01):
            pass
        timed = []
        for call in (lambda: r.pubsub_channels("fleetprobe__group__user.*"),
                     lambda few=names[:5]: r.pubsub_numsub(*few)):
            t, c = time.perf_counter(), time.process_time()
            for _ in range(50):
                call()
            timed.append(((time.perf_counter() - t) / 50, (time.process_time() - c) / 50))
        (w1, c1), (w2, c2) = timed
        print(f"{n} users listening: PUBSUB CHANNELS {w1 * 1e3:.2f} ms ({c1 * 1e3:.2f} ms "
              f"client CPU); NUMSUB of 5: {w2 * 1e3:.3f} ms ({c2 * 1e3:.3f} ms CPU)")
        ps.close()


if __name__ == "__main__":
    main()
