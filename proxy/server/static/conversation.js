// The conversation pages: without `?id=`, the recent conversations (conversations.json); with it, one conversation's
// requests (conversations/{id}.json) drawn as plots: prompt tokens against the window with each compaction marked,
// the cached share with every miss coloured by its cause, and the bill through the proxy against going direct.
// The drawing primitives are in conversation_plots.js.
"use strict";

// The parts of a request's prompt tokens, bottom up: cached, then the misses by cause (the ledger's causes).
const PARTS = [
  ["cached", "#2a9d6a", "read from the provider's cache"],
  ["new", "#9aa3b5", "new messages (never cached)"],
  ["first", "#5a6ab0", "first request"],
  ["expiry", "#c9a227", "cache lifetime passed"],
  ["client", "#e0702b", "the client's change"],
  ["compaction", "#d0454c", "the proxy's compaction"],
  ["provider", "#b0459c", "the provider's own miss"],
];
const PROMPT_COLOR = "#2f6fdf";
const CLIENT_COLOR = "#7a7f8c";
const COMPACTION_COLOR = "#d0454c";

// Fetch a path relative to this page, without any user:password@ it was opened with (fetch refuses those; the
// browser's login cache still sends the key).
async function read(path) {
  const url = new URL(path, window.location.href);
  url.username = "";
  url.password = "";
  const response = await fetch(url, { cache: "no-store", credentials: "same-origin" });
  if (!response.ok) throw new Error(`${url.pathname} answered ${response.status}`);
  return response.json();
}

function ago(seconds) {
  const passed = Math.max(0, Date.now() / 1000 - seconds);
  if (passed < 90) return `${Math.round(passed)} s ago`;
  if (passed < 5400) return `${Math.round(passed / 60)} min ago`;
  return `${(passed / 3600).toFixed(1)} h ago`;
}

function plural(number, noun) {
  return `${count(number)} ${noun}${number === 1 ? "" : "s"}`;
}

function conversationEntry(conversation) {
  const entry = make("li", { "data-conversation": conversation.id });
  const link = make("a", { href: `conversation?id=${encodeURIComponent(conversation.id)}` }, conversation.id);
  const totals = conversation.totals;
  const cachedShare = totals.prompt_tokens ? totals.cached_tokens / totals.prompt_tokens : null;
  const meter = make("span", { class: "meter", role: "img", "aria-label": `cached share ${percent(cachedShare)}` });
  const filled = make("span");
  filled.style.width = `${100 * (cachedShare || 0)}%`;
  meter.append(filled);
  const about = `${conversation.api} · ${conversation.model} · tenant ${conversation.tenant} · `
    + `${plural(conversation.requests, "request")}, ${count(conversation.compactions)} compacted · `
    + `${count(totals.prompt_tokens)} prompt tokens, `
    + `${percent(cachedShare)} cached · ${billed(conversation.bill)}last seen ${ago(conversation.last_seen)}`;
  entry.append(link, meter, make("span", { class: "about" }, about));
  return entry;
}

async function showList() {
  const data = await read("conversations.json");
  const conversations = data.conversations;
  const list = make("ol", { class: "conversations" });
  list.append(...conversations.map(conversationEntry));
  if (!conversations.length) list.append(make("li", {}, "No conversation yet: none has gone through this process."));
  document.getElementById("figures").replaceChildren(figureSection("conversations", "Recent conversations",
    "most recent first; each name opens its page", list), ...(data.total ? [billFigure(data.total)] : []));
  return `${plural(conversations.length, "recent conversation")}.`;
}

function compactionText(n, compaction) {
  return `request ${n}: ${compaction.strategies.join(", ")}, ${count(compaction.tokens_before)} → `
    + `${count(compaction.tokens_after)} tokens`;
}

// The `k`th compaction's mark over request `n`'s band (i in the plot): a dashed line from the tokens before down, an
// arrowhead at the tokens after, and its number above the plot at height `row` (the caption names its strategies).
function compactionMark(frame, i, n, k, compaction, row) {
  const text = `Compaction ${k}, ${compactionText(n, compaction)} (the proxy's estimates)`;
  const mark = titled(make("svg:g", {
    class: "compaction", "data-request": n, "data-strategies": compaction.strategies.join(","),
    "data-before": compaction.tokens_before, "data-after": compaction.tokens_after,
  }), text);
  const middle = frame.x(i) + frame.band / 2;
  const before = frame.y(compaction.tokens_before);
  const after = frame.y(compaction.tokens_after);
  mark.append(make("svg:line", { class: "mark", x1: middle, x2: middle, y1: before, y2: frame.bottom }));
  const arrowhead = `M${middle - 4},${after - 6} L${middle + 4},${after - 6} L${middle},${after} Z`;
  mark.append(make("svg:path", { fill: COMPACTION_COLOR, d: arrowhead }));
  mark.append(make("svg:text", { x: middle, y: row, "text-anchor": "middle", class: "strategy" }, String(k)));
  return mark;
}

// Where going direct stops: the first request the client sent larger than the window, which the provider would have
// refused (the bill's estimate of going direct covers the requests before it).
function directStop(frame, i, n, record) {
  const x = frame.x(i);
  const text = `Request ${n}: ${count(record.client_tokens)} tokens as the client sent it, more than the `
    + `${count(record.window)}-token window: going direct, the provider would have refused it`;
  const mark = titled(make("svg:g", { class: "direct-stop", "data-request": n }), text);
  mark.append(make("svg:line", { x1: x, x2: x, y1: 16, y2: frame.bottom }));
  mark.append(make("svg:text", { x: x - 3, y: 22, "text-anchor": "end" }, "direct stops"));
  return mark;
}

