// The dashboard: reads dashboard.json and draws each figure as an inline SVG plot with its totals over the window.
// Text goes in with textContent only, so nothing in the data can become markup.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#2f6fdf", "#e0702b", "#2a9d6a", "#b0459c", "#c9a227", "#5a6ab0", "#d0454c", "#3aa6b9", "#7a7f8c"];
const WIDTH = 560;
const HEIGHT = 150;
const PAD = { left: 52, right: 10, top: 8, bottom: 20 };
const REFRESH_MS = 30000;

function element(name, attributes, text) {
  const node = document.createElement(name);
  for (const [key, value] of Object.entries(attributes || {})) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

function svgElement(name, attributes) {
  const node = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes || {})) node.setAttribute(key, String(value));
  return node;
}

function formatted(value, kind) {
  if (value === null || value === undefined) return "n/a";
  if (kind === "share") return (100 * value).toFixed(1) + "%";
  if (kind === "ratio") return (value >= 0 ? "+" : "") + (100 * value).toFixed(1) + "%";
  return Math.round(value).toLocaleString("en-US");
}

// The time axis spans the minutes kept (at least MIN_MINUTES, at most the window): a few minutes of data fill the
// plot instead of sitting in the last sliver of an hour.
const MIN_MINUTES = 4;

function shownSeconds(ends, windowSeconds) {
  const kept = Math.ceil((ends[ends.length - 1] - ends[0]) / 60);
  return 60 * Math.min(Math.max(kept, MIN_MINUTES), Math.round(windowSeconds / 60));
}

function plot(figure, ends, windowSeconds) {
  const svg = svgElement("svg", { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: "img", "aria-label": figure.title });
  const values = figure.series.flatMap((series) => series.values.filter((v) => v !== null));
  const top = Math.max(0, ...values);
  const bottom = Math.min(0, ...values);
  const span = top - bottom || 1;
  const now = ends[ends.length - 1];
  const seconds = shownSeconds(ends, windowSeconds);
  const x = (i) => PAD.left + (1 - (now - ends[i]) / seconds) * (WIDTH - PAD.left - PAD.right);
  const y = (v) => PAD.top + (1 - (v - bottom) / span) * (HEIGHT - PAD.top - PAD.bottom);
  svg.append(svgElement("line", { class: "axis", x1: PAD.left, x2: WIDTH - PAD.right, y1: y(0), y2: y(0) }));
  svg.append(svgElement("line", { class: "axis", x1: PAD.left, x2: PAD.left, y1: PAD.top, y2: HEIGHT - PAD.bottom }));
  // The y-axis is labelled at its top, zero, its bottom and its middle, each text once (a count's middle may round
  // to its top).
  const shown = new Set();
  for (const value of [top, 0, bottom, (top + bottom) / 2]) {
    const text = formatted(value, figure.kind);
    if (shown.has(text)) continue;
    shown.add(text);
    const label = svgElement("text", { x: PAD.left - 4, y: y(value) + 3, "text-anchor": "end", class: "level" });
    label.textContent = text;
    svg.append(label);
  }
  const minutes = seconds / 60;
  const ticks = [[`${minutes} min ago`, 0, "start"], [`${minutes / 2} min ago`, 0.5, "middle"], ["now", 1, "end"]];
  for (const [text, share, anchor] of ticks) {
    const position = PAD.left + share * (WIDTH - PAD.left - PAD.right);
    const label = svgElement("text", { x: position, y: HEIGHT - 4, "text-anchor": anchor, class: "time" });
    label.textContent = text;
    svg.append(label);
  }
  figure.series.forEach((series, index) => {
    const color = COLORS[index % COLORS.length];
    let path = "";
    let drawing = false;
    series.values.forEach((value, i) => {
      if (value === null) { drawing = false; return; }
      path += `${drawing ? "L" : "M"}${x(i).toFixed(1)},${y(value).toFixed(1)} `;
      drawing = true;
      svg.append(svgElement("circle", { cx: x(i).toFixed(1), cy: y(value).toFixed(1), r: 2.5, fill: color }));
    });
    if (path) svg.append(svgElement("path", { class: "series", d: path.trim(), stroke: color }));
  });
  return svg;
}

function section(figure, ends, windowSeconds) {
  const node = element("section", { class: "figure", "data-figure": figure.id });
  node.append(element("h2", {}, figure.title), element("p", { class: "unit" }, figure.unit));
  node.append(plot(figure, ends, windowSeconds));
  const legend = element("ul", { class: "legend" });
  figure.series.forEach((series, index) => {
    const entry = element("li", { "data-series": series.name });
    const swatch = element("span");
    swatch.style.background = COLORS[index % COLORS.length];
    entry.append(swatch, document.createTextNode(series.name));
    legend.append(entry);
  });
  if (!figure.series.length) legend.append(element("li", {}, "nothing in the last hour"));
  node.append(legend);
  const items = element("dl", { class: "items" });
  for (const item of figure.items) {
    const box = element("div", { "data-item": item.id });
    const value = item.value === null ? "" : String(item.value);
    box.append(element("dt", {}, item.label), element("dd", { "data-value": value }, formatted(item.value, item.kind)));
    items.append(box);
  }
  node.append(items, element("p", { class: "divides" }, "Divides by: " + figure.divides_by));
  node.append(element("p", { class: "divides" }, "Metrics: " + figure.metrics.join(", ")));
  return node;
}

async function refresh() {
  const status = document.getElementById("status");
  try {
    // Relative to the page, without any user:password@ it was opened with (fetch refuses those; the browser's
    // login cache still sends the key).
    const url = new URL("dashboard.json", window.location.href);
    url.username = "";
    url.password = "";
    const response = await fetch(url, { cache: "no-store", credentials: "same-origin" });
    if (!response.ok) throw new Error(`dashboard.json answered ${response.status}`);
    const data = await response.json();
    const figures = document.getElementById("figures");
    figures.replaceChildren(...data.figures.map((figure) => section(figure, data.ends, data.window_seconds)));
    const when = new Date(data.ends[data.ends.length - 1] * 1000);
    const kept = data.ends.length - 1;
    status.textContent = `One point a minute: ${kept} whole minute${kept === 1 ? "" : "s"} kept (at most an hour) and the one in progress; read at ${when.toISOString()}.`;
    document.body.setAttribute("data-loaded", "true");
  } catch (error) {
    status.textContent = `Could not read the figures: ${error.message}. Retrying in ${REFRESH_MS / 1000} s.`;
  }
}

refresh();
setInterval(refresh, REFRESH_MS);
