// The vaecf page: search items, build a history, see recommendations and similar items, and the
// model card. Plain DOM and fetch, no libraries; every text from the server is set with
// textContent (never parsed as HTML). The state lives in the address, so that a view can be
// shared or bookmarked: #items=1,296&q=toy&similar=1&k=10

"use strict";

const state = {
  history: [], key: sessionStorage.getItem("vaecf-key") || "", k: 10, query: "", similar: null,
};

class Unauthorized extends Error {}

async function api(path, body) {
  const headers = {};
  if (state.key) headers["Authorization"] = "Bearer " + state.key;
  const init = { headers };
  if (body !== undefined) {
    init.method = "POST";
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  if (resp.status === 401) {
    $("key-form").hidden = false;
    throw new Unauthorized("this server needs an API key");
  }
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new Error(data.message || resp.status + " " + resp.statusText);
  return data;
}

function itemLabel(item) {
  const span = el("span", {});
  span.append(el("span", { class: "title", text: item.title || String(item.item_id) }));
  if (item.title) span.append(el("span", { class: "id", text: "#" + item.item_id }));
  return span;
}

function inHistory(id) {
  return state.history.some((h) => String(h.item_id) === String(id));
}

function addToHistory(item) {
  if (!inHistory(item.item_id)) state.history.push({ item_id: item.item_id, title: item.title });
  changed();
}

function actions(item) {
  const td = el("td", { class: "actions" });
  if (!inHistory(item.item_id)) {
    td.append(el("button", { type: "button", text: "add", onclick: () => addToHistory(item) }));
  }
  td.append(" ", el("button", { type: "button", text: "similar", onclick: () => showSimilar(item) }));
  return td;
}

// "because you liked A, B": the history items that led to a recommendation (explain)
function because(item) {
  if (!item.because || !item.because.length) return "";
  const names = item.because.map((b) => b.title || "#" + b.item_id);
  return el("span", { class: "because", text: "because you liked " + names.join(", ") });
}

function fillTable(tbody, items) {
  tbody.replaceChildren(
    ...items.map((item, i) =>
      el("tr", { "data-item": String(item.item_id) },
        el("td", { class: "num", text: String(i + 1) }),
        el("td", {}, itemLabel(item), because(item)),
        el("td", { class: "num", text: item.score.toPrecision(4) }),
        actions(item)))
  );
}

async function recommend() {
  try {
    const ids = state.history.map((h) => h.item_id);
    const r = await api("/v1/recommend", { items: ids, k: state.k, explain: ids.length > 0 });
    fillTable($("recs").tBodies[0], r.items);
    $("fallback").hidden = r.fallback !== "popular";
    say(r.unknown.length ? "not in the model (ignored): " + r.unknown.join(", ") : "");
  } catch (e) {
    if (!(e instanceof Unauthorized)) say("recommend: " + e.message);
  }
}

async function showSimilar(item) {
  try {
    const r = await api("/v1/items/" + encodeURIComponent(item.item_id) + "/similar?k=10");
    state.similar = item;
    writeAddress();
    $("similar-to").replaceChildren(itemLabel(item));
    fillTable($("similar").tBodies[0], r.items);
    $("similar-panel").hidden = false;
  } catch (e) {
    if (!(e instanceof Unauthorized)) say("similar items: " + e.message);
  }
}

let searchSeq = 0;
async function search(query) {
  state.query = query;
  writeAddress();
  const seq = ++searchSeq;
  if (!query.trim()) {
    $("found").replaceChildren();
    return;
  }
  try {
    const r = await api("/v1/items?limit=30&q=" + encodeURIComponent(query));
    if (seq !== searchSeq) return; // a newer search is under way
    $("found").replaceChildren(
      ...(r.items.length
        ? r.items.map((item) =>
            el("li", { "data-item": String(item.item_id) },
              itemLabel(item),
              inHistory(item.item_id)
                ? el("span", { class: "muted", text: "in history" })
                : el("button", { type: "button", text: "add", onclick: () => addToHistory(item) })))
        : [el("li", { class: "muted", text: "no item matches" })])
    );
  } catch (e) {
    if (!(e instanceof Unauthorized)) say("search: " + e.message);
  }
}

function renderHistory() {
  $("history").replaceChildren(
    ...state.history.map((h, i) =>
      el("li", {}, itemLabel(h),
        el("button", {
          type: "button", title: "remove", "aria-label": "remove", text: "×",
          onclick: () => { state.history.splice(i, 1); changed(); },
        })))
  );
  $("history-empty").hidden = state.history.length > 0;
}

function writeAddress() {
  const p = new URLSearchParams();
  if (state.history.length) p.set("items", state.history.map((h) => h.item_id).join(","));
  if (state.query) p.set("q", state.query);
  if (state.similar) p.set("similar", String(state.similar.item_id));
  if (state.k !== 10) p.set("k", String(state.k));
  history.replaceState(null, "", p.toString() ? "#" + p.toString() : location.pathname);
}

function changed() {
  renderHistory();
  writeAddress();
  recommend();
  if (state.query) search(state.query); // refresh the "add" buttons
}

function fmt(value) {
  return typeof value === "number" && !Number.isInteger(value) ? value.toFixed(4) : String(value);
}

async function loadCard() {
  const c = await api("/v1/model");
  const m = c.model;
  // --precision auto: the copy chosen as the fastest here of those that rank as fp32 does,
  // and the one beside it for small batches where that one answers them faster
  const pc = c.precision_choice;
  const small = pc && pc.small ? `, ${pc.small} for batches of up to ${pc.small_rows}` : "";
  const served = pc ? `${c.precision}${small} (chosen by auto)` : c.precision;
  $("model-line").textContent =
    `${m.name} · ${m.n_items.toLocaleString()} items · loaded ${m.loaded_at} · ${served}`;
  // a closed form (EASE, EDLAE, ...) is fitted once: it has no best epoch to show
  const epoch = m.best_epoch == null ? [] : [["best epoch", m.best_epoch]];
  const rows = [["model", m.name], ["run", m.run], ...epoch,
    ["items", m.n_items], ["training users", c.data.n_train_users ?? "–"],
    ["data", c.data.fingerprint ? c.data.fingerprint.slice(0, 12) : "–"],
    ["served in", served], ["loaded at", m.loaded_at]];
  for (const [split, metrics] of [["validation", c.validation], ["test", c.test]]) {
    if (!metrics) continue;
    const shown = Object.entries(metrics).filter(([k]) => k.includes("@"));
    rows.push([split, shown.map(([k, v]) => `${k} ${fmt(v)}`).join(" · ") +
      (metrics.n_users ? ` (${metrics.n_users} users)` : "")]);
  }
  const settings = Object.entries(c.settings).map(([k, v]) => `${k}=${JSON.stringify(v)}`);
  if (settings.length) rows.push(["settings", settings.join(", ")]);
  $("card").replaceChildren(...rows.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: fmt(v) })]));
  if (!c.similar) $("similar-panel").remove();
}

