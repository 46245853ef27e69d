// Tidewire dashboard, tenants panel: every tenant of this node (GET /api/v1/tenants) with its mount point,
// connections against its limit, messages in and out, retained bytes against its cap and what its limits refused. Hidden while the node has no
// tenant. It reads the token app.js keeps (localStorage), so it never asks for one itself. Tenant names come
// from settings or signed tokens, mount points from them: still put on the page as text (textContent) only.
"use strict";

(() => {
  const EVERY_MS = 2000;
  const TIMEOUT_MS = 5000;
  const TOKEN_KEY = "tidewire.apiToken";

  const $ = (id) => document.getElementById(id);

  function token() {
    try { return localStorage.getItem(TOKEN_KEY) || ""; } catch (e) { return ""; }
  }

  function limit(value) {
    return value ? String(value) : "∞";
  }

  function refusedText(refused) {
    const parts = Object.keys(refused).sort().filter((k) => refused[k]).map((k) => `${k} ${refused[k]}`);
    return parts.length ? parts.join(", ") : "0";
  }

  function render(tenants) {
    const section = $("tenants-section");
    section.hidden = tenants.length === 0;
    section.setAttribute("data-answered", "1");  // what a test waits for: the panel has had an answer
    $("tenants-count").textContent = tenants.length ? `(${tenants.length})` : "";
    const tbody = $("tenants").querySelector("tbody");
    const rows = tenants.map((t) => {
      const tr = document.createElement("tr");
      tr.setAttribute("data-tenant", t.name);
      const cells = [
        [t.name, ""], [t.mount, ""], [`${t.connections} / ${limit(t.limits.max_connections)}`, "num"],
        [limit(t.limits.max_message_rate), "num"], [String(t.messages_in), "num"], [String(t.messages_out), "num"],
        [t.retained_bytes === null ? "-" : `${t.retained_bytes} / ${t.limits.max_retained_bytes}`, "num"],
        [refusedText(t.refused), ""],
      ];
      for (const [text, cls] of cells) {
        const td = document.createElement("td");
        td.textContent = text;
        if (cls) td.className = cls;
        tr.appendChild(td);
      }
      return tr;
    });
    tbody.replaceChildren(...rows);
  }

  async function refresh() {
    const secret = token();
    if (!secret) return;
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), TIMEOUT_MS);
    try {
      const r = await fetch("api/v1/tenants?limit=1000", {
        headers: { Authorization: `Bearer ${secret}` }, signal: controller.signal, cache: "no-store",
      });
      if (r.ok) render((await r.json()).data);
    } catch (e) {
      // the node is away or slow: the next refresh tries again, the table keeps its last answer
    } finally {
      clearTimeout(timer);
    }
  }

  function start() {
    refresh();
    setInterval(refresh, EVERY_MS);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
