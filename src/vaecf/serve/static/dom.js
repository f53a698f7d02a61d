// What both pages share: an element by id, an element built with its text set as text (never
// parsed as HTML), and the message line. Loaded before the page's own script.

"use strict";

const $ = (id) => document.getElementById(id);

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "text") node.textContent = value;
    else node.setAttribute(name, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function say(text) {
  $("message").textContent = text;
  $("message").hidden = !text;
}
