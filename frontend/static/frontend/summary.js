/* The home page's market and auction tables and /auctions/ follow /ws/summary/
 * (docs/FEED_PROTOCOL.md: a market's best prices and GPUs offered after each change of its
 * book, an auction's status and bid count). The tables themselves are rendered by the
 * server (one money format): a change re-renders them from a fresh GET of the page, at
 * most one every 250 ms; a market_summary equal to the last one seen changes nothing.
 * Without websockets the page polls itself (GM.feed's fallback). */
(function () {
  "use strict";
  var box = document.querySelector("[data-summary]");
  if (!box) return;
  var ids = box.dataset.summary.split(" ");
  var seen = {}, timer = null;
  function refresh() {
    if (timer) return;
    timer = setTimeout(function () {
      timer = null;
      GM.refreshFragments(ids).catch(function () {});  // shown in #live-status
    }, 250);
  }
  // "N s" left of each open auction, counted down here between two renderings: each cell
  // carries the whole seconds left (floored) when the server rendered it, just before it
  // is seen; so its end is at or after now + that, and the latest such bound is the best
  var ends = {};
  function tick() {
    var now = Date.now();
    document.querySelectorAll("[data-seconds-left]").forEach(function (el) {
      var id = el.dataset.auction;
      if (!el.gmSeen) {
        el.gmSeen = true;
        ends[id] = Math.max(ends[id] || 0, now + Number(el.dataset.secondsLeft) * 1000);
      }
      var left = Math.max(0, Math.ceil((ends[id] - now) / 1000));
      var text = left > 0 ? left + " s" : "closing…";
      if (el.textContent !== text) el.textContent = text;
    });
  }
  setInterval(tick, 500);
  tick();
  function line(m) { return [m.best_bid, m.best_ask, m.gpus_offered].join("|"); }
  GM.feed("/ws/summary/", {
    pollMs: 3000,
    onMessage: function (msg) {
      if (msg.type === "snapshot") {  // also after a reconnect: whatever changed meanwhile
        (msg.markets || []).forEach(function (m) { seen[m.market] = line(m); });
        refresh();
      } else if (msg.type === "market_summary") {
        if (seen[msg.market] === line(msg)) return;
        seen[msg.market] = line(msg);
        refresh();
      } else if (msg.type === "auction_summary") {
        refresh();
      }
    },
    poll: function () { return GM.refreshFragments(ids); }
  });
})();
