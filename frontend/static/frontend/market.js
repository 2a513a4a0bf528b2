/* Market page: depth chart (Chart.js, vendored), depth table, last trades, the hold
 * preview of the bid form, and live updates (/ws/markets/<slug>/ or the REST API). */
(function () {
  "use strict";
  var slug = document.getElementById("market-js").dataset.market;
  var depth = JSON.parse(document.getElementById("depth-data").textContent);
  var trades = JSON.parse(document.getElementById("trades-data").textContent);
  var chart = null;

  function cumulative(levels) {
    var sum = 0;
    return levels.map(function (l) { sum += l[1]; return {x: Number(l[0]), y: sum}; });
  }

  function drawChart() {
    var canvas = document.getElementById("depth-chart");
    if (!canvas || typeof Chart === "undefined") return;
    var bids = cumulative(depth.bids).reverse(), asks = cumulative(depth.asks);
    // extend each side flat past its last level, so even one level draws as an area
    var prices = bids.concat(asks).map(function (p) { return p.x; });
    if (prices.length) {
      var lo = Math.min.apply(null, prices), hi = Math.max.apply(null, prices);
      var pad = Math.max((hi - lo) * 0.15, lo * 0.05, 0.01);
      if (bids.length) bids.unshift({x: bids[0].x - pad, y: bids[0].y});
      if (asks.length) asks.push({x: asks[asks.length - 1].x + pad, y: asks[asks.length - 1].y});
    }
    if (chart) {
      chart.data.datasets[0].data = bids;
      chart.data.datasets[1].data = asks;
      chart.update("none");
      return;
    }
    chart = new Chart(canvas, {
      type: "line",
      data: {datasets: [
        {label: "bids (GPUs at or above price)", data: bids, stepped: true, fill: "origin",
         borderColor: "#1a7f37", backgroundColor: "rgba(26,127,55,0.18)", pointRadius: 2},
        {label: "asks (GPUs at or below price)", data: asks, stepped: true, fill: "origin",
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

  drawDepth();
  drawTrades();

  GM.feed("/ws/markets/" + slug + "/", {
    pollMs: 2000,
    onMessage: function (msg) {
      if (msg.type === "snapshot" || msg.type === "depth") {
        depth = {bids: msg.bids || [], asks: msg.asks || []};
        drawDepth();
      }
      if (msg.type === "snapshot" && msg.trades) { trades = msg.trades.slice(); drawTrades(); }
      if (msg.type === "trade") { addTrade(msg); drawTrades(); }
    },
    poll: function () {
      return Promise.all([
        GM.getJSON("/api/v1/gpu-classes/" + slug + "/book/").then(function (d) {
          depth = {bids: d.bids.map(function (l) { return [l.price, l.gpus]; }),
                   asks: d.asks.map(function (l) { return [l.price, l.gpus]; })};
          drawDepth();
        }),
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
