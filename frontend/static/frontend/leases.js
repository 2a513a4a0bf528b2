/* Lease tables (my leases, the market page, the provider's pages): every second, the time left and the cost so far of each unended lease
 * (price × GPUs × seconds used // 3600, micro-USD, as the marketplace bills it), from the
 * data attributes the server rendered, corrected by the server's clock. The live refresh
 * (GM.watchMe) replaces the table when more than these cells (data-live) changed; this
 * reads the cells anew on every tick and at once after a replacement. */
(function () {
  "use strict";
  var seen = new WeakMap();  // cell → when this page first saw it (our clock)
  function skew(el) {
    var t = Date.parse(el.dataset.serverTime);
    if (!seen.has(el)) seen.set(el, Date.now());
    return isNaN(t) ? 0 : t - seen.get(el);  // server clock − ours
  }
  function fmt(s) {
    var h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
    return h + ":" + String(m).padStart(2, "0") + ":" + String(sec).padStart(2, "0");
  }
  function usd(micros) {
    var whole = Math.floor(micros / 1e6), frac = String(micros % 1e6).padStart(6, "0");
    frac = frac.replace(/0+$/, "");
    while (frac.length < 2) frac += "0";
    return whole + "." + frac;
  }
  function set(el, text) { if (el.textContent !== text) el.textContent = text; }
  function tick() {
    document.querySelectorAll("[data-live-left]").forEach(function (el) {
      var ends = Date.parse(el.dataset.ends);
      if (isNaN(ends)) return;
      var left = Math.max(0, Math.floor((ends - (Date.now() + skew(el))) / 1000));
      set(el, left > 0 ? fmt(left) : "ending…");
    });
    document.querySelectorAll("[data-live-cost]").forEach(function (el) {
      var started = Date.parse(el.dataset.started);
      if (isNaN(started)) return;
      var ran = Math.floor((Date.now() + skew(el) - started) / 1000);
      ran = Math.max(0, Math.min(ran, Number(el.dataset.duration)));
      var micros = Math.floor(Number(el.dataset.price) * Number(el.dataset.gpus) * ran / 3600);
      set(el, "$" + usd(micros) + " so far");
    });
  }
  setInterval(tick, 1000);
  tick();
  // the live refresh replaces the table (wherever a page has one): count on in the new
  // cells at once; set() writes only changes, so its own writes settle after one round
  new MutationObserver(tick).observe(document.body, {childList: true, subtree: true});
})();
