/* Provider earnings over time: cumulative provider share (USD) per settled lease. */
(function () {
  "use strict";
  var series = JSON.parse(document.getElementById("earnings-data").textContent);
  var canvas = document.getElementById("earnings-chart");
  if (!canvas || typeof Chart === "undefined") return;
  new Chart(canvas, {
    type: "line",
    data: {
      labels: series.map(function (p) { return p.t; }),
      datasets: [
        {label: "cumulative earnings (USD)", data: series.map(function (p) { return p.cumulative; }),
         borderColor: "#0b6bcb", backgroundColor: "rgba(11,107,203,0.15)", fill: "origin", stepped: true},
        {type: "bar", label: "per lease (USD)", data: series.map(function (p) { return p.lease; }),
         backgroundColor: "rgba(26,127,55,0.5)"}
      ]
    },
    options: {animation: false, maintainAspectRatio: false,
              scales: {y: {beginAtZero: true, title: {display: true, text: "USD"}}}}
  });
})();
