// The ledgerq dashboard. Every value is put on the page with textContent (never as
// HTML), the token lives in sessionStorage and travels only in the Authorization header,
// and the page polls the API once a second instead of reloading.
"use strict";

const TOKEN_KEY = "ledgerq-token";
const POLL_MS = 1000;
const DEPTH_SAMPLES = 120;
const depth = [];
let timer = null;
let diagramsShown = false;

function token() { return sessionStorage.getItem(TOKEN_KEY); }

class Unauthorized extends Error {}

async function api(path, asBlob) {
  const headers = { "Accept": asBlob ? "image/svg+xml" : "application/json" };
  const t = token();
  if (t) headers["Authorization"] = "Bearer " + t;
  const response = await fetch(path, { headers, cache: "no-store" });
  if (response.status === 401) throw new Unauthorized("token refused");
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail; } catch (e) { /* not JSON */ }
    throw new Error(path + ": " + response.status + " " + detail);
  }
  return asBlob ? response.blob() : response.json();
}

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  if (seconds < 60) return seconds.toFixed(1) + "s";
  if (seconds < 3600) return (seconds / 60).toFixed(1) + "m";
  return (seconds / 3600).toFixed(1) + "h";
}

function when(epoch) { return epoch ? new Date(epoch * 1000).toLocaleString() : "-"; }

function entityHref(name, id) {
  return "#/entity/" + encodeURIComponent(name) + (id === undefined ? "" : "/" + encodeURIComponent(id));
}

function taskLink(id) {
  const a = el("a", id);
  a.href = "#/task/" + encodeURIComponent(id);
  return a;
}

function fillRows(tableId, rows, cells) {
  const body = document.querySelector("#" + tableId + " tbody");
  const fresh = document.createElement("tbody");
  for (const row of rows) {
    const tr = document.createElement("tr");
    tr.dataset.id = row.id || row.worker_id || "";
    for (const c of cells(row)) tr.appendChild(c);
    fresh.appendChild(tr);
  }
  body.replaceWith(fresh);
}

function td(value, cls) {
  const cell = el("td", null, cls);
  if (value instanceof Node) cell.appendChild(value); else cell.textContent = value ?? "";
  return cell;
}

function statusCell(status) { return td(el("span", status, "status " + status)); }

function show(section) {
  for (const id of ["login", "overview", "task", "entity", "entity-row"]) {
    document.getElementById(id).hidden = id !== section;
  }
  document.getElementById("logout").hidden = section === "login" || !token();
}

function drawCounts(id, counts) {
  const cards = document.createElement("div");
  cards.className = "cards"; cards.id = id;
  for (const [state, n] of Object.entries(counts)) {
    const card = el("div", null, "card");
    card.dataset.status = state;
    card.appendChild(el("div", n, "n"));
    card.appendChild(el("div", state, "s"));
    cards.appendChild(card);
  }
  document.getElementById(id).replaceWith(cards);
}

function drawDepth() {
  const svg = document.getElementById("depth");
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const max = Math.max(1, ...depth);
  const w = svg.width.baseVal.value, h = svg.height.baseVal.value;
  const points = depth.map((v, i) =>
    (i * w / (DEPTH_SAMPLES - 1)).toFixed(1) + "," + (h - 4 - (v / max) * (h - 8)).toFixed(1));
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", points.join(" "));
  svg.appendChild(line);
  const label = document.createElementNS("http://www.w3.org/2000/svg", "text");
  label.setAttribute("x", "4"); label.setAttribute("y", "12"); label.setAttribute("font-size", "10");
  label.textContent = "max " + max;
  svg.appendChild(label);
}

async function showDiagrams() {
  if (diagramsShown) return;
  diagramsShown = true;
  const box = document.getElementById("diagrams");
  while (box.firstChild) box.removeChild(box.firstChild);
  for (const spec of await api("/api/specs")) {
    const blob = await api("/api/specs/" + encodeURIComponent(spec.entity) + "/diagram.svg", true);
    const img = el("img");
    img.alt = spec.entity + " lifecycle";
    img.dataset.entity = spec.entity;
    img.src = URL.createObjectURL(blob);
    const heading = el("h4");
    const link = el("a", spec.entity);
    link.href = entityHref(spec.entity);
    heading.appendChild(link);
    heading.appendChild(document.createTextNode(" (" + spec.table + ")"));
    box.appendChild(heading);
    box.appendChild(img);
  }
}

