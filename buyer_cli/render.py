"""Human output of each command (`--json` prints the API's JSON instead). Money as the API
sends it, shown with 6 decimals ("$2.490000"); durations in hours where they are whole."""

from __future__ import annotations

from datetime import UTC, datetime

from .money import lease_cost, parse_usd, shown, usd

ENDED = ("completed", "failed", "preempted", "cancelled")  # a lease's final statuses


def table(rows: list[list], header: list[str]) -> str:
    """Columns padded to their widest cell; "(none)" for no rows."""
    if not rows:
        return "(none)"
    cells = [[str(c) for c in header]] + [["-" if c is None else str(c) for c in r]
                                          for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in cells)


def parse_usd_or_none(value) -> int | None:
    try:
        return parse_usd(str(value))
    except ValueError:
        return None


def duration(seconds) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    return f"{seconds} s"


NONE = "—"  # no figure: a market without a reference price


def markets(items: list[dict]) -> str:
    def reference(m):
        price = m.get("reference_price")
        return NONE if price in (None, "") or parse_usd_or_none(price) == 0 else shown(price)
    return table([[m.get("slug"), m.get("name"), f"{m.get('memory_gb')} GB", reference(m)]
                  for m in items],
                 ["CLASS", "NAME", "MEMORY", "REFERENCE $/GPU-h"])


def book(data: dict) -> str:
    lines = [f"order book of {data.get('gpu_class')} (USD per GPU-hour)"]
    asks, bids = data.get("asks") or [], data.get("bids") or []
    lines.append("asks:" if asks else "asks: (none)")
    lines += [f"  {shown(a['price'])}  {a['gpus']} GPUs" for a in reversed(asks)]
    lines.append("bids:" if bids else "bids: (none)")
    lines += [f"  {shown(b['price'])}  {b['gpus']} GPUs" for b in bids]
    if data.get("note"):  # a crossed book: why those bids rest
        lines.append(data["note"])
    return "\n".join(lines)


def templates(items: list[dict]) -> str:
    def ports(t):
        return ",".join(f"{p.get('port')}/{p.get('role')}" for p in t.get("ports") or []) or "-"
    return table([[t.get("id"), t.get("title"), t.get("image") or "(your own)", ports(t),
                   t.get("min_cuda") or "-"] for t in items],
                 ["ID", "TITLE", "IMAGE", "PORTS", "MIN CUDA"])


def auctions(items: list[dict]) -> str:
    return table([[a.get("id"), a.get("status"), a.get("gpu_class"), a.get("gpus"),
                   shown(a.get("reserve_price")), a.get("rule"),
                   duration(a.get("duration_seconds")), a.get("bid_count"),
                   a.get("closes_at"), shown(a.get("clearing_price"))] for a in items],
                 ["ID", "STATUS", "CLASS", "GPUS", "RESERVE", "RULE", "FOR", "BIDS",
                  "CLOSES", "CLEARING"])


def orders(items: list[dict]) -> str:
    return table([[o.get("id"), o.get("side"), o.get("status"), o.get("gpu_class"),
                   shown(o.get("price")), f"{o.get('remaining_gpus')}/{o.get('gpus')}",
                   duration(o.get("duration_seconds")) if o.get("side") == "bid" else "-",
                   o.get("created_at")] for o in items],
                 ["ID", "SIDE", "STATUS", "CLASS", "PRICE", "LEFT/GPUS", "FOR", "CREATED"])


def order_placed(o: dict, leases: list[dict] | None = None) -> str:
    """The order; its leases (`leases`: their GET answers, else the ids of `o`) at the
    prices they trade at — a fill's price, the ask's, may be below the bid's."""
    ids = o.get("leases") or []
    found = {le.get("id"): le for le in leases or []}
    each = [f"{i} at {shown(found[i].get('price'))}/GPU-h" if i in found else str(i)
            for i in ids]
    won = (f"; lease{'s' if len(ids) > 1 else ''} {', '.join(each)} "
           f"(`gpumarket wait {ids[0]}`)" if ids else "")
    return (f"order {o.get('id')}: {o.get('status')}, {o.get('gpus')} × {o.get('gpu_class')} "
            f"bid at {shown(o.get('price'))}/GPU-h for "
            f"{duration(o.get('duration_seconds'))}, {o.get('remaining_gpus')} GPUs left to "
            f"fill{won}")


def sealed_bid(b: dict) -> str:
    """A sealed bid; once won, the GPUs awarded, the price it pays and its lease; in the
    answer to placing it, the earlier bid it replaced."""
    line = (f"sealed bid {b.get('id')} on auction {b.get('auction')}: {b.get('status')}, "
            f"{b.get('gpus')} GPUs at {shown(b.get('price'))}/GPU-h")
    if b.get("status") == "won":
        line += (f"; won {b.get('awarded_gpus')} GPUs, paying "
                 f"{shown(b.get('paid_price'))}/GPU-h")
        if b.get("lease") is not None:
            line += f": lease {b['lease']} (`gpumarket wait {b['lease']}`)"
    if b.get("replaced"):
        line += f"; it replaces sealed bid {b['replaced']}"
    return line


def leases(items: list[dict]) -> str:
    return table([[le.get("id"), le.get("status"), le.get("gpu_class"), le.get("gpu_count"),
                   shown(le.get("price")), duration(le.get("duration_seconds")),
                   le.get("started_at"), le.get("ended_at") or le.get("ends_at"),
                   shown(le.get("cost"))] for le in items],
                 ["ID", "STATUS", "CLASS", "GPUS", "PRICE", "FOR", "STARTED", "ENDS", "COST"])