// The context window as a step line over the requests that knew it.
function windowLine(frame, records) {
  let path = "";
  records.forEach((r, i) => {
    if (!r.window) return;
    const level = frame.y(r.window).toFixed(1);
    path += `${path ? "L" : "M"}${frame.x(i).toFixed(1)},${level} L${frame.x(i + 1).toFixed(1)},${level} `;
  });
  return path ? titled(make("svg:path", { class: "window", d: path.trim() }), "the context window") : null;
}

function promptFigure(records, first) {
  const sizes = records.flatMap((r) => [r.window, r.prompt_tokens, r.client_tokens, r.compaction?.tokens_before]);
  const top = 1.08 * Math.max(1, ...sizes.map((v) => v || 0));
  const frame = requestFrame("Prompt tokens per request against the window", records.length, top, count, first);
  records.forEach((r, i) => {
    const n = first + i;
    const text = `Request ${n}: ${count(r.prompt_tokens)} prompt tokens reported`
      + (r.window ? ` of a ${count(r.window)}-token window` : "");
    frame.svg.append(bar(frame, i, 0, r.prompt_tokens, PROMPT_COLOR, text, { request: n, prompt: r.prompt_tokens }));
    if (!r.client_tokens) return;
    const dot = make("svg:circle", { cx: frame.x(i) + frame.band / 2, cy: frame.y(r.client_tokens), r: 2.2,
      fill: CLIENT_COLOR, "data-request": n, "data-client": r.client_tokens });
    frame.svg.append(titled(dot, `Request ${n}: ${count(r.client_tokens)} tokens as the client sent it`));
  });
  const window = windowLine(frame, records);
  if (window) frame.svg.append(window);
  const stop = records.findIndex((r) => r.window && r.client_tokens > r.window);
  if (stop >= 0) frame.svg.append(directStop(frame, stop, first + stop, records[stop]));
  const caption = make("ol", { class: "compactions" });
  let label = { x: -Infinity, row: 22 };  // numbers of compactions close together alternate between two rows
  records.forEach((r, i) => {
    if (!r.compaction) return;
    const x = frame.x(i);
    label = { x, row: x - label.x < 16 && label.row === 12 ? 22 : 12 };
    frame.svg.append(compactionMark(frame, i, first + i, caption.children.length + 1, r.compaction, label.row));
    caption.append(make("li", {}, compactionText(first + i, r.compaction)));
  });
  const compactions = caption.children.length;
  return figureSection("prompt", "Prompt tokens per request, against the window",
    "tokens per request as the provider reported them; each compaction marked with its strategies, tokens before → after",
    frame.svg,
    legend([["prompt", PROMPT_COLOR, "prompt tokens (the provider's usage)"],
      ["client", CLIENT_COLOR, "the request as the client sent it"], ["window", "#1d2433", "context window"],
      ["compaction", COMPACTION_COLOR, `compaction (${compactions}), numbered:`]]),
    caption);
}

// Request `n`'s stacked bar: the cached share at the bottom, then each cause's share of its misses.
function cacheBars(frame, i, n, record, totals) {
  const whole = record.prompt_tokens || 1;
  let from = 0;
  for (const [name, color] of PARTS) {
    const tokens = name === "cached" ? record.cached_tokens : (record.misses || {})[name] || 0;
    if (!tokens) continue;
    totals[name] += tokens;
    const text = name === "cached"
      ? `Request ${n}: ${count(tokens)} of ${count(record.prompt_tokens)} prompt tokens cached (${percent(tokens / whole)})`
      : `Request ${n}: ${count(tokens)} prompt tokens missed the cache, cause: ${name}`;
    frame.svg.append(bar(frame, i, from, from + tokens / whole, color, text, { request: n, part: name, tokens }));
    from += tokens / whole;
  }
}

function cacheFigure(records, first) {
  const frame = requestFrame("Cached share per request, misses by cause", records.length, 1, percent, first);
  const totals = Object.fromEntries(PARTS.map(([name]) => [name, 0]));
  records.forEach((record, i) => cacheBars(frame, i, first + i, record, totals));
  const prompt = records.reduce((sum, r) => sum + r.prompt_tokens, 0);
  return figureSection("cache", "Cached share per request, misses by cause",
    "share of each request's prompt tokens: cached, and each uncached token by the cause of its miss",
    frame.svg, legend(PARTS.map(([name, color, text]) => [name, color, `${text}: ${count(totals[name])}`])),
    headlines([["prompt", "prompt tokens", prompt, count], ["cached", "cached", totals.cached, count],
      ["cached_share", "cached / prompt", prompt ? totals.cached / prompt : null, percent],
      ["proxy_misses", "missed because of the proxy", totals.compaction, count]]));
}

async function showConversation(id) {
  const path = `conversations/${encodeURIComponent(id)}.json`;
  const data = await read(path);
  const first = (data.dropped || 0) + 1;
  document.getElementById("title").textContent = `Conversation ${id}`;
  document.getElementById("data").setAttribute("href", path);
  document.getElementById("data").textContent = path;
  document.getElementById("figures").replaceChildren(
    promptFigure(data.records, first), cacheFigure(data.records, first), billFigure(data.bill));
  const dropped = data.dropped ? ` (the first ${count(data.dropped)} no longer kept)` : "";
  return `${data.api} · ${data.model} · tenant ${data.tenant} · ${plural(data.requests, "request")}${dropped}, `
    + `${count(data.compactions)} compacted · last seen ${ago(data.last_seen)}`;
}

async function show() {
  const status = document.getElementById("status");
  const id = new URLSearchParams(window.location.search).get("id");
  try {
    status.textContent = await (id ? showConversation(id) : showList());
    document.body.setAttribute("data-loaded", "true");
  } catch (error) {
    status.textContent = `Could not read the conversation data: ${error.message}. Reload the page to try again.`;
  }
}

show();