// Figures from a read replica are as of its last replayed commit: say when, and how far
// behind the server's clock that is, so nobody takes a lagging replica's page for now.
function showAsOf(stats) {
  const line = document.getElementById("as-of");
  line.hidden = stats.as_of === null || stats.as_of === undefined;
  if (!line.hidden) {
    const behind = Math.max(0, stats.now - stats.as_of);
    line.textContent = "replica as of " + when(stats.as_of) +
      (behind >= 1 ? " (" + age(behind) + " behind)" : " (current)");
  }
}

async function refreshOverview() {
  const now = Date.now() / 1000;
  const [stats, running, failures, recent, schedules] = await Promise.all([
    api("/api/stats"),
    api("/api/tasks?status=running&limit=50"),
    api("/api/tasks?outcome=failed&limit=10"),
    api("/api/tasks?limit=25"),
    api("/api/schedules"),
  ]);
  drawCounts("counts", stats.counts);
  showAsOf(stats);
  depth.push(stats.counts.queued || 0);
  while (depth.length > DEPTH_SAMPLES) depth.shift();
  drawDepth();
  document.getElementById("oldest").textContent = age(stats.oldest_queued_age_seconds);
  const unserved = stats.unserved_kinds || [];
  document.getElementById("unserved").textContent = unserved.join(", ");
  document.getElementById("unserved-line").hidden = unserved.length === 0;
  fillRows("workers", stats.workers, (w) => [td(w.worker_id, "id"), td(w.hostname),
    td(age(w.heartbeat_age_seconds)), td(w.running)]);
  fillRows("running", running.items, (r) => [td(taskLink(r.id), "id"), td(r.action_kind),
    td(r.leased_by), td(r.lease_expires_at ? age(r.lease_expires_at - now) : "-")]);
  fillRows("failures", failures.items, (r) => [td(taskLink(r.id), "id"), statusCell(r.status),
    td(r.status_reason_code), td(r.error_detail, "detail")]);
  fillRows("schedules", schedules, (s) => [td(s.name), statusCell(s.status),
    td(s.cron || (s.every_seconds ? s.every_seconds + "s" : "-")),
    td(s.next_fire_at ? when(s.next_fire_at) : "-"),
    s.last_fire ? statusCell(s.last_fire.status) : td("-")]);
  fillRows("tasks", recent.items, (r) => [td(taskLink(r.id), "id"), statusCell(r.status),
    td(r.action_kind), td(r.execution_target), td(r.queue ?? "-", "queue"),
    td(r.priority === undefined ? "-" : String(r.priority), "priority"),
    td(when(r.created_at))]);
  await showDiagrams();
}

async function refreshTask(id) {
  const detail = await api("/api/tasks/" + encodeURIComponent(id));
  document.getElementById("task-id").textContent = id;
  const badge = document.getElementById("task-status");
  badge.textContent = detail.run.status;
  badge.className = "status " + detail.run.status;
  const body = document.createElement("tbody");
  for (const [key, value] of Object.entries(detail.run)) {
    const tr = document.createElement("tr");
    tr.appendChild(el("th", key));
    const shown = value !== null && typeof value === "object" ? JSON.stringify(value) : value;
    tr.appendChild(td(shown, key === "error_detail" ? "detail" : ""));
    body.appendChild(tr);
  }
  document.querySelector("#task-row tbody").replaceWith(body);
  drawTimeline("timeline", detail.history);
}

function fieldsTable(row) {
  const body = document.createElement("tbody");
  for (const [key, value] of Object.entries(row)) {
    const tr = document.createElement("tr");
    tr.appendChild(el("th", key));
    const shown = value !== null && typeof value === "object" ? JSON.stringify(value) : value;
    tr.appendChild(td(shown));
    body.appendChild(tr);
  }
  return body;
}

function drawTimeline(listId, history) {
  const list = document.createElement("ol");
  list.id = listId; list.className = "timeline";
  for (const fact of history) {
    const li = el("li");
    li.dataset.status = fact.status;
    li.appendChild(el("div", when(fact.created_at) + "  v" + fact.entity_version, "when"));
    const move = el("div");
    move.appendChild(el("span", (fact.previous_status || "(created)") + " \u2192 "));
    move.appendChild(el("span", fact.status, "status " + fact.status));
    move.appendChild(el("span", "  " + fact.reason_code));
    li.appendChild(move);
    const who = [fact.actor, fact.reason_summary].filter(Boolean).join(" \u2014 ");
    if (who) li.appendChild(el("div", who, "muted"));
    list.appendChild(li);
  }
  document.getElementById(listId).replaceWith(list);
}

