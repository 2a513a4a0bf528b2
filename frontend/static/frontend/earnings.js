/* Provider earnings over time, on a time axis (UTC): the cumulative provider share as a
 * stepped line at each settlement's moment, and the share earned per period as bars, one
 * bar per period (a minute, 5 minutes, an hour or a day: the smallest that gives at most
 * 60 periods over the span), so bars never overlap however close settlements are.
 * Data: #earnings-data, [{ms, cumulative, lease}] in micro-USD (portal_views.earnings).
 * A linear axis of milliseconds with UTC labels: no date adapter needed. */
(function () {
  "use strict";
  var series = JSON.parse(document.getElementById("earnings-data").textContent);
  var canvas = document.getElementById("earnings-chart");
  if (!canvas || typeof Chart === "undefined" || !series.length) return;
  var MIN = 60e3, PERIODS = [MIN, 5 * MIN, 60 * MIN, 24 * 60 * MIN, 7 * 24 * 60 * MIN];
  var first = series[0].ms, last = series[series.length - 1].ms;
  var period = PERIODS[PERIODS.length - 1];
  for (var i = 0; i < PERIODS.length; i++) {
    if ((last - first) / PERIODS[i] <= 60) { period = PERIODS[i]; break; }
  }
  var buckets = {};
  series.forEach(function (p) {
    var start = Math.floor(p.ms / period) * period;
    buckets[start] = (buckets[start] || 0) + p.lease;
  });
  var bars = Object.keys(buckets).map(Number).sort(function (a, b) { return a - b; })
    .map(function (start) { return {x: start + period / 2, y: buckets[start] / 1e6}; });
  var line = series.map(function (p) { return {x: p.ms, y: p.cumulative / 1e6}; });
  var pad = period;
  function label(ms) {
    var iso = new Date(ms).toISOString();  // UTC, as the table
    return period >= 24 * 60 * MIN ? iso.slice(0, 10) : iso.slice(5, 16).replace("T", " ");
  }
  var words = {60000: "minute", 300000: "5 minutes", 3600000: "hour", 86400000: "day",
               604800000: "week"};
  // each bar as wide as its period on the axis (90 %), set once the axis is laid out
  var periodWidth = {id: "periodWidth", afterLayout: function (chart) {
    var x = chart.scales.x;
    var px = Math.max(1, 0.9 * Math.abs(x.getPixelForValue(first + period) -
                                        x.getPixelForValue(first)));
    chart.data.datasets[1].barThickness = px;
  }};
  new Chart(canvas, {
    plugins: [periodWidth],
    data: {
      datasets: [
        {type: "line", label: "cumulative earnings (USD)", data: line, stepped: true,
         borderColor: "#0b6bcb", backgroundColor: "rgba(11,107,203,0.15)", fill: "origin",
         pointRadius: 2},
        {type: "bar", label: "earned per " + words[period] + " (USD)", data: bars,
         backgroundColor: "rgba(26,127,55,0.5)", grouped: false}
      ]
    },
    options: {
      animation: false, maintainAspectRatio: false, parsing: true,
      scales: {
        x: {type: "linear", min: first - pad, max: last + pad,
            ticks: {maxTicksLimit: 6, maxRotation: 0, callback: function (v) { return label(v); }},
            title: {display: true, text: "settled (UTC)"}},
        y: {beginAtZero: true, title: {display: true, text: "USD"}}
      },
      plugins: {tooltip: {callbacks: {title: function (items) {
        return items.length ? label(items[0].parsed.x) + " UTC" : ""; }}}}
    }
  });
  canvas.dataset.period = String(period);
  canvas.dataset.bars = String(bars.length);
})();
