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
