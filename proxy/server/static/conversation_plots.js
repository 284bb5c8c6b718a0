// Drawing for the conversation pages: inline SVG plots over a conversation's requests, one band per request.
// Every mark carries a <title> (read out by screen readers, shown on hover) and data-* attributes holding its
// figures, so what a plot shows can be read back exactly. Text goes in with textContent only, so nothing in the
// data can become markup.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const PLOT = { width: 1000, height: 230, left: 64, right: 14, top: 26, bottom: 24 };

// An HTML element, or an SVG one when `name` starts with "svg:".
function make(name, attributes, text) {
  const svg = name.startsWith("svg:");
  const node = svg ? document.createElementNS(SVG_NS, name.slice(4)) : document.createElement(name);
  for (const [key, value] of Object.entries(attributes || {})) node.setAttribute(key, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

// `node` labelled for people: a <title> (hover, screen readers) and the same text as its aria-label.
function titled(node, text) {
  node.append(make("svg:title", {}, text));
  node.setAttribute("aria-label", text);
  return node;
}

function count(value) {
  return value === null || value === undefined ? "n/a" : Math.round(value).toLocaleString("en-US");
}

function percent(value) {
  return value === null || value === undefined ? "n/a" : (100 * value).toFixed(1) + "%";
}

// A plot over `n` requests numbered from `first`, with y from 0 to `top`: its axes, the y-axis labelled by `label` at
// 0, half and top, the x-axis at the first and last request. `x(i)` is the left edge of the band of the plot's
// request i (from 0), `bar` a bar's width.
function requestFrame(title, n, top, label, first) {
  const svg = make("svg:svg", { viewBox: `0 0 ${PLOT.width} ${PLOT.height}`, role: "img", "aria-label": title });
  const band = (PLOT.width - PLOT.left - PLOT.right) / Math.max(n, 1);
  const x = (i) => PLOT.left + i * band;
  const y = (v) => PLOT.top + (1 - v / (top || 1)) * (PLOT.height - PLOT.top - PLOT.bottom);
  const bottom = PLOT.height - PLOT.bottom;
  svg.append(make("svg:line", { class: "axis", x1: PLOT.left, x2: PLOT.width - PLOT.right, y1: bottom, y2: bottom }));
  svg.append(make("svg:line", { class: "axis", x1: PLOT.left, x2: PLOT.left, y1: PLOT.top, y2: bottom }));
  for (const value of [0, top / 2, top]) {
    svg.append(make("svg:text", { x: PLOT.left - 4, y: y(value) + 3, "text-anchor": "end", class: "level" }, label(value)));
  }
  const ends = [[`request ${first}`, x(0), "start"], [`request ${first + n - 1}`, x(n), "end"]];
  for (const [text, position, anchor] of n > 1 ? ends : ends.slice(0, 1)) {
    svg.append(make("svg:text", { x: position, y: PLOT.height - 6, "text-anchor": anchor, class: "time" }, text));
  }
  return { svg, x, y, band, bar: Math.max(1, band * 0.8), bottom };
}

// Request i's bar from `from` to `to` (in y units), filled with `color`, with its title and data attributes.
function bar(frame, i, from, to, color, title, data) {
  const top = frame.y(to);
  const attributes = { x: frame.x(i) + (frame.band - frame.bar) / 2, y: top, width: frame.bar, fill: color };
  attributes.height = Math.max(0, frame.y(from) - top);
  for (const [key, value] of Object.entries(data)) attributes[`data-${key}`] = value;
  return titled(make("svg:rect", attributes), title);
}

// A legend: one entry per [name, color, text], each marked `data-series` with its name.
function legend(entries) {
  const list = make("ul", { class: "legend" });
  for (const [name, color, text] of entries) {
    const entry = make("li", { "data-series": name });
    const swatch = make("span");
    swatch.style.background = color;
    entry.append(swatch, document.createTextNode(text));
    list.append(entry);
  }
  return list;
}

// Headline numbers: one box per [id, label, value, format], the exact value in `data-value`.
function headlines(items) {
  const list = make("dl", { class: "items" });
  for (const [id, label, value, format] of items) {
    const box = make("div", { "data-item": id });
    box.append(make("dt", {}, label), make("dd", { "data-value": value ?? "" }, format(value)));
    list.append(box);
  }
  return list;
}

// A figure's section: its heading, what its unit is, the plot and whatever follows it.
function figureSection(id, title, unit, ...parts) {
  const node = make("section", { class: "figure wide", "data-figure": id });
  node.append(make("h2", {}, title), make("p", { class: "unit" }, unit), ...parts);
  return node;
}
