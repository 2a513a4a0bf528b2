/* The leases page's GPU charts (issue 16, docs/TELEMETRY.md): one box per running lease
 * of the buyer (rows marked data-metrics-lease), two Chart.js line charts — utilisation
 * (%) and memory used (MiB), a line per GPU — loaded from
 * GET /api/v1/leases/<id>/metrics/?range=1h and extended by each lease_metrics message
 * of /ws/me/ (GM.meListeners); the latest power, temperature, clocks and throttle reasons
 * under them. Boxes follow the table: made for a lease that starts, removed when it ends. */
(function () {
  "use strict";
  var GM = window.GM || {};
  var box = document.getElementById("lease-charts");
  var table = document.getElementById("my-leases");
  if (!box || !table || !window.Chart) return;
  var MAX_POINTS = 360;  // an hour of 10 s buckets, as the API keeps them
  var COLORS = ["#0969da", "#1a7f37", "#9a6700", "#cf222e", "#8250df", "#bf3989", "#1b7c83", "#57606a"];
  var shown = {};  // lease id → {el, util, mem, last}

  function label(iso) { return String(iso).slice(11, 19); }  // "HH:MM:SS" UTC
  function short(uuid) { return String(uuid).slice(0, 12) + "…"; }

  function chart(canvas, unit, max) {
    return new window.Chart(canvas, {
      type: "line",
      data: {labels: [], datasets: []},
      options: {
        animation: false, responsive: true, maintainAspectRatio: false, spanGaps: true,
        elements: {point: {radius: 0}},
        scales: {y: {beginAtZero: true, max: max, title: {display: true, text: unit}}},
        plugins: {legend: {position: "bottom"}}
      }
    });
  }

  function dataset(c, uuid) {
    var found = c.data.datasets.filter(function (d) { return d.uuid === uuid; })[0];
    if (found) return found;
    var color = COLORS[c.data.datasets.length % COLORS.length];
    found = {uuid: uuid, label: short(uuid), data: [], borderColor: color, backgroundColor: color};
    c.data.datasets.push(found);
    return found;
  }

  function latestText(gpus) {
    return gpus.map(function (g) {
      var parts = [short(g.uuid) + ":"];
      if (g.power_w !== null) parts.push(g.power_w + " W");
      if (g.temperature_c !== null) parts.push(g.temperature_c + " °C");
      if (g.sm_clock_mhz !== null) parts.push("SM " + g.sm_clock_mhz + " MHz");
      if (g.mem_clock_mhz !== null) parts.push("mem " + g.mem_clock_mhz + " MHz");
      parts.push("throttle: " + ((g.throttle_reasons || []).join(", ") || "none"));
      return parts.join(" ");
    }).join(" · ");
  }

  /* Append one bucket ({at, gpus: [{uuid, utilization_pct, fb_used_mib, …}]}) to a lease's
   * charts; the same bucket again (updated means) replaces its last point. */
  function add(s, at, gpus) {
    [s.util, s.mem].forEach(function (c) {
      var key = c === s.util ? "utilization_pct" : "fb_used_mib";
      var labels = c.data.labels, same = labels.length && labels[labels.length - 1] === label(at);
      if (!same) labels.push(label(at));
      gpus.forEach(function (g) {
        var d = dataset(c, g.uuid);
        while (d.data.length < labels.length - 1) d.data.push(null);
        if (same && d.data.length === labels.length) d.data[d.data.length - 1] = g[key];
        else d.data.push(g[key]);
      });
      while (labels.length > MAX_POINTS) {
        labels.shift();
        c.data.datasets.forEach(function (d) { d.data.shift(); });
      }
      c.update("none");
    });
    s.last.textContent = latestText(gpus);
  }

  function make(id) {
    var el = document.createElement("div");
    el.className = "lease-chart card";
    el.id = "lease-chart-" + id;
    el.innerHTML = '<h2>Lease #' + id + ': GPU utilisation and memory</h2>' +
      '<div class="chart-box"><canvas role="img" data-chart="util"></canvas></div>' +
      '<div class="chart-box"><canvas role="img" data-chart="mem"></canvas></div>' +
      '<p class="muted" data-latest>waiting for the first readings…</p>';
    box.appendChild(el);
    var s = {el: el, last: el.querySelector("[data-latest]"),
             util: chart(el.querySelector('[data-chart="util"]'), "GPU utilisation (%)", 100),
             mem: chart(el.querySelector('[data-chart="mem"]'), "memory used (MiB)")};
    el.querySelector('[data-chart="util"]').setAttribute("aria-label", "GPU utilisation of lease " + id);
    el.querySelector('[data-chart="mem"]').setAttribute("aria-label", "GPU memory used by lease " + id);
    shown[id] = s;
    GM.getJSON("/api/v1/leases/" + id + "/metrics/?range=1h").then(function (body) {
      var points = {};  // at → [gpu]
      body.gpus.forEach(function (g) {
        g.at.forEach(function (at, i) {
          (points[at] = points[at] || []).push({
            uuid: g.uuid, utilization_pct: g.utilization_pct[i], fb_used_mib: g.fb_used_mib[i],
            power_w: g.power_w[i], temperature_c: g.temperature_c[i], sm_clock_mhz: g.sm_clock_mhz[i],
            mem_clock_mhz: g.mem_clock_mhz[i], throttle_reasons: g.throttle_reasons[i]});
        });
      });
      Object.keys(points).sort().forEach(function (at) { add(s, at, points[at]); });
    }).catch(function (e) { s.last.textContent = "telemetry unavailable: " + e.message; });
  }

  function sync() {
    var want = {};
    table.querySelectorAll("[data-metrics-lease]").forEach(function (row) {
      want[row.dataset.metricsLease] = true;
    });
    Object.keys(want).forEach(function (id) { if (!shown[id]) make(id); });
    Object.keys(shown).forEach(function (id) {
      if (want[id]) return;
      shown[id].util.destroy(); shown[id].mem.destroy(); shown[id].el.remove();
      delete shown[id];
    });
  }

  GM.meListeners = GM.meListeners || [];
  GM.meListeners.push(function (msg) {
    if (msg.type !== "lease_metrics") return;
    var s = shown[String(msg.lease)];
    if (s) add(s, msg.at, msg.gpus);
    var idle = document.querySelector('[data-idle-of="' + msg.lease + '"]');
    if (idle) {
      var text = msg.idle && msg.idle.idle ? "idle: " + msg.idle.text : "";
      if (idle.textContent !== text) idle.textContent = text;
    }
  });
  sync();
  new MutationObserver(sync).observe(table, {childList: true, subtree: true});
})();
