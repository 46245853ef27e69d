// Tidewire dashboard: polls the node's admin API and shows live rates, top topics, members, bridges, rules and
// clients. Client ids and topics are chosen by clients, rule names, statements and actions by whoever holds the
// token, errors quote remote peers: every such string reaches the page through textContent (never innerHTML).
"use strict";

(() => {
  const TICK_MS = 1000;          // /api/v1/stats period; rates are deltas between two answers
  const CLIENTS_EVERY = 2;       // ticks between clients and status refreshes
  const NODES_EVERY = 5;         // ticks between cluster member refreshes
  const RULES_EVERY = 2;         // ticks between rules refreshes (their counts are live)
  const BRIDGES_EVERY = 2;       // ticks between bridges refreshes (lag is measured on each request)
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
    rulesSeq: 0,                 // answers older than a change made here are dropped
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
    const headers = { Accept: "application/json", ...(options.headers || {}) };
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
  // survive refreshes instead of being rebuilt under the user's pointer. `decorate(tr, column, item)` adds what
  // is not text (buttons, state attributes) after the text cells; `empty` is the row shown for no items.
  function syncRows(tbody, items, attr, keyOf, cellsOf, numeric, decorate, empty = "none") {
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
      if (decorate) decorate(tr, cells.length, item);
      if (tbody.rows[index] !== tr) tbody.insertBefore(tr, tbody.rows[index] || null);
    });
    for (const tr of existing.values()) tr.remove();
    if (items.length === 0) {
      const td = tbody.insertRow().insertCell();
      td.colSpan = tbody.parentElement.tHead.rows[0].cells.length;
      td.className = "empty";
      td.textContent = empty;
    }
  }

  // -- views ---------------------------------------------------------------------------------------------

  function showStatusError(e) {
    $("status").textContent = "error: " + e.message;
  }

  function showMessage(message) {
    $("message").textContent = message;
  }

  function showRulesMessage(message) {
    $("rules-message").textContent = message;
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

  // -- bridges -------------------------------------------------------------------------------------------

  const fmtLagSeconds = (v) => (typeof v === "number" && Number.isFinite(v) ? v.toFixed(1) : "–");

  async function refreshBridges() {
    let bridges;
    try {
      const answer = await api("api/v1/bridges");
      bridges = Array.isArray(answer.data) ? answer.data : [];
    } catch (e) {
      if (e.status !== 404) throw e;
      bridges = [];  // a node without the bridges API has no bridges
    }
    $("bridges-section").hidden = bridges.length === 0;
    syncRows($("bridges").tBodies[0], bridges, "data-bridge-name", (b) => b.name, (b) => [
      text(b.name), text(b.state), text(b.address), String(num(b.sent)), String(num(b.acked)),
      String(num(b.received)), String(num(b.stored)), text(b.lag_messages), fmtLagSeconds(b.lag_seconds),
      b.last_error ? String(b.last_error) : "",
    ], [3, 4, 5, 6, 7, 8], (tr, column, b) => {
      tr.cells[1].setAttribute("data-state", String(b.state));
      tr.cells[column - 1].classList.add("error");
    });
  }

  // -- rules ---------------------------------------------------------------------------------------------

  const ruleUrl = (name) => "api/v1/rules/" + encodeURIComponent(name);

  // "type → target": where the rule's results go (a webhook's URL, a topic, an exchange and routing key).
  function fmtAction(a) {
    if (!a || typeof a !== "object") return "–";
    let target;
    if (a.type === "webhook") target = text(a.url);
    else if (a.type === "amqp") target = `${text(a.exchange)} key ${text(a.routing_key)}`;
    else if (a.type === "rocketmq") target = text(a.topic) + (a.tag ? ` tag ${text(a.tag)}` : "");
    else target = text(a.topic !== undefined ? a.topic : a.url);
    return `${text(a.type)} → ${target}`;
  }

  function ruleState(r) {
    if (!r.enabled) return "disabled";
    // enabled but not running on this node: its statement does not compile here, or it is starting
    return r.running ? "running" : "enabled, not running";
  }

  function decorateRule(tr, column, r) {
    tr.setAttribute("data-enabled", r.enabled ? "true" : "false");
    tr.classList.toggle("off", !r.enabled);
    tr.cells[0].title = r.description ? `${text(r.name)}: ${String(r.description)}` : text(r.name);
    tr.cells[1].classList.add("sql");
    tr.cells[3].setAttribute("data-state", r.enabled ? (r.running ? "running" : "stopped") : "disabled");
    tr.cells[column - 1].classList.add("error");
    if (tr.cells.length <= column) {
      const td = tr.insertCell();
      td.className = "actions";
      for (const [cls, label] of [["rule-toggle", ""], ["rule-delete", "Delete"]]) {
        const button = document.createElement("button");
        button.type = "button";
        button.className = cls;
        button.textContent = label;
        td.appendChild(button);
      }
    }
    const toggle = tr.cells[column].querySelector("button.rule-toggle");
    const label = r.enabled ? "Disable" : "Enable";
    if (toggle.textContent !== label) toggle.textContent = label;
  }

  async function refreshRules() {
    const seq = ++state.rulesSeq;
    let rules, empty = "no rules";
    try {
      const answer = await api("api/v1/rules");
      rules = Array.isArray(answer.data) ? answer.data : [];
    } catch (e) {
      // 503: this node runs no rule engine; 404: it predates rules. Said in the table, not as a node error.
      if (e.status !== 404 && e.status !== 503) throw e;
      rules = [];
      empty = e.status === 503 ? e.message : "this node has no rules API";
    }
    if (seq !== state.rulesSeq) return;
    $("rules-count").textContent = rules.length ? `(${rules.length})` : "";
    syncRows($("rules").tBodies[0], rules, "data-rule-name", (r) => r.name, (r) => {
      const c = r.counts && typeof r.counts === "object" ? r.counts : {};
      return [text(r.name), text(r.sql), fmtAction(r.action), ruleState(r), String(num(c.matched)),
              String(num(c.sent)), String(num(c.failed)), String(num(c.dead_lettered)),
              r.last_error ? String(r.last_error) : ""];
    }, [4, 5, 6, 7], decorateRule, empty);
  }

  async function toggleRule(tr, button) {
    const name = tr.getAttribute("data-rule-name");
    const enabled = tr.getAttribute("data-enabled") !== "true";
    button.disabled = true;
    try {
      await api(ruleUrl(name) + "/enabled", {
        method: "PUT", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ enabled }),
      });
      showRulesMessage("");
    } catch (e) {
      showRulesMessage(`${enabled ? "enable" : "disable"} ${name}: ${e.message}`);
    }
    // Forced: an answer already on its way predates the change. The button stays off until the row shows the
    // new state, so a second click cannot send the same change again.
    await guarded("rules", refreshRules, true);
    button.disabled = false;
  }

  async function deleteRule(tr, button) {
    const name = tr.getAttribute("data-rule-name");
    if (!window.confirm(`Delete the rule "${name}"? Its position in the log goes with it.`)) return;
    button.disabled = true;
    try {
      await api(ruleUrl(name), { method: "DELETE" });
      tr.remove();
      showRulesMessage("");
    } catch (e) {
      if (e.status === 404) {
        tr.remove();  // deleted already (another admin, another node)
      } else {
        button.disabled = false;
        showRulesMessage(`delete ${name}: ${e.message}`);
      }
    }
    guarded("rules", refreshRules, true);
  }

  // -- wiring --------------------------------------------------------------------------------------------

  function refreshAll() {
    guarded("stats", refreshStats);
    guarded("status", refreshStatus);
    guarded("clients", refreshClients);
    guarded("nodes", refreshNodes);
    guarded("rules", refreshRules);
    guarded("bridges", refreshBridges);
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
    if (state.tick % RULES_EVERY === 0) guarded("rules", refreshRules);
    if (state.tick % BRIDGES_EVERY === 0) guarded("bridges", refreshBridges);
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
    $("rules").tBodies[0].addEventListener("click", (ev) => {
      const button = ev.target.closest("button.rule-toggle, button.rule-delete");
      if (!button || button.disabled) return;
      if (button.classList.contains("rule-toggle")) toggleRule(button.closest("tr"), button);
      else deleteRule(button.closest("tr"), button);
    });
    refreshAll();
    setInterval(onTick, TICK_MS);
  }

  init();
})();
