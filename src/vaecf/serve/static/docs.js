// The API reference at /docs: every route of /openapi.json with its parameters, request body,
// answers and limits, drawn here from this server's own files (nothing fetched from another
// site). Plain DOM, no libraries; every text from the schema is set with textContent.

"use strict";

let key = sessionStorage.getItem("vaecf-key") || "";

// a schema with its $refs replaced by what they name (a ref met again inside itself stays a ref)
function resolved(schema, spec, seen = []) {
  if (Array.isArray(schema)) return schema.map((s) => resolved(s, spec, seen));
  if (!schema || typeof schema !== "object") return schema;
  const ref = schema["$ref"];
  if (typeof ref === "string" && ref.startsWith("#/components/schemas/")) {
    const name = ref.slice("#/components/schemas/".length);
    const target = ((spec.components || {}).schemas || {})[name];
    if (!target || seen.includes(name)) return { "$ref": ref };
    return resolved(target, spec, [...seen, name]);
  }
  const out = {};
  for (const [k, v] of Object.entries(schema)) out[k] = resolved(v, spec, seen);
  return out;
}

function schemaBlock(schema, spec) {
  return el("pre", { class: "schema", text: JSON.stringify(resolved(schema, spec), null, 2) });
}

function parameters(op, spec) {
  const params = op.parameters || [];
  if (!params.length) return [];
  const rows = params.map((p) => el("tr", {},
    el("td", {}, el("code", { text: p.name })),
    el("td", { text: p.in + (p.required ? ", required" : "") }),
    el("td", {}, el("code", { text: JSON.stringify(resolved(p.schema || {}, spec)) })),
    el("td", { text: p.description || "" })));
  const head = el("tr", {}, ...["name", "in", "schema", ""].map((t) => el("th", { text: t })));
  return [el("h4", { text: "Parameters" }), el("table", {}, el("thead", {}, head),
    el("tbody", {}, ...rows))];
}

// a schema's first example as a block to copy, then the schema itself folded away
function exampleFirst(schema, spec) {
  const full = resolved(schema || {}, spec);
  const folded = el("details", {}, el("summary", { text: "schema" }), schemaBlock(schema || {}, spec));
  if (!Array.isArray(full.examples) || !full.examples.length) return [folded];
  const sample = el("pre", { class: "example", text: JSON.stringify(full.examples[0], null, 2) });
  return [el("p", { class: "label", text: "Example" }), sample, folded];
}

function body(op, spec) {
  const content = ((op.requestBody || {}).content || {})["application/json"];
  if (!content) return [];
  return [el("h4", { text: "Body (application/json)" }), ...exampleFirst(content.schema, spec)];
}

function answers(op, spec) {
  const items = Object.entries(op.responses || {}).map(([code, r]) => {
    const li = el("li", {}, el("code", { text: code }), " " + (r.description || ""));
    const json = (r.content || {})["application/json"];
    if (json && json.schema && code.startsWith("2")) li.append(...exampleFirst(json.schema, spec));
    return li;
  });
  return [el("h4", { text: "Answers" }), el("ul", { class: "answers" }, ...items)];
}

function operation(path, method, op, spec) {
  const id = (method + "-" + path).replace(/[^A-Za-z0-9]+/g, "-");
  const section = el("section", { id, class: "operation" },
    el("h3", {}, el("span", { class: "method", text: method.toUpperCase() }), " ",
      el("code", { text: path })));
  if (op.summary) section.append(el("p", { class: "summary", text: op.summary }));
  if (op.description) section.append(el("p", { class: "description", text: op.description }));
  section.append(...parameters(op, spec), ...body(op, spec), ...answers(op, spec));
  return [section, el("li", {}, el("a", { href: "#" + id, text: method.toUpperCase() + " " + path }))];
}

function draw(spec) {
  const info = spec.info || {};
  $("api-line").textContent = (info.title || "") + " " + (info.version || "") + ", OpenAPI " +
    (spec.openapi || "");
  $("description").textContent = info.description || "";
  const sections = [], links = [];
  for (const [path, methods] of Object.entries(spec.paths || {})) {
    for (const [method, op] of Object.entries(methods)) {
      const [section, link] = operation(path, method, op || {}, spec);
      sections.push(section);
      links.push(link);
    }
  }
  $("operations").replaceChildren(...sections);
  $("toc").replaceChildren(el("ul", { class: "toc" }, ...links));
}

async function load() {
  const headers = key ? { Authorization: "Bearer " + key } : {};
  try {
    const resp = await fetch("/openapi.json", { headers });
    if (resp.status === 401) {
      $("key-form").hidden = false;
      say("this server needs an API key to show its API");
      return;
    }
    if (!resp.ok) throw new Error(resp.status + " " + resp.statusText);
    say("");
    draw(await resp.json());
  } catch (e) {
    say("could not read /openapi.json: " + e.message);
  }
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  key = $("key").value.trim();
  sessionStorage.setItem("vaecf-key", key);
  $("key-form").hidden = true;
  load();
});
load();
