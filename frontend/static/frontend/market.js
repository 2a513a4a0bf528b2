/* Market page: depth chart (Chart.js, vendored), depth table, last trades, the offers
 * table, the price history chart, the hold preview of the bid form, and live updates
 * (/ws/markets/<slug>/ or the REST API). What the charts draw is in GM.depthChart and
 * GM.historyChart, for a reader (tests). */
(function () {
  "use strict";
  var slug = document.getElementById("market-js").dataset.market;
  var depth = JSON.parse(document.getElementById("depth-data").textContent);
  var trades = JSON.parse(document.getElementById("trades-data").textContent);
  var history = JSON.parse(document.getElementById("history-data").textContent);
  var chart = null, historyChart = null;

  /* The standard depth chart, as the corners of a step line (drawn straight, so what is
   * exposed is what is drawn): bids cumulative at or above each price (stepping down as
   * the price rises), asks at or below (stepping up). `levels` are [price, gpus], best
   * first (bids high → low, asks low → high), as book.depth gives them. */
  function steps(levels, side) {
    var pts = [], sum = 0;
    levels.forEach(function (l) {
      var x = Number(l[0]);
      if (pts.length) pts.push({x: x, y: sum});  // flat from the better level to this one
      sum += l[1];
      pts.push({x: x, y: sum});
    });
    return side === "bids" ? pts.reverse() : pts;
  }

  function drawChart() {
    var canvas = document.getElementById("depth-chart");
    var bids = steps(depth.bids, "bids"), asks = steps(depth.asks, "asks");
    // extend each side flat past its last level, so even one level draws as an area
    var prices = bids.concat(asks).map(function (p) { return p.x; });
    if (prices.length) {
      var lo = Math.min.apply(null, prices), hi = Math.max.apply(null, prices);
      var pad = Math.max((hi - lo) * 0.15, lo * 0.05, 0.01);
      if (bids.length) bids.unshift({x: bids[0].x - pad, y: bids[0].y});
      if (asks.length) asks.push({x: asks[asks.length - 1].x + pad, y: asks[asks.length - 1].y});
    }
    // what the chart draws, for a reader (tests/e2e/test_browser_market_offers.py)
    GM.depthChart = {bids: bids, asks: asks};
    if (!canvas || typeof Chart === "undefined") return;
    if (chart) {
      chart.data.datasets[0].data = bids;
      chart.data.datasets[1].data = asks;
      chart.update("none");
      return;
    }
    chart = new Chart(canvas, {
      type: "line",
      data: {datasets: [
        {label: "bids (GPUs at or above price)", data: bids, fill: "origin",
         borderColor: "#1a7f37", backgroundColor: "rgba(26,127,55,0.18)", pointRadius: 2},
        {label: "asks (GPUs at or below price)", data: asks, fill: "origin",
         borderColor: "#cf222e", backgroundColor: "rgba(207,34,46,0.15)", pointRadius: 2}
      ]},
      options: {
        animation: false, maintainAspectRatio: false, parsing: false,
        scales: {
          x: {type: "linear", title: {display: true, text: "USD per GPU-hour"}},
          y: {beginAtZero: true, title: {display: true, text: "GPUs (cumulative)"}, ticks: {precision: 0}}
        },
        plugins: {tooltip: {callbacks: {label: function (c) {
          return c.dataset.label.split(" ")[0] + ": " + c.parsed.y + " GPUs at $" + c.parsed.x; }}}}
      }
    });
  }

  function cell(text, num) {
    var td = document.createElement("td");
    if (num) td.className = "num";
    td.textContent = text;
    return td;
  }

  function drawDepth() {
    var body = document.getElementById("depth-rows");
    var rows = Math.max(depth.bids.length, depth.asks.length);
    var frag = document.createDocumentFragment();
    for (var i = 0; i < rows; i++) {
      var b = depth.bids[i], a = depth.asks[i], tr = document.createElement("tr");
      tr.appendChild(cell(b ? b[1] : "", true));
      tr.appendChild(cell(b ? GM.usd(b[0]) : "", true));
      tr.appendChild(cell(a ? GM.usd(a[0]) : "", true));
      tr.appendChild(cell(a ? a[1] : "", true));
      frag.appendChild(tr);
    }
    if (!rows) {
      var tr0 = document.createElement("tr"), td = cell("The order book is empty.");
      td.colSpan = 4; td.className = "empty"; tr0.appendChild(td); frag.appendChild(tr0);
    }
    body.replaceChildren(frag);
    GM.text("best-bid", depth.bids.length ? GM.price(depth.bids[0][0]) : "—");
    GM.text("best-ask", depth.asks.length ? GM.price(depth.asks[0][0]) : "—");
    drawChart();
  }

  function drawTrades() {
    var body = document.getElementById("trade-rows");
    var frag = document.createDocumentFragment();
    trades.slice(0, 20).forEach(function (t) {
      var tr = document.createElement("tr");
      tr.appendChild(cell("#" + t.id));
      tr.appendChild(cell(t.gpus, true));
      tr.appendChild(cell(GM.usd(t.price), true));
      tr.appendChild(cell(String(t.at).replace("T", " ").slice(0, 19)));
      frag.appendChild(tr);
    });
    body.replaceChildren(frag);
    document.getElementById("no-trades").hidden = trades.length > 0;
  }

  function addTrade(t) {
    if (trades.some(function (x) { return x.id === t.id; })) return;
    trades.unshift({id: t.id, price: t.price, gpus: t.gpus, at: t.at});
    trades.sort(function (x, y) { return y.id - x.id; });
  }

  /* Offers: the rows the page's query selected; refreshed from the API with the same
   * query (offers filters and sort from the address bar) whenever the book changes. */
  var OFFER_KEYS = ["min_gpus", "max_price", "min_cuda", "min_tflops", "provider", "sort",
                    "image"];
  function offerQuery() {
    var here = new URLSearchParams(location.search), q = new URLSearchParams();
    OFFER_KEYS.forEach(function (k) { if (here.get(k)) q.set(k, here.get(k)); });
    return q;
  }
  function decimalText(v) { return v === null || v === undefined ? "—" : String(v); }
  function offerView(r) {
    return {ask: r.ask, node_id: r.node.id, node: r.node.name, provider: r.provider,
            measured: decimalText(r.measured_tflops), datasheet: decimalText(r.datasheet_tflops),
            reliability: r.reliability === null ? "new" : String(r.reliability),
            driver: r.driver_version || "—",
            cuda: r.cuda_version || "—", interconnect: r.summary || "—",
            gpus_free: r.gpus_free, price: GM.price(r.price), image_cached: !!r.image_cached,
            until: String(r.available_until).replace("T", " ").slice(0, 16) + " UTC",
            maintenance: (r.maintenance || []).map(function (w) {
              return utc(w.starts_at) + " – " + utc(w.ends_at) + " UTC"; }).join("; ")};
  }
  function utc(iso) { return String(iso).replace("T", " ").slice(0, 16); }
  function maintenanceNote(cellTd, text) {
    if (!text) return;
    var div = document.createElement("div");
    div.className = "offer-maintenance muted"; div.textContent = "maintenance " + text;
    cellTd.appendChild(div);
  }
  function rel(text) { var td = cell(text, true); td.className = "num offer-reliability"; return td; }
  function drawOffers(rows) {
    var body = document.getElementById("offer-rows");
    if (!body) return;
    var frag = document.createDocumentFragment();
    rows.forEach(function (o) {
      var tr = document.createElement("tr");
      tr.dataset.node = o.node_id; tr.dataset.ask = o.ask;
      var node = cell(o.node); node.className = "offer-node"; node.title = o.node;
      if (o.image_cached) {
        var cached = document.createElement("div");
        cached.className = "offer-cached"; cached.textContent = "image cached";
        node.appendChild(cached);
      }
      maintenanceNote(node, o.maintenance);
      var prov = cell(o.provider); prov.title = o.provider;
      [node, prov, cell(o.measured + " / " + o.datasheet, true), rel(o.reliability),
       cell(o.driver + " / " + o.cuda), cell(o.interconnect), cell(o.gpus_free, true),
       cell(o.price, true), cell(o.until)].forEach(function (td) { tr.appendChild(td); });
      var td = document.createElement("td"), a = document.createElement("a");
      var q = offerQuery(); q.set("node", o.node_id);  // the filters stay as they are
      a.className = "bid-node"; a.href = "?" + q.toString() + "#bid-h";
      a.textContent = "Bid for this node"; td.appendChild(a); tr.appendChild(td);
      frag.appendChild(tr);
    });
    body.replaceChildren(frag);
    var empty = document.getElementById("no-offers");
    if (empty) {
      empty.hidden = rows.length > 0;
      var filtered = OFFER_KEYS.some(function (k) { return k !== "sort" && offerQuery().get(k); });
      if (!rows.length) empty.textContent = filtered ? "No offer matches these filters."
        : "No GPUs offered right now.";
    }
    GM.offers = rows;
  }
  var offersTimer = null;
  function refreshOffers() {
    if (offersTimer || document.getElementById("offer-filter-error")) return;
    offersTimer = setTimeout(function () {
      offersTimer = null;
      GM.getJSON("/api/v1/gpu-classes/" + slug + "/offers/?" + offerQuery().toString())
        .then(function (d) {
          drawOffers(d.results.map(offerView));
          var note = document.getElementById("image-note");
          if (note) { note.textContent = d.image_note || ""; note.hidden = !d.image_note; }
        })
        .catch(function (e) { console.warn("offers refresh failed:", e.message); });
    }, 150);
  }

  /* Price history: per bucket the high–low range (a floating bar), the close (a line)
   * and the volume in GPU-hours (bars on the right axis); x is time in UTC. */
  function two(n) { return (n < 10 ? "0" : "") + n; }
  function timeLabel(ms) {
    var d = new Date(ms), hm = two(d.getUTCHours()) + ":" + two(d.getUTCMinutes());
    return history.range === "7d" ? two(d.getUTCMonth() + 1) + "-" + two(d.getUTCDate()) + " " + hm : hm;
  }
  function drawHistory() {
    var ranges = [], closes = [], volume = [];
    history.buckets.forEach(function (b) {
      var mid = b.t + history.bucket_seconds * 500;
      closes.push({x: mid, y: b.close === null ? null : Number(b.close)});
      if (b.low !== null) ranges.push({x: mid, y: [Number(b.low), Number(b.high)]});
      volume.push({x: mid, y: Number(b.gpu_hours)});
    });
    GM.historyChart = {range: history.range, bucket_seconds: history.bucket_seconds,
                       buckets: history.buckets, closes: closes, ranges: ranges, volume: volume};
    var traded = history.buckets.some(function (b) { return b.trades > 0; });
    var none = document.getElementById("no-history");
    if (none) none.hidden = traded;
    var canvas = document.getElementById("history-chart");
    if (!canvas || typeof Chart === "undefined") return;
    if (historyChart) {
      historyChart.data.datasets[0].data = ranges;
      historyChart.data.datasets[1].data = closes;
      historyChart.data.datasets[2].data = volume;
      historyChart.update("none");
      return;
    }
    var first = history.buckets[0].t, last = history.buckets[history.buckets.length - 1].t +
      history.bucket_seconds * 1000;
    historyChart = new Chart(canvas, {
      data: {datasets: [
        {type: "bar", label: "high–low (USD/GPU-h)", data: ranges, yAxisID: "y",
         backgroundColor: "rgba(9,105,218,0.35)", borderColor: "#0969da", borderWidth: 1,
         barPercentage: 0.8, categoryPercentage: 1, minBarLength: 3,  // one price: a tick
         parsing: {xAxisKey: "x", yAxisKey: "y"}},  // (floating [low, high] bars are parsed)
        {type: "line", label: "close (USD/GPU-h)", data: closes, yAxisID: "y", spanGaps: true,
         borderColor: "#1f2328", pointRadius: 2},
        {type: "bar", label: "volume (GPU-h)", data: volume, yAxisID: "volume",
         backgroundColor: "rgba(130,80,223,0.25)"}
      ]},
      options: {
        animation: false, maintainAspectRatio: false, parsing: false,
        scales: {
          x: {type: "linear", min: first, max: last, title: {display: true, text: "time (UTC)"},
              ticks: {maxTicksLimit: 8, callback: function (v) { return timeLabel(v); }}},
          y: {position: "left", title: {display: true, text: "USD per GPU-hour"}},
          volume: {position: "right", beginAtZero: true, grid: {drawOnChartArea: false},
                   title: {display: true, text: "GPU-hours"}}
        },
        plugins: {tooltip: {callbacks: {title: function (items) {
          return items.length ? timeLabel(items[0].parsed.x - history.bucket_seconds * 500) + " UTC" : ""; }}}}
      }
    });
  }
  var historyTimer = null;
  function refreshHistory() {
    if (historyTimer) return;
    historyTimer = setTimeout(function () {
      historyTimer = null;
      GM.getJSON("/api/v1/gpu-classes/" + slug + "/history/?range=" + history.range)
        .then(function (d) {  // the API's buckets as the page's history-data has them
          history = {range: d.range, bucket_seconds: d.bucket_seconds,
                     buckets: d.buckets.map(function (b) {
                       return {t: Date.parse(b.start), open: b.open, high: b.high, low: b.low,
                               close: b.close, trades: b.trades, gpu_hours: b.gpu_hours}; })};
          drawHistory();
        })
        .catch(function (e) { console.warn("history refresh failed:", e.message); });
    }, 300);
  }

  drawDepth();
  drawTrades();
  GM.offers = JSON.parse(document.getElementById("offers-data").textContent);
  drawHistory();

  GM.feed("/ws/markets/" + slug + "/", {
    pollMs: 2000,
    onMessage: function (msg) {
      if (msg.type === "snapshot" || msg.type === "depth") {
        depth = {bids: msg.bids || [], asks: msg.asks || []};
        drawDepth();
        refreshOffers();
      }
      if (msg.type === "snapshot" && msg.trades) { trades = msg.trades.slice(); drawTrades(); }
      if (msg.type === "trade") { addTrade(msg); drawTrades(); refreshOffers(); refreshHistory(); }
    },
    poll: function () {
      return Promise.all([
        GM.getJSON("/api/v1/gpu-classes/" + slug + "/book/").then(function (d) {
          depth = {bids: d.bids.map(function (l) { return [l.price, l.gpus]; }),
                   asks: d.asks.map(function (l) { return [l.price, l.gpus]; })};
          drawDepth();
        }),
        Promise.resolve().then(function () { refreshOffers(); refreshHistory(); }),
        GM.getJSON("/api/v1/fills/?limit=100").then(function (d) {
          d.results.filter(function (x) { return x.gpu_class === slug; }).forEach(function (x) {
            addTrade({id: x.id, price: x.price, gpus: x.gpus, at: x.created_at});
          });
          drawTrades();
        })
      ]);
    }
  });

  GM.watchMe({fragments: ["my-orders", "my-leases"]});

  /* Hold preview: price × GPUs × hours, exact (BigInt micro-USD, as the ledger). */
  var form = document.getElementById("bid-form");
  if (!form) return;
  var preview = document.getElementById("hold-preview");
  function micros(text) {
    var m = /^(0|[1-9][0-9]{0,12})(?:\.([0-9]{1,6}))?$/.exec(text.trim());
    if (!m) return null;
    return BigInt(m[1]) * 1000000n + BigInt(((m[2] || "") + "000000").slice(0, 6));
  }
  function fmt(v) {
    var whole = v / 1000000n, frac = (v % 1000000n).toString().padStart(6, "0");
    return GM.usd(whole.toString() + "." + frac);
  }
  function update() {
    var price = micros(form.elements.price.value || "");
    var gpus = parseInt(form.elements.gpus.value, 10), hours = parseInt(form.elements.hours.value, 10);
    if (price === null || !(gpus > 0) || !(hours > 0)) {
      preview.textContent = "Hold: price × GPUs × hours (enter all three).";
      return;
    }
    var hold = price * BigInt(gpus) * BigInt(hours);
    preview.textContent = "Hold: $" + fmt(price) + " × " + gpus + " GPUs × " + hours +
      " h = $" + fmt(hold) + " USD, moved from available to held until the bid fills or ends.";
    preview.dataset.holdMicros = hold.toString();
  }
  form.addEventListener("input", update);
  update();
})();
