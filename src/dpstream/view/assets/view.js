"use strict";
// dpstream live view: keeps the page in step with the server (server-sent events).
// The server sends the header, the top items and the history as HTML it has already
// escaped; this script only swaps them in and keeps the user's choice of items. An item's
// elements carry its index (data-i) into the names sent with them (selected, then others):
// a name (of any length) is sent once, not in every element that names it.
(function () {
  const root = document.getElementById("dp-view");
  const state = JSON.parse(root.dataset.state);
  const MAX = 8;
  // the server reads a request line of at most 64 KiB: a query longer than this is not sent
  const MAX_QUERY = 60000;
  let selected = state.selected;
  // the names the elements shown refer to (data-i), as sent with them
  let names = state.selected.concat(state.others || []);
  let auto = state.auto;
  let status = state.status;
  let source = null;
  let retry = null;
  const RETRY_MS = 5000;  // the server's Retry-After when its streams are full (503)
  const conn = document.getElementById("dp-conn");
  const tooLong = document.getElementById("dp-too-long");

  function query(items, isAuto) {
    const q = new URLSearchParams();
    if (!isAuto) {
      q.set("manual", "1");
      for (const item of items) q.append("sel", item);
    }
    const text = q.toString();
    return text ? "?" + text : "";
  }

  function setConn(ok) {
    // connected to a server that cannot read the file: the page is not live
    const stale = ok && status === "stale";
    conn.textContent = !ok ? "disconnected: retrying"
      : stale ? "connected: not updating" : "live: connected";
    conn.className = "conn " + (ok && !stale ? "ok" : "down");
  }

  function fitting(items) {
    // the items whose names fit in one request, longest names left out first, and those left
    const kept = items.slice();
    const left = [];
    const size = function (x) { return new URLSearchParams({ sel: x }).toString().length; };
    while (kept.length && query(kept, false).length > MAX_QUERY) {
      let longest = 0;
      for (let i = 1; i < kept.length; i++) if (size(kept[i]) > size(kept[longest])) longest = i;
      left.push(kept.splice(longest, 1)[0]);
    }
    return [kept, left];
  }

  function tellLeft(left) {
    tooLong.hidden = left.length === 0;
    tooLong.textContent = left.length === 0 ? "" : "Not shown: " + left.length +
      " item name(s) too long for the page to ask the server for: " +
      left.map(function (x) { return x.length > 40 ? x.slice(0, 40) + "…" : x; }).join(", ");
  }

  function apply(msg) {
    document.getElementById("dp-header").innerHTML = msg.html.header;
    document.getElementById("dp-top").innerHTML = msg.html.top;
    document.getElementById("dp-history").innerHTML = msg.html.history;
    selected = msg.selected;
    names = msg.selected.concat(msg.others || []);
    auto = msg.auto;
    status = msg.status;
    root.dataset.version = String(msg.version);
    root.dataset.t = msg.t === null ? "" : String(msg.t);
  }

  function connect() {
    if (source) source.close();
    clearTimeout(retry);
    const es = new EventSource("events" + query(selected, auto));
    source = es;
    source.onopen = function () { setConn(true); };
    source.onerror = function () {
      setConn(false);
      // a refusal (503: too many pages open) ends the stream for good; try again later
      if (es.readyState === EventSource.CLOSED) retry = setTimeout(connect, RETRY_MS);
    };
    source.onmessage = function (e) { apply(JSON.parse(e.data)); setConn(true); };
  }

  function choose(next, nextAuto) {
    const fit = fitting(nextAuto ? [] : next.slice(-MAX));
    tellLeft(fit[1]);
    selected = fit[0];
    auto = nextAuto;
    history.replaceState(null, "", location.pathname + query(selected, auto));
    connect();
  }

  function toggle(item) {
    const next = selected.filter(function (x) { return x !== item; });
    if (next.length === selected.length) next.push(item);
    choose(next, false);
  }

  function named(el) {
    // the name an element shown refers to (undefined if none)
    const i = el ? Number(el.dataset.i) : NaN;
    return Number.isInteger(i) && i >= 0 && i < names.length ? names[i] : undefined;
  }

  document.addEventListener("click", function (e) {
    const el = e.target.closest("[data-i]");
    const item = el && !el.closest("svg") ? named(el) : undefined;
    if (item !== undefined) { e.preventDefault(); toggle(item); }
  });
  document.addEventListener("keydown", function (e) {
    const el = e.target.closest && e.target.closest("[data-i]");
    const item = el && !el.closest("svg") ? named(el) : undefined;
    if (item !== undefined && (e.key === "Enter" || e.key === " ")) {
      e.preventDefault();
      toggle(item);
    }
  });
  document.getElementById("dp-add").addEventListener("submit", function (e) {
    e.preventDefault();
    const input = document.getElementById("dp-add-name");
    const item = input.value;
    if (item && selected.indexOf(item) < 0) choose(selected.concat([item]), false);
    input.value = "";
  });
  document.getElementById("dp-auto").addEventListener("click", function () {
    choose([], true);
  });
  connect();
})();
