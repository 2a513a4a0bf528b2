/* gpumarket live updates, shared by every page.
 *
 * GM.feed(path, {onMessage, poll, pollMs}) follows a websocket of the live feed
 * (docs/FEED_PROTOCOL.md: snapshot + events with seq; a gap → {"type": "resync"}) when this
 * server speaks websockets (body[data-live-ws="1"], the ASGI application), and otherwise,
 * or while the socket is down, calls poll() every pollMs (fetching the REST API or the
 * page itself), so a page stays current without a reload either way.
 *
 * #live-status tells the truth: "live" (green) only while every feed's socket is open and
 * the last refresh of the page worked; "updating every few seconds" while polling works;
 * "reconnecting…" (grey) after a failed refresh or a closed socket; "offline" (red) after
 * three failures in a row or while the browser is offline. */
(function () {
  "use strict";
  var GM = (window.GM = window.GM || {});
  var wsEnabled = document.body.dataset.liveWs === "1" && "WebSocket" in window;

  // A form's errors rendered by a POST-only path: the page's own GET URL in the address
  // bar (a reload or a refresh of the page's parts asks that URL, never the POST path).
  var pageUrl = document.body.dataset.pageUrl;
  if (pageUrl && pageUrl !== location.pathname && window.history && history.replaceState) {
    history.replaceState(null, "", pageUrl);
  }

  GM.csrf = function () {
    var m = document.querySelector('meta[name="csrf-token"]');
    return m ? m.content : "";
  };

  /* "2.490000" → "2.49"; "0.000001" stays; null → "—" */
  GM.usd = function (s) {
    if (s === null || s === undefined || s === "") return "—";
    var parts = String(s).split(".");
    var frac = (parts[1] || "").replace(/0+$/, "");
    while (frac.length < 2) frac += "0";
    return parts[0] + "." + frac;
  };

  /* A balance or total as the pages' `usd` filter shows it (frontend/templatetags/
   * gpumarket.py): "248.444999" → "$248.44" (half up to the cent), "0.005678" stays in
   * full ("$0.005678"), "-1.2" → "-$1.20"; null → "—". */
  GM.money = function (s) {
    if (s === null || s === undefined || s === "") return "—";
    var text = String(s), sign = text.charAt(0) === "-" ? "-" : "";
    var parts = text.replace(/^-/, "").split(".");
    var micros = Number(parts[0]) * 1e6 + Number(((parts[1] || "") + "000000").slice(0, 6));
    if (micros > 0 && micros < 10000) return sign + "$" + GM.usd(text.replace(/^-/, ""));
    var cents = Math.floor((micros + 5000) / 10000);
    return sign + "$" + Math.floor(cents / 100) + "." + String(cents % 100).padStart(2, "0");
  };

  /* A price per GPU-hour as the `price` filter shows it: "2.865000" → "$2.865 /GPU-h". */
  GM.price = function (s) {
    if (s === null || s === undefined || s === "") return "—";
    var text = String(s), sign = text.charAt(0) === "-" ? "-" : "";
    return sign + "$" + GM.usd(text.replace(/^-/, "")) + " /GPU-h";
  };

  GM.text = function (id, value) {
    var el = document.getElementById(id);
    if (el && el.textContent !== String(value)) el.textContent = value;
  };

  // per feed: "live" | "poll" | "reconnecting"; failures: refreshes failed in a row
  var statusModes = {}, failures = 0;
  function showStatus() {
    var el = document.getElementById("live-status");
    if (!el) return;
    var modes = Object.keys(statusModes).map(function (k) { return statusModes[k]; });
    var word, mode;
    if (navigator.onLine === false || failures >= 3) { word = "offline"; mode = "off"; }
    else if (failures || modes.indexOf("reconnecting") >= 0) { word = "reconnecting…"; mode = "wait"; }
    else if (modes.length && modes.every(function (m) { return m === "live"; })) { word = "live"; mode = "on"; }
    else if (modes.length) { word = "updating every few seconds"; mode = "poll"; }
    else return;
    ["on", "wait", "off", "poll"].forEach(function (c) { el.classList.toggle(c, c === mode); });
    el.dataset.state = mode;
    if (el.textContent !== word) el.textContent = word;
  }
  function setStatus(key, mode) { statusModes[key] = mode; showStatus(); }
  GM.refreshFailed = function (e) {
    if (e && e.gmCounted) return;  // (a poll that is a refresh of the page: counted once)
    if (e) e.gmCounted = true;
    failures += 1; showStatus();
    console.warn("refresh failed:", e && e.message);
  };
  GM.refreshWorked = function () { if (failures) { failures = 0; showStatus(); } };
  window.addEventListener("offline", showStatus);
  window.addEventListener("online", showStatus);

  GM.getJSON = function (url) {
    return fetch(url, {credentials: "same-origin", headers: {Accept: "application/json"}})
      .then(function (r) { if (!r.ok) throw new Error(url + " answered " + r.status); return r.json(); });
  };

  GM.feed = function (path, h) {
    var ws = null, last = null, pollTimer = null, retry = 2000, stopped = false;
    var pollMs = h.pollMs || 2000;
    function poll() {
      Promise.resolve().then(h.poll).then(GM.refreshWorked, GM.refreshFailed);
    }
    function startPolling(mode) {
      setStatus(path, mode || "poll");
      if (pollTimer || !h.poll) return;
      poll();
      pollTimer = setInterval(poll, pollMs);
    }
    function stopPolling() { if (pollTimer) { clearInterval(pollTimer); pollTimer = null; } }
    GM.stopFeed = GM.stopFeed || {};
    GM.stopFeed[path] = function () { stopped = true; stopPolling(); if (ws) ws.close(); };
    function connect() {
      if (stopped) return;
      if (!wsEnabled) { startPolling(); return; }
      var scheme = location.protocol === "https:" ? "wss://" : "ws://";
      ws = new WebSocket(scheme + location.host + path);
      ws.onopen = function () { retry = 2000; stopPolling(); setStatus(path, "live"); };
      ws.onmessage = function (ev) {
        var msg;
        try { msg = JSON.parse(ev.data); } catch (e) { return; }
        if (msg.type === "resync_required") { ws.send('{"type":"resync"}'); return; }
        if (msg.type === "snapshot") { last = msg.seq; h.onMessage(msg); return; }
        if (last !== null && msg.seq <= last) return;              // stale
        if (last !== null && msg.seq > last + 1) { ws.send('{"type":"resync"}'); return; }  // gap
        last = msg.seq;
        h.onMessage(msg);
      };
      ws.onclose = function () {
        ws = null; last = null;
        if (stopped) return;
        startPolling("reconnecting");
        setTimeout(connect, retry);
        retry = Math.min(retry * 2, 60000);
      };
    }
    connect();
  };

  /* Re-render parts of this page (elements by id) from a fresh GET of the page. */
  var refreshing = null;
  // A fragment's markup without what a page script counts on by itself (cells marked
  // data-live: their text and the server's clock), so a fresh copy that differs only there
  // does not replace it (an open <details> stays open).
  function stable(el) {
    var copy = el.cloneNode(true);
    copy.querySelectorAll("[data-live]").forEach(function (x) {
      x.textContent = ""; x.removeAttribute("data-server-time");
    });
    return copy.innerHTML;
  }
  GM.refreshFragments = function (ids) {
    if (refreshing) return refreshing;
    refreshing = fetch(location.pathname + location.search,
                       {credentials: "same-origin", headers: {Accept: "text/html"}})
      .then(function (r) { if (!r.ok) throw new Error("page answered " + r.status); return r.text(); })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        ids.forEach(function (id) {
          var now = document.getElementById(id), fresh = doc.getElementById(id);
          if (!now || !fresh || stable(now) === stable(fresh)) return;
          if (now.contains(document.activeElement) && document.activeElement !== document.body) return;
          now.innerHTML = fresh.innerHTML;
        });
        GM.refreshWorked();
      }, function (e) { GM.refreshFailed(e); throw e; })
      .finally(function () { refreshing = null; });
    return refreshing;
  };

  function showWallet(w) {
    if (!w) return;
    GM.text("wallet-available", GM.money(w.available));
    GM.text("wallet-held", GM.money(w.held));
    GM.text("wallet-earned", GM.money(w.earned));
  }

  /* Functions called with every /ws/me/ message (lease-charts.js: lease_metrics). */
  GM.meListeners = GM.meListeners || [];

  /* The signed-in user's own orders, leases and balances (/ws/me/). A lease_metrics
   * message goes to GM.meListeners only: the page is not fetched again for it. */
  GM.watchMe = function (opts) {
    if (!document.body.dataset.user) return;
    var ids = opts.fragments || [];
    var pending = null;
    function refresh() {
      if (pending) return;
      pending = setTimeout(function () {
        pending = null;
        if (ids.length) GM.refreshFragments(ids).catch(function () {});  // shown in #live-status
      }, 150);
    }
    GM.feed("/ws/me/", {
      pollMs: opts.pollMs || 2000,
      onMessage: function (msg) {
        GM.meListeners.forEach(function (fn) {
          try { fn(msg); } catch (e) { console.warn("listener failed:", e.message); }
        });
        if (msg.type === "lease_metrics") return;
        if (msg.wallet) showWallet(msg.wallet);
        refresh();
      },
      poll: function () {
        var jobs = [];
        if (opts.wallet) jobs.push(GM.getJSON("/api/v1/wallet/").then(showWallet));
        if (ids.length) jobs.push(GM.refreshFragments(ids));
        return Promise.all(jobs);
      }
    });
  };
})();
