"""CPU per bid of `book.place_bids` in process: N groups of G bids (1–2 GPUs, 1 hour, prices
seeded uniform 1.50–2.20 USD, below the bench's ask) on a database that
bench/api_orders.py set up (its buyers), then the feed publisher flushed. Prints this
thread's CPU per bid (place_bids alone) and the process's (with the publisher thread).

Run:  DATABASE_URL=postgres://postgres@127.0.0.1:5432/gpumarket_bench_<x> \\
      .venv/bin/python bench/place_bids_cpu.py [G=4] [N=100]
"""

from __future__ import annotations

import importlib
import os
import random
import sys
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marketplace.settings")


def main() -> None:
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    from marketplace import book

    publisher = importlib.import_module("frontend.feed.publisher")
    buyers = list(get_user_model().objects.filter(username__startswith="bench-buyer-")
                  .values_list("pk", flat=True))
    if not buyers:
        raise SystemExit("no bench buyers: run bench/api_orders.py on this database first")
    g = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    rng = random.Random(7)

    def group() -> list[book.BidRequest]:
        return [book.BidRequest(buyer_id=rng.choice(buyers), market_slug="h100-sxm-80gb",
                                price=rng.randint(150, 220) * 10_000, gpus=rng.choice((1, 2)),
                                duration_seconds=3600) for _ in range(g)]

    book.place_bids(group())  # connection, book cache, account ids: warm
    publisher.flush()
    c0, t0 = time.process_time(), time.thread_time()
    for _ in range(n):
        for r in book.place_bids(group()):
            if isinstance(r, Exception):
                raise SystemExit(f"a bid was refused: {r!r}")
    t1 = time.thread_time()
    publisher.flush()
    c1 = time.process_time()
    print(f"G={g} N={n}: place_bids thread CPU {(t1 - t0) / n / g * 1000:.2f} ms/bid, process "
          f"CPU (with the feed publisher) {(c1 - c0) / n / g * 1000:.2f} ms/bid; load "
          f"{os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