let entityDiagram = { name: null, url: null };

async function refreshEntity(name) {
  const [all, page] = await Promise.all([
    api("/api/entities"),
    api("/api/entities/" + encodeURIComponent(name) + "?limit=25"),
  ]);
  const summary = all.find((e) => e.entity === name);
  if (!summary) throw new Error("no entity " + name);
  document.getElementById("entity-name").textContent = name;
  document.getElementById("entity-table").textContent = "table " + summary.table;
  document.getElementById("entity-description").textContent = summary.description;
  drawCounts("entity-counts", summary.counts);
  // The diagram labels each state with its count: drawn again each tick, the old
  // image's object URL released.
  const blob = await api("/api/specs/" + encodeURIComponent(name) + "/diagram.svg?counts=true", true);
  const img = el("img");
  img.alt = name + " lifecycle with counts";
  img.dataset.entity = name;
  img.src = URL.createObjectURL(blob);
  const box = document.getElementById("entity-diagram");
  while (box.firstChild) box.removeChild(box.firstChild);
  box.appendChild(img);
  if (entityDiagram.url) URL.revokeObjectURL(entityDiagram.url);
  entityDiagram = { name, url: img.src };
  fillRows("entity-rows", page.items, (r) => {
    const link = el("a", r.id);
    link.href = entityHref(name, r.id);
    return [td(link, "id"), statusCell(r.status), td(r.status_reason_code),
      td(when(r.updated_at)), td(when(r.created_at))];
  });
}

async function refreshEntityRow(name, id) {
  const detail = await api("/api/entities/" + encodeURIComponent(name) + "/" + encodeURIComponent(id));
  const back = document.getElementById("row-entity");
  back.textContent = name;
  back.href = entityHref(name);
  document.getElementById("row-id").textContent = id;
  const badge = document.getElementById("row-status");
  badge.textContent = detail.row.status;
  badge.className = "status " + detail.row.status;
  document.querySelector("#row-fields tbody").replaceWith(fieldsTable(detail.row));
  drawTimeline("row-timeline", detail.history);
}

function route() {
  const hash = location.hash || "#/";
  if (hash.startsWith("#/entity/")) {
    try {
      const [name, id] = hash.slice(9).split("/").map(decodeURIComponent);
      if (!name) return { view: "overview" };
      return id ? { view: "entity-row", name, id } : { view: "entity", name };
    } catch (err) {
      return { view: "overview", problem: "not an entity address: " + hash };
    }
  }
  if (hash.startsWith("#/task/")) {
    // A hand-edited or truncated address (#/task/%E0%A4%A) is no id: say so and show the
    // overview, rather than throw on every tick and leave the last view standing.
    try {
      return { view: "task", id: decodeURIComponent(hash.slice(7)) };
    } catch (err) {
      return { view: "overview", problem: "not a task address: " + hash };
    }
  }
  return { view: "overview" };
}

async function tick() {
  const where = route();
  const problem = document.getElementById("error");
  try {
    if (where.view === "task") await refreshTask(where.id);
    else if (where.view === "entity") await refreshEntity(where.name);
    else if (where.view === "entity-row") await refreshEntityRow(where.name, where.id);
    else await refreshOverview();
    show(where.view);
    problem.textContent = where.problem || "";
    document.getElementById("live").textContent = "live \u00b7 " + new Date().toLocaleTimeString();
  } catch (err) {
    if (err instanceof Unauthorized) {
      stop();
      if (token()) document.getElementById("login-error").textContent = "That token was refused.";
      sessionStorage.removeItem(TOKEN_KEY);
      show("login");
      return;
    }
    problem.textContent = String(err.message || err);
  }
}

function stop() { if (timer !== null) { clearInterval(timer); timer = null; } }

function start() {
  stop();
  tick();
  timer = setInterval(tick, POLL_MS);
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = document.getElementById("token");
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    input.value = "";
    document.getElementById("login-error").textContent = "";
    diagramsShown = false;
    start();
  });
  document.getElementById("logout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    stop();
    show("login");
  });
  window.addEventListener("hashchange", start);
  start();
});
