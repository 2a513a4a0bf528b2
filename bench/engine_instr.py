"""Instructions per event of the order-book contestants (bench/orderbook.py's flows),
counted by valgrind's callgrind: a figure the shared machine's load does not move.

Each flow runs in a fresh ``valgrind --tool=callgrind`` child that loads the pickled
flow and runs the contestants one after the other, each on a fresh book; callgrind
counts only inside each run (``sys.call_tracing`` around it, see ``child``), divided
by the flow's events. ``PYTHONHASHSEED=0`` and GC off make the children repeat exactly. Instructions
are not time (the C++ peer retires more per cycle than the interpreter), so the ratio
to orderly-chaos is a proxy; between two versions of our engine (``--engine-dir``,
a ``git archive`` of ``marketplace/``) it is the load-free A/B.

Run:  .venv/bin/python bench/engine_instr.py [--events 30000] [--seeds 1]
      [--shapes base,narrow,...] [--engines ours,orderly,heap] [--engine-dir DIR]
Needs valgrind (apt) and orderly-chaos (the `bench` extra).
"""

from __future__ import annotations

import argparse
import gc
import os
import pickle
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = {"ours": "ours_ints_run", "submit": "ours_run", "orderly": "orderly_run",
        "heap": "heap_run"}


def child(flow_file: str, engines: str, engine_dir: str) -> None:
    """Inside valgrind: load the flow, then run each contestant through
    ``sys.call_tracing`` (the only caller of ``_PyEval_CallTracing``: callgrind counts
    only inside it and dumps after each)."""
    sys.path.insert(0, engine_dir or str(HERE.parent))
    sys.path.insert(1, str(HERE))
    import orderbook  # noqa: I001 - after the path is set: this engine's marketplace

    import orderly_chaos  # noqa: F401 - imported before any count starts

    with open(flow_file, "rb") as f:
        flow = pickle.load(f)
    gc.disable()
    for engine in engines.split(","):
        _, volume = sys.call_tracing(getattr(orderbook, RUNS[engine]), (flow,))
        print(f"{engine} traded {volume}", file=sys.stderr)


def count(flow_file: str, engines: list[str], engine_dir: str, tmp: str) -> list[int]:
    """Instructions callgrind counted in each contestant's run (one child, in order)."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    out = os.path.join(tmp, "cg.out")
    subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
         "--collect-atstart=no", "--toggle-collect=_PyEval_CallTracing",
         "--dump-after=_PyEval_CallTracing", "--compress-strings=no",
         sys.executable, __file__, "--child", flow_file, ",".join(engines), engine_dir],
        env=env, capture_output=True, text=True, check=True)
    got = []
    for n in range(1, len(engines) + 1):
        with open(f"{out}.{n}") as f:
            m = re.search(r"^(?:summary|totals): (\d+)", f.read(), re.M)
        if m is None:
            raise SystemExit(f"no instruction count in {out}.{n}")
        got.append(int(m.group(1)))
        os.unlink(f"{out}.{n}")
    return got


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:5])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=30_000)
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--shapes", default="base,narrow,wide,deep,cancels,gangs")
    ap.add_argument("--engines", default="ours,orderly,heap")
    ap.add_argument("--engine-dir", default="",
                    help="a folder holding marketplace/ of another commit (default: this)")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    import orderbook

    engines = args.engines.split(",")
    print(f"instructions per event (callgrind), {args.events:,} events per flow "
          f"(deep: 40,000 resting orders first, then as many; all counted), engine: "
          f"{args.engine_dir or 'this checkout'}, load average {os.getloadavg()[0]:.1f}")
    print(f"{'flow':12s} " + " ".join(f"{e:>10s}" for e in engines) + "  orderly / ours")
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes.split(","):
            for seed in (int(s) for s in args.seeds.split(",")):
                n = args.events + (40_000 if shape == "deep" else 0)  # deep: its 40k first
                flow = orderbook.make_flow(n, seed, shape)
                path = os.path.join(tmp, f"{shape}-{seed}.pickle")
                with open(path, "wb") as f:
                    pickle.dump(flow, f)
                got = count(path, engines, args.engine_dir, tmp)
                per = {e: n / len(flow) for e, n in zip(engines, got, strict=True)}
                ratio = (f"  {per['orderly'] / per['ours']:.2f}x"
                         if "orderly" in per and "ours" in per else "")
                print(f"{shape + ' s' + str(seed):12s} "
                      + " ".join(f"{per[e]:10,.0f}" for e in engines) + ratio, flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