async function restore() {
  const p = new URLSearchParams(location.hash.slice(1));
  state.k = Math.max(1, Math.min(100, parseInt(p.get("k") || "10", 10) || 10));
  $("k").value = state.k;
  state.query = p.get("q") || "";
  $("search").value = state.query;
  const ids = (p.get("items") || "").split(",").map((s) => s.trim()).filter(Boolean);
  state.history = await Promise.all(ids.map(named));
  if (p.get("similar") && $("similar-panel")) showSimilar(await named(p.get("similar")));
}

async function named(id) {
  // the item with id `id`, with its title where the run has one
  const r = await api("/v1/items?limit=1&q=" + encodeURIComponent(id)).catch(() => null);
  const hit = r && r.items.find((item) => String(item.item_id) === id);
  return hit || { item_id: id, title: null };
}

async function start() {
  say("");
  try {
    await loadCard();
    $("key-form").hidden = true;
    await restore();
    changed();
  } catch (e) {
    if (!(e instanceof Unauthorized)) say("the model card: " + e.message);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  let timer = null;
  $("search").addEventListener("input", (ev) => {
    clearTimeout(timer);
    timer = setTimeout(() => search(ev.target.value), 150);
  });
  $("k").addEventListener("change", (ev) => {
    state.k = Math.max(1, Math.min(100, parseInt(ev.target.value, 10) || 10));
    changed();
  });
  $("clear").addEventListener("click", () => { state.history = []; changed(); });
  $("key-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    state.key = $("key").value.trim();
    sessionStorage.setItem("vaecf-key", state.key);
    start();
  });
  start();
});
