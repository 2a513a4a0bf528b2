/* Sealed auction page: countdown from closes_at and the server's clock, bid count and
 * status live (/ws/auctions/<id>/ or the REST API), the result after close. Never
 * receives a sealed bid's content: the feed and the API carry only counts and, after
 * close, anonymous awards. */
(function () {
  "use strict";
  var box = document.getElementById("auction-state");
  var id = box.dataset.auction;
  var closesAt = Date.parse(box.dataset.closesAt);
  var skew = Date.parse(box.dataset.serverTime) - Date.now();  // server clock − ours
  var status = box.dataset.status, resultShown = status !== "open";

  function fmt(s) {
    var h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
    var mm = String(m).padStart(2, "0"), ss = String(sec).padStart(2, "0");
    return h ? h + ":" + mm + ":" + ss : mm + ":" + ss;
  }
  function tick() {
    if (status !== "open") { GM.text("countdown", "ended"); return; }
    var left = Math.max(0, Math.ceil((closesAt - (Date.now() + skew)) / 1000));
    GM.text("countdown", left > 0 ? fmt(left) : "closing…");
  }
  var timer = setInterval(tick, 250);
  tick();

  function setStatus(s) {
    var el = document.getElementById("auction-status");
    if (el && el.textContent.trim() !== s) {
      el.innerHTML = "";
      var span = document.createElement("span");
      span.className = "status status-" + s; span.textContent = s; el.appendChild(span);
    }
  }
  function apply(state) {
    if (state.closes_at) closesAt = Date.parse(state.closes_at);
    if (state.server_time) skew = Date.parse(state.server_time) - Date.now();
    if (typeof state.bids === "number") GM.text("bid-count", state.bids);
    if (typeof state.bid_count === "number") GM.text("bid-count", state.bid_count);
    if (state.status) { status = state.status; setStatus(status); }
    tick();
    if (status !== "open" && !resultShown) {
      resultShown = true;
      clearInterval(timer);
      // the result, my bid's outcome: rendered by the server, fetched without a reload
      GM.refreshFragments(["auction-result", "bid-area"]).then(function () {
        if (GM.stopFeed) GM.stopFeed["/ws/auctions/" + id + "/"]();
      }).catch(function (e) { resultShown = false; console.warn(e.message); });
    }
  }
  GM.feed("/ws/auctions/" + id + "/", {
    pollMs: 1000,
    onMessage: function (msg) {
      if (msg.type === "auction_result") msg.status = msg.status || "closed";
      apply(msg);
    },
    poll: function () { return GM.getJSON("/api/v1/auctions/" + id + "/").then(apply); }
  });
})();
