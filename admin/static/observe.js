// Tidewire dashboard, observability panel: the slowest subscribers (publish → PUBACK/PUBREC time) and each online
// client's counters, polled from /api/v1/slow-subscribers and /api/v1/client-stats. Client ids are chosen by
// clients: they reach the page through textContent only. The token is the one app.js keeps in localStorage.
"use strict";

(() => {
  const EVERY_MS = 2000;
  const CLIENT_LIMIT = 100;
  const TOKEN_KEY = "tidewire.apiToken";
  const REQUEST_TIMEOUT_MS = 5000;
  const $ = (id) => document.getElementById(id);
  let busy = false;

  function token() {
    try { return localStorage.getItem(TOKEN_KEY) || ""; } catch (e) { return ""; }
  }

  async function get(path) {
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), REQUEST_TIMEOUT_MS);
    try {
      const resp = await fetch(path, { headers: { Accept: "application/json", Authorization: "Bearer " + token() },
                                       cache: "no-store", signal: controller.signal });
      return resp.ok ? await resp.json() : null;
    } catch (e) {
      return null;
    } finally {
      clearTimeout(timer);
    }
  }

  const ms = (v) => (typeof v === "number" && Number.isFinite(v) ? v.toFixed(v < 10 ? 1 : 0) : "–");
  const count = (v) => (typeof v === "number" && Number.isFinite(v) ? String(v) : "–");

  // One row per item, keyed by client id, cells set through textContent.
  function fill(tbody, items, cellsOf, empty) {
    while (tbody.rows.length) tbody.deleteRow(0);
    if (!items.length) {
      const td = tbody.insertRow().insertCell();
      td.colSpan = tbody.parentElement.tHead.rows[0].cells.length;
      td.className = "muted";
      td.textContent = empty;
      return;
    }
    for (const item of items) {
      const tr = tbody.insertRow();
      tr.setAttribute("data-client-id", String(item.client_id));
      cellsOf(item).forEach((value, i) => {
        const td = tr.insertCell();
        td.textContent = value;
        td.title = value;
        if (i > 0) td.className = "num";
      });
    }
  }

  async function refresh() {
    if (busy || !token()) return;
    busy = true;
    try {
      const [slow, stats] = await Promise.all([get("/api/v1/slow-subscribers"),
                                               get(`/api/v1/client-stats?limit=${CLIENT_LIMIT}`)]);
      if (slow && Array.isArray(slow.data)) {
        $("slow-threshold").textContent = `(EWMA ≥ ${ms(slow.threshold_ms)} ms, top ${count(slow.top)})`;
        fill($("slow-subscribers").tBodies[0], slow.data,
             (r) => [String(r.client_id), ms(r.ack_ewma_ms), ms(r.ack_mean_ms), ms(r.ack_p99_ms), ms(r.ack_max_ms),
                     count(r.acks)], "no slow subscriber");
      }
      if (stats && Array.isArray(stats.data)) {
        fill($("client-stats").tBodies[0], stats.data,
             (r) => [String(r.client_id), count(r.messages_in), count(r.bytes_in), count(r.messages_out),
                     count(r.bytes_out), count(r.drops), count(r.retries), ms(r.ack_ewma_ms)], "no client");
      }
    } finally {
      busy = false;
    }
  }

  refresh();
  setInterval(refresh, EVERY_MS);
})();
