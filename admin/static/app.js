// Tidewire dashboard: polls the node's admin API and shows live rates, top topics, clients and members.
// Client ids and topics are chosen by clients, so every such string reaches the page through textContent
// (never innerHTML).
"use strict";

(() => {
  const TICK_MS = 1000;          // /api/v1/stats period; rates are deltas between two answers
  const CLIENTS_EVERY = 2;       // ticks between clients and status refreshes
  const NODES_EVERY = 5;         // ticks between cluster member refreshes
  const HISTORY = 60;            // sparkline samples kept (one per tick)
  const CLIENT_LIMIT = 100;      // clients rows shown (the search narrows them)
  const REQUEST_TIMEOUT_MS = 5000;
  const TOKEN_KEY = "tidewire.apiToken";

  const $ = (id) => document.getElementById(id);
  const state = {
    token: "",
    prev: null,                  // last stats answer, for deltas
    history: { in: [], out: [], bytesIn: [], bytesOut: [], connections: [] },
    tick: 0,
    busy: new Set(),             // resources with a request in flight
    clientsSeq: 0,               // answers to an older search are dropped
  };

  // -- token ---------------------------------------------------------------------------------------------

  function storage(action, value) {
    try {
      if (action === "get") return localStorage.getItem(TOKEN_KEY) || "";
      localStorage.setItem(TOKEN_KEY, value);
    } catch (e) {
      // storage disabled (private mode, file://): the token lives for this page only
    }
    return "";
  }

  function initialToken() {
    const m = /(?:^#|&)token=([^&]*)/.exec(location.hash);
    if (m) {
      let token = "";
      try { token = decodeURIComponent(m[1]); } catch (e) { token = m[1]; }
      storage("set", token);
      // Do not leave the token in the address bar (history, screenshots, shoulder surfing).
      history.replaceState(null, "", location.pathname + location.search);
      return token;
    }
    return storage("get");
  }

  function setAuthorized(ok) {
    $("auth-message").textContent = ok ? "" : "token required";
    document.body.classList.toggle("unauthorized", !ok);
  }

  // -- API -----------------------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  async function api(path, options = {}) {
    const headers = { Accept: "application/json" };
    if (state.token) headers.Authorization = "Bearer " + state.token;
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), REQUEST_TIMEOUT_MS);
    let resp;
    try {
      resp = await fetch(path, { ...options, headers, cache: "no-store", signal: controller.signal });
    } catch (e) {
      throw new ApiError(0, "node unreachable");
    } finally {
      clearTimeout(timer);
    }
    if (resp.status === 401) {
      setAuthorized(false);
      throw new ApiError(401, "token required");
    }
    setAuthorized(true);
    if (!resp.ok) {
      let message = resp.statusText || "HTTP " + resp.status;
      try {
        const body = await resp.json();
        if (body && typeof body.error === "string") message = body.error;
      } catch (e) { /* not JSON: keep the status text */ }
      throw new ApiError(resp.status, message);
    }
    return resp.status === 204 ? null : resp.json();
  }

  // Run `fn` unless the previous run for `name` is still waiting on the network.
  async function guarded(name, fn, force = false) {
    if (state.busy.has(name) && !force) return;
    state.busy.add(name);
    try { await fn(); } catch (e) { if (e.status !== 401) showStatusError(e); } finally { state.busy.delete(name); }
  }

  // -- formatting ----------------------------------------------------------------------------------------

  const num = (v) => (typeof v === "number" && Number.isFinite(v) ? v : 0);

  function fmtRate(v) {
    if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (v >= 1e4) return (v / 1e3).toFixed(1) + "k";
    return v < 10 ? v.toFixed(1) : String(Math.round(v));
  }

  function fmtBytes(v) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i === 0 ? String(Math.round(v)) : v.toFixed(1)) + " " + units[i];
  }

  function fmtDuration(s) {
    s = Math.floor(num(s));
    const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
    if (d) return `${d}d ${h}h`;
    if (h) return `${h}h ${m}m`;
    return m ? `${m}m ${s % 60}s` : `${s % 60}s`;
  }

  function fmtTime(epoch) {
    if (typeof epoch !== "number") return "–";
    const t = new Date(epoch * 1000);
    const pad = (n) => String(n).padStart(2, "0");
    return `${t.getFullYear()}-${pad(t.getMonth() + 1)}-${pad(t.getDate())} ` +
           `${pad(t.getHours())}:${pad(t.getMinutes())}:${pad(t.getSeconds())}`;
  }

  const text = (v) => (v === null || v === undefined ? "–" : String(v));

  // -- drawing -------------------------------------------------------------------------------------------

  function pushSample(list, value) {
    list.push(value);
    if (list.length > HISTORY) list.shift();
  }

  function sparkline(canvas, values) {
    const ratio = window.devicePixelRatio || 1;
    const w = canvas.clientWidth || canvas.width, h = canvas.clientHeight || canvas.height;
    if (canvas.width !== Math.round(w * ratio)) {
      canvas.width = Math.round(w * ratio);
      canvas.height = Math.round(h * ratio);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, w, h);
    if (values.length < 2) return;
    const max = Math.max(...values) || 1;
    const step = w / (HISTORY - 1);
    const x0 = w - (values.length - 1) * step;
    ctx.beginPath();
    values.forEach((v, i) => {
      const x = x0 + i * step, y = h - 2 - (v / max) * (h - 4);
      if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    const color = getComputedStyle(document.documentElement).getPropertyValue("--accent").trim() || "#1f6feb";
    ctx.strokeStyle = color;
    ctx.lineWidth = 1.5;
    ctx.stroke();
    ctx.lineTo(w, h);
    ctx.lineTo(x0, h);
    ctx.closePath();
    ctx.globalAlpha = 0.12;
    ctx.fillStyle = color;
    ctx.fill();
    ctx.globalAlpha = 1;
  }

  // Update `tbody` in place to one row per item (rows keyed by `attr`), so that rows and their buttons
  // survive refreshes instead of being rebuilt under the user's pointer.
  function syncRows(tbody, items, attr, keyOf, cellsOf, numeric, decorate) {
    for (const tr of Array.from(tbody.rows)) if (!tr.hasAttribute(attr)) tr.remove();
    const existing = new Map(Array.from(tbody.rows, (tr) => [tr.getAttribute(attr), tr]));
    items.forEach((item, index) => {
      const key = String(keyOf(item));
      let tr = existing.get(key);
      if (tr) {
        existing.delete(key);
      } else {
        tr = document.createElement("tr");
        tr.setAttribute(attr, key);
      }
      const cells = cellsOf(item);
      while (tr.cells.length < cells.length) tr.insertCell();
      cells.forEach((value, i) => {
        const td = tr.cells[i];
        if (td.textContent !== value) { td.textContent = value; td.title = value; }
        td.classList.toggle("num", numeric.includes(i));
      });
      if (decorate) decorate(tr, cells.length);
      if (tbody.rows[index] !== tr) tbody.insertBefore(tr, tbody.rows[index] || null);
    });
    for (const tr of existing.values()) tr.remove();
    if (items.length === 0) {
      const td = tbody.insertRow().insertCell();
      td.colSpan = tbody.parentElement.tHead.rows[0].cells.length;
      td.className = "empty";
      td.textContent = "none";
    }
  }

  // -- views ---------------------------------------------------------------------------------------------

  function showStatusError(e) {
    $("status").textContent = "error: " + e.message;
  }

  function showMessage(message) {
    $("message").textContent = message;
  }

  async function refreshStats() {
    const s = await api("api/v1/stats");
    const now = num(s.time) || Date.now() / 1000;
    const prev = state.prev;
    state.prev = { ...s, time: now };
    const h = state.history;
    $("connections").textContent = String(num(s.connections));
    pushSample(h.connections, num(s.connections));
    if (prev && now > prev.time) {
      const dt = now - prev.time;
      // A restarted node resets its counters: a negative delta counts as zero.
      const rate = (k) => Math.max(0, (num(s[k]) - num(prev[k])) / dt);
      const r = { in: rate("messages_in"), out: rate("messages_out"),
                  bytesIn: rate("bytes_in"), bytesOut: rate("bytes_out") };
      $("rate-in").textContent = fmtRate(r.in);
      $("rate-out").textContent = fmtRate(r.out);
      $("bytes-in").textContent = fmtBytes(r.bytesIn);
      $("bytes-out").textContent = fmtBytes(r.bytesOut);
      for (const k of Object.keys(r)) pushSample(h[k], r[k]);
    }
    sparkline($("spark-in"), h.in);
    sparkline($("spark-out"), h.out);
    sparkline($("spark-bytes-in"), h.bytesIn);
    sparkline($("spark-bytes-out"), h.bytesOut);
    sparkline($("spark-connections"), h.connections);
    const topics = Array.isArray(s.top_topics) ? s.top_topics : [];
    syncRows($("topics").tBodies[0], topics, "data-topic", (t) => t.topic,
             (t) => [text(t.topic), String(num(t.messages))], [1]);
  }

  async function refreshStatus() {
    const s = await api("api/v1/status");
    const parts = [`node ${text(s.node_id)}`, `version ${text(s.version)}`, `${text(s.store)} store`,
                   `up ${fmtDuration(s.uptime_s)}`, `${num(s.sessions_online)} sessions online`,
                   `${num(s.subscriptions)} subscriptions`, `${num(s.dropped)} dropped`];
    if (s.cluster && typeof s.cluster === "object") parts.push(`cluster epoch ${text(s.cluster.epoch)}`);
    if (s.draining) parts.push("DRAINING");
    $("status").textContent = parts.join(" · ");
  }

  async function refreshNodes() {
    const answer = await api("api/v1/nodes");
    const nodes = Array.isArray(answer.data) ? answer.data : [];
    syncRows($("nodes").tBodies[0], nodes, "data-node-id", (n) => n.node_id,
             (n) => [text(n.node_id) + (n.self ? " (this node)" : ""), text(n.address)], []);
  }

  async function refreshClients() {
    const seq = ++state.clientsSeq;
    const params = new URLSearchParams({ limit: String(CLIENT_LIMIT) });
    const search = $("client-search").value.trim();
    if (search) params.set("client_id", search);
    const answer = await api("api/v1/clients?" + params.toString());
    if (seq !== state.clientsSeq) return;
    const clients = Array.isArray(answer.data) ? answer.data : [];
    const total = answer.meta && typeof answer.meta.count === "number" ? answer.meta.count : clients.length;
    $("clients-count").textContent = total > clients.length ? `(${clients.length} of ${total})` : `(${total})`;
    syncRows($("clients").tBodies[0], clients, "data-client-id", (c) => c.client_id, (c) => [
      text(c.client_id), text(c.username), text(c.peer), `${text(c.protocol)} ${text(c.proto_ver)}`,
      text(c.keepalive), String(num(c.subscriptions)), String(num(c.inflight)), fmtTime(c.connected_at),
    ], [4, 5, 6], addKickButton);
  }

  function addKickButton(tr, column) {
    if (tr.cells.length > column) return;
    const button = document.createElement("button");
    button.type = "button";
    button.className = "kick";
    button.textContent = "Kick";
    tr.insertCell().appendChild(button);
  }

  async function kick(tr, button) {
    const id = tr.getAttribute("data-client-id");
    button.disabled = true;
    try {
      await api("api/v1/clients/" + encodeURIComponent(id), { method: "DELETE" });
      tr.remove();
      showMessage("");
    } catch (e) {
      button.disabled = false;
      showMessage(`kick ${id}: ${e.message}`);
    }
    guarded("clients", refreshClients, true);  // forced: an answer already on its way predates the kick
  }

  // -- wiring --------------------------------------------------------------------------------------------

  function refreshAll() {
    guarded("stats", refreshStats);
    guarded("status", refreshStatus);
    guarded("clients", refreshClients);
    guarded("nodes", refreshNodes);
  }

  function onTick() {
    if (document.hidden) return;
    state.tick++;
    guarded("stats", refreshStats);
    if (state.tick % CLIENTS_EVERY === 0) {
      guarded("status", refreshStatus);
      guarded("clients", refreshClients);
    }
    if (state.tick % NODES_EVERY === 0) guarded("nodes", refreshNodes);
  }

  function useToken(token) {
    state.token = token;
    $("token").value = token;
    refreshAll();
  }

  function init() {
    state.token = initialToken();
    $("token").value = state.token;
    window.addEventListener("hashchange", () => { if (/token=/.test(location.hash)) useToken(initialToken()); });
    $("token-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      storage("set", $("token").value.trim());
      useToken($("token").value.trim());
    });
    let searchTimer = 0;
    $("client-search").addEventListener("input", () => {
      clearTimeout(searchTimer);
      searchTimer = setTimeout(() => guarded("clients", refreshClients, true), 200);
    });
    $("clients").tBodies[0].addEventListener("click", (ev) => {
      const button = ev.target.closest("button.kick");
      if (button && !button.disabled) kick(button.closest("tr"), button);
    });
    refreshAll();
    setInterval(onTick, TICK_MS);
  }

  init();
})();
