// Tidewire dashboard, dynamic security panel: the run-time users (clients) and roles of /api/v1/security, made and
// removed here, and each role's ACLs added and removed. Hidden while dynamic security is off. User names, role names
// and topics are chosen by admins: they reach the page through textContent only (never innerHTML). Passwords are
// sent once, never shown (the API never answers them).
"use strict";

(() => {
  const REFRESH_MS = 2000;
  const REQUEST_TIMEOUT_MS = 5000;
  const ACL_TYPES = ["publishClientSend", "publishClientReceive", "subscribeLiteral", "subscribePattern",
    "unsubscribeLiteral", "unsubscribePattern"];
  const $ = (id) => document.getElementById(id);
  let busy = false;
  let lastShown = "";

  async function call(path, options = {}) {
    // The token the main dashboard script keeps in its field (from the address, storage or the form).
    const token = $("token").value.trim();
    const headers = { Accept: "application/json", "Content-Type": "application/json" };
    if (token) headers.Authorization = "Bearer " + token;
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), REQUEST_TIMEOUT_MS);
    try {
      const resp = await fetch("api/v1/security" + path, { ...options, headers, cache: "no-store",
        signal: controller.signal });
      let body = null;
      if (resp.status !== 204) { try { body = await resp.json(); } catch (e) { body = null; } }
      if (!resp.ok) {
        const err = new Error(body && typeof body.error === "string" ? body.error : "HTTP " + resp.status);
        err.status = resp.status;
        throw err;
      }
      return body;
    } finally {
      clearTimeout(timer);
    }
  }

  function cell(tr, text) {
    const td = tr.insertCell();
    td.textContent = text;
    return td;
  }

  function button(td, cls, label) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = cls;
    b.textContent = label;
    td.append(b);
    return b;
  }

  function say(text) { $("dynsec-message").textContent = text; }

  function renderClients(clients) {
    const body = $("dynsec-clients").tBodies[0];
    body.replaceChildren();
    if (!clients.length) { cell(body.insertRow(), "no users").className = "empty"; return; }
    for (const c of clients) {
      const tr = body.insertRow();
      tr.dataset.username = c.username;
      cell(tr, c.username);
      cell(tr, c.clientid || "");
      cell(tr, (c.roles || []).map((r) => r.rolename).join(", "));
      cell(tr, c.disabled ? "disabled" : "enabled");
      cell(tr, c.tenant || "");
      button(cell(tr, ""), "dynsec-client-delete", "delete");
    }
  }

  function renderRoles(roles) {
    const body = $("dynsec-roles").tBodies[0];
    body.replaceChildren();
    if (!roles.length) { cell(body.insertRow(), "no roles").className = "empty"; return; }
    for (const r of roles) {
      const tr = body.insertRow();
      tr.dataset.rolename = r.rolename;
      cell(tr, r.rolename);
      const acls = cell(tr, "");
      for (const a of r.acls || []) {
        const line = document.createElement("div");
        line.className = "dynsec-acl";
        line.dataset.acltype = a.acltype;
        line.dataset.topic = a.topic;
        const text = document.createElement("span");
        text.textContent = `${a.allow ? "allow" : "deny"} ${a.acltype} ${a.topic} (${a.priority})`;
        line.append(text, " ");
        button(line, "dynsec-acl-remove", "remove");
        acls.append(line);
      }
      button(cell(tr, ""), "dynsec-role-delete", "delete");
    }
  }

  async function refresh() {
    if (busy || !$("token").value.trim()) return;
    busy = true;
    try {
      const [clients, roles] = [await call("/clients"), await call("/roles")];
      $("security-section").hidden = false;
      // Rendered only when changed: a row under the pointer is not replaced between two clicks.
      const shown = JSON.stringify([clients.data, roles.data]);
      if (shown !== lastShown) {
        lastShown = shown;
        renderClients(clients.data);
        renderRoles(roles.data);
      }
    } catch (e) {
      if (e.status === 404) $("security-section").hidden = true;  // dynamic security is off on this node
      else if (e.status !== 401) say(e.message);
    } finally {
      busy = false;
    }
  }

  async function act(what, fn) {
    say("");
    try { await fn(); } catch (e) { say(`${what}: ${e.message}`); }
    await refresh();
  }

  function init() {
    const select = $("dynsec-acl-type");
    for (const t of ACL_TYPES) {
      const o = document.createElement("option");
      o.value = t;
      o.textContent = t;
      select.append(o);
    }
    $("dynsec-client-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const body = { username: $("dynsec-username").value.trim(), password: $("dynsec-password").value };
      const role = $("dynsec-client-role").value.trim();
      const tenant = $("dynsec-tenant").value.trim();
      if (role) body.roles = [{ rolename: role }];
      if (tenant) body.tenant = tenant;
      act("create user", async () => {
        await call("/clients", { method: "POST", body: JSON.stringify(body) });
        $("dynsec-password").value = "";
      });
    });
    $("dynsec-role-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      act("create role", () => call("/roles", { method: "POST",
        body: JSON.stringify({ rolename: $("dynsec-rolename").value.trim() }) }));
    });
    $("dynsec-acl-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const role = $("dynsec-acl-role").value.trim();
      const acl = { acltype: select.value, topic: $("dynsec-acl-topic").value, allow: $("dynsec-acl-allow").checked,
        priority: Number($("dynsec-acl-priority").value) || 0 };
      act("add ACL", () => call(`/roles/${encodeURIComponent(role)}/acls`, { method: "POST",
        body: JSON.stringify(acl) }));
    });
    $("dynsec-clients").tBodies[0].addEventListener("click", (ev) => {
      const b = ev.target.closest("button.dynsec-client-delete");
      if (!b) return;
      const name = b.closest("tr").dataset.username;
      if (!confirm(`Delete user ${name}? Its connections close.`)) return;
      act("delete user", () => call(`/clients/${encodeURIComponent(name)}`, { method: "DELETE" }));
    });
    $("dynsec-roles").tBodies[0].addEventListener("click", (ev) => {
      const b = ev.target.closest("button.dynsec-role-delete, button.dynsec-acl-remove");
      if (!b) return;
      const role = b.closest("tr").dataset.rolename;
      if (b.classList.contains("dynsec-role-delete")) {
        if (!confirm(`Delete role ${role}?`)) return;
        act("delete role", () => call(`/roles/${encodeURIComponent(role)}`, { method: "DELETE" }));
      } else {
        const line = b.closest(".dynsec-acl");
        const query = new URLSearchParams({ acltype: line.dataset.acltype, topic: line.dataset.topic });
        act("remove ACL", () => call(`/roles/${encodeURIComponent(role)}/acls?${query}`, { method: "DELETE" }));
      }
    });
    refresh();
    setInterval(refresh, REFRESH_MS);
  }

  init();
})();