def connect_lines(lease: dict) -> list[str]:
    """How to reach the lease: `connect` (ssh, jupyter, http) when the API gives it, else
    the raw endpoints."""
    connect = lease.get("connect") or {}
    lines = []
    if connect.get("ssh"):
        lines.append(f"ssh:      {connect['ssh']}   (or `gpumarket ssh {lease.get('id')}`)")
    if connect.get("jupyter"):
        lines.append(f"jupyter:  {connect['jupyter']}")
    lines += [f"http:     {u}" for u in connect.get("http") or []]
    if not lines:
        lines = [f"port {e.get('container_port')}: {e.get('address')}"
                 for e in lease.get("endpoints") or []]
    return lines


def lease(le: dict, now: datetime | None = None) -> str:
    lines = [f"lease {le.get('id')}: {le.get('status')}"
             + (f" ({le['cause']})" if le.get("cause") else ""),
             f"GPUs:     {le.get('gpu_count')} × {le.get('gpu_class')} on node {le.get('node')}"
             + (" (interruptible)" if le.get("interruptible") else ""),
             f"price:    {shown(le.get('price'))}/GPU-h for "
             f"{duration(le.get('duration_seconds'))}",
             f"image:    {le.get('image') or '-'}"
             + (f" (template {le['template']})" if le.get("template") else "")]
    if le.get("env"):
        lines.append("env:      " + " ".join(f"{k}={v}" for k, v in sorted(le["env"].items())))
    if le.get("secret_names"):
        lines.append("secrets:  " + ", ".join(le["secret_names"]) + " (values never shown)")
    lines.append(f"started:  {le.get('started_at') or '-'}; ends {le.get('ends_at') or '-'}"
                 + (f"; ended {le['ended_at']}" if le.get("ended_at") else ""))
    lines.append(f"cost:     {shown(le.get('cost'))}" + _so_far(le, now or datetime.now(UTC))
                 + _split(le))
    lines += connect_lines(le)
    return "\n".join(lines)


def _split(le: dict) -> str:
    """For an ended lease: who got its charge, " (provider $X, platform $Y)"; "" when the
    answer does not say."""
    if le.get("ended_at") is None or le.get("provider_amount") is None:
        return ""
    return (f" (provider {shown(le['provider_amount'])}, platform "
            f"{shown(le.get('platform_fee'))})")


def _so_far(le: dict, now: datetime) -> str:
    """For a running lease: the cost of the seconds so far at its price (the billing rule,
    money.lease_cost) and the time left; "" otherwise."""
    try:
        started = datetime.fromisoformat(le["started_at"])
        used = max(0, int((now - started).total_seconds()))
        so_far = lease_cost(parse_usd(le["price"]), int(le["gpu_count"]), used)
        left = max(0, int((datetime.fromisoformat(le["ends_at"]) - now).total_seconds()))
    except (KeyError, TypeError, ValueError):
        return ""
    if le.get("status") != "running":
        return ""
    return f" (running: ${usd(so_far)} for {used} s so far, {left} s left)"


def wallet(w: dict) -> str:
    lines = [f"available: {shown(w.get('available'))}", f"held:      {shown(w.get('held'))}",
             f"earned:    {shown(w.get('earned'))}"]
    holds = w.get("holds") or []
    if holds:
        lines.append("holds:")
        lines += [f"  {_hold(h)}" for h in holds]
    return "\n".join(lines)


def _hold(h: dict) -> str:
    return (f"hold {h.get('id')} ({h.get('reference')}): {shown(h.get('amount'))} held of "
            f"{shown(h.get('original'))}")


def ssh_keys(items: list[dict]) -> str:
    return table([[k.get("id"), k.get("name"), k.get("type"), k.get("fingerprint"),
                   k.get("created_at")] for k in items],
                 ["ID", "NAME", "TYPE", "FINGERPRINT", "ADDED"])


def _last(values: list):
    return next((v for v in reversed(values) if v is not None), None)


def metrics(body: dict) -> str:
    """GET /leases/<id>/metrics/: a row per GPU (latest bucket; the range's mean and peak
    utilisation), then the idle line."""
    rows = []
    for g in body.get("gpus", []):
        util = [v for v in g["utilization_pct"] if v is not None]
        reasons = _last(g["throttle_reasons"]) or []
        rows.append([g["uuid"], (g["at"] or [None])[-1], _last(g["utilization_pct"]),
                     round(sum(util) / len(util), 1) if util else None,
                     max(util) if util else None, _last(g["fb_used_mib"]), _last(g["power_w"]),
                     _last(g["temperature_c"]), _last(g["sm_clock_mhz"]),
                     _last(g["mem_clock_mhz"]), ",".join(reasons) or "none"])
    lines = [f"lease {body['lease']}: {body['range']} in {body['resolution_seconds']} s "
             "buckets",
             table(rows, ["GPU", "LAST AT", "UTIL %", "MEAN %", "PEAK %", "MEM MiB", "POWER W",
                          "TEMP C", "SM MHz", "MEM MHz", "THROTTLE"])]
    idle = body.get("idle") or {}
    if idle.get("idle"):
        lines.append(f"idle: {idle['text']}")
    elif not rows:
        lines.append("no readings yet (the lease is not running, or its runner sent none)")
    return "\n".join(lines)
