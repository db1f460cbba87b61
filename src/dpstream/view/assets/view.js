"use strict";
// dpstream live view: keeps the page in step with the server (server-sent events).
// The server sends the header, the top items and the history as HTML it has already
// escaped; this script only swaps them in and keeps the user's choice of items.
(function () {
  const root = document.getElementById("dp-view");
  const state = JSON.parse(root.dataset.state);
  const MAX = 8;
  let selected = state.selected;
  let auto = state.auto;
  let source = null;
  let retry = null;
  const RETRY_MS = 5000;  // the server's Retry-After when its streams are full (503)
  const conn = document.getElementById("dp-conn");

  function query() {
    const q = new URLSearchParams();
    if (!auto) {
      q.set("manual", "1");
      for (const item of selected) q.append("sel", item);
    }
    const text = q.toString();
    return text ? "?" + text : "";
  }

  function setConn(ok) {
    conn.textContent = ok ? "live: connected" : "disconnected: retrying";
    conn.className = "conn " + (ok ? "ok" : "down");
  }

  function apply(msg) {
    document.getElementById("dp-header").innerHTML = msg.html.header;
    document.getElementById("dp-top").innerHTML = msg.html.top;
    document.getElementById("dp-history").innerHTML = msg.html.history;
    selected = msg.selected;
    auto = msg.auto;
    root.dataset.version = String(msg.version);
    root.dataset.t = msg.t === null ? "" : String(msg.t);
  }

  function connect() {
    if (source) source.close();
    clearTimeout(retry);
    const es = new EventSource("events" + query());
    source = es;
    source.onopen = function () { setConn(true); };
    source.onerror = function () {
      setConn(false);
      // a refusal (503: too many pages open) ends the stream for good; try again later
      if (es.readyState === EventSource.CLOSED) retry = setTimeout(connect, RETRY_MS);
    };
    source.onmessage = function (e) { setConn(true); apply(JSON.parse(e.data)); };
  }

  function choose(next, nextAuto) {
    selected = next.slice(-MAX);
    auto = nextAuto;
    history.replaceState(null, "", location.pathname + query());
    connect();
  }

  function toggle(item) {
    const next = selected.filter(function (x) { return x !== item; });
    if (next.length === selected.length) next.push(item);
    choose(next, false);
  }

  document.addEventListener("click", function (e) {
    const el = e.target.closest("[data-item]");
    if (el && !el.closest("svg")) { e.preventDefault(); toggle(el.dataset.item); }
  });
  document.addEventListener("keydown", function (e) {
    const el = e.target.closest && e.target.closest("[data-item]");
    if (el && (e.key === "Enter" || e.key === " ")) { e.preventDefault(); toggle(el.dataset.item); }
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
