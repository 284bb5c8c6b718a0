// The conversation pages: without `?id=`, the recent conversations (conversations.json); with it, one conversation's
// requests (conversations/{id}.json) drawn as plots: prompt tokens against the window with each compaction marked,
// the cached share with every miss coloured by its cause, and the bill through the proxy against going direct.
// The drawing primitives are in conversation_plots.js.
"use strict";

const CACHED = ["cached", "#2a9d6a", "read from the provider's cache"];
const CAUSES = [
  ["new", "#9aa3b5", "new messages (never cached)"],
  ["first", "#5a6ab0", "first request"],
  ["compaction", "#d0454c", "the proxy's compaction"],
  ["client", "#e0702b", "the client's change"],
  ["expiry", "#c9a227", "cache lifetime passed"],
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

function short(hash) {
  return String(hash).slice(0, 12);
}

function conversationEntry(conversation) {
  const entry = make("li", { "data-conversation": conversation.id });
  const link = make("a", { href: `conversation?id=${encodeURIComponent(conversation.id)}` }, short(conversation.id));
  const totals = conversation.totals || {};
  const cachedShare = totals.prompt_tokens ? totals.cached_tokens / totals.prompt_tokens : null;
  const meter = make("span", { class: "meter", role: "img", "aria-label": `cached share ${percent(cachedShare)}` });
  const filled = make("span");
  filled.style.width = `${100 * (cachedShare || 0)}%`;
  meter.append(filled);
  const about = `${conversation.api} · ${conversation.model} · tenant ${short(conversation.tenant)} · `
    + `${count(conversation.requests)} requests · ${count(totals.prompt_tokens)} prompt tokens, `
    + `${percent(cachedShare)} cached · last seen ${ago(conversation.last_seen)}`;
  entry.append(link, meter, make("span", { class: "about" }, about));
  return entry;
}

async function showList() {
  const data = await read("conversations.json");
  const list = make("ol", { class: "conversations" });
  list.append(...data.conversations.map(conversationEntry));
  if (!data.conversations.length) list.append(make("li", {}, "No conversation yet: none has gone through this process."));
  document.getElementById("figures").replaceChildren(figureSection("conversations", "Recent conversations",
    "most recent first; each name opens its page", list));
  return `${data.conversations.length} recent conversation${data.conversations.length === 1 ? "" : "s"}.`;
}

// Where the compaction's mark goes: the request it compacted, a dashed line over its band, and an arrow from the
// tokens before to the tokens after, labelled with its strategies.
function compactionMark(frame, i, compaction) {
  const strategies = compaction.strategies.join(", ");
  const text = `Request ${i + 1} compacted by ${strategies}: ${count(compaction.tokens_before)} → `
    + `${count(compaction.tokens_after)} tokens (the proxy's estimate)`;
  const mark = titled(make("svg:g", {
    class: "compaction", "data-request": i + 1, "data-strategies": compaction.strategies.join(","),
    "data-before": compaction.tokens_before, "data-after": compaction.tokens_after,
  }), text);
  const middle = frame.x(i) + frame.band / 2;
  mark.append(make("svg:line", { class: "mark", x1: middle, x2: middle, y1: frame.y(compaction.tokens_before), y2: frame.bottom }));
  mark.append(make("svg:path", {
    class: "arrow", fill: COMPACTION_COLOR,
    d: `M${middle - 4},${frame.y(compaction.tokens_after) - 6} L${middle + 4},${frame.y(compaction.tokens_after) - 6} L${middle},${frame.y(compaction.tokens_after)} Z`,
  }));
  mark.append(make("svg:text", { x: middle, y: 12, "text-anchor": "middle", class: "strategy" }, strategies));
  return mark;
}

function promptFigure(requests) {
  const top = 1.08 * Math.max(1, ...requests.flatMap((r) => [r.window || 0, r.prompt_tokens, r.client_tokens || 0,
    r.compaction ? r.compaction.tokens_before : 0]));
  const frame = requestFrame("Prompt tokens per request against the window", requests.length, top, count);
  requests.forEach((r, i) => {
    const text = `Request ${i + 1}: ${count(r.prompt_tokens)} prompt tokens reported`
      + (r.window ? ` of a ${count(r.window)}-token window` : "");
    frame.svg.append(bar(frame, i, 0, r.prompt_tokens, PROMPT_COLOR, text, { request: i + 1, prompt: r.prompt_tokens }));
    if (r.client_tokens) {
      const middle = frame.x(i) + frame.band / 2;
      frame.svg.append(titled(make("svg:circle", { cx: middle, cy: frame.y(r.client_tokens), r: 2.2, fill: CLIENT_COLOR,
        "data-request": i + 1, "data-client": r.client_tokens }), `Request ${i + 1}: the client sent ${count(r.client_tokens)} tokens (estimated)`));
    }
  });
  let path = "";
  requests.forEach((r, i) => {
    if (r.window) path += `${path ? "L" : "M"}${frame.x(i).toFixed(1)},${frame.y(r.window).toFixed(1)} L${frame.x(i + 1).toFixed(1)},${frame.y(r.window).toFixed(1)} `;
  });
  if (path) frame.svg.append(titled(make("svg:path", { class: "window", d: path.trim() }), "the context window"));
  requests.forEach((r, i) => { if (r.compaction) frame.svg.append(compactionMark(frame, i, r.compaction)); });
  const compactions = requests.filter((r) => r.compaction).length;
  return figureSection("prompt", "Prompt tokens per request, against the window",
    "tokens per request as the provider reported them; each compaction marked with its strategies, tokens before → after",
    frame.svg,
    legend([["prompt", PROMPT_COLOR, "prompt tokens (provider's usage)"], ["client", CLIENT_COLOR, "what the client sent (estimated)"],
      ["window", "#1d2433", "context window"], ["compaction", COMPACTION_COLOR, `compaction (${compactions})`]]));
}

function cacheFigure(requests) {
  const frame = requestFrame("Cached share per request, misses by cause", requests.length, 1, percent);
  const totals = Object.fromEntries([CACHED, ...CAUSES].map(([name]) => [name, 0]));
  requests.forEach((r, i) => {
    const whole = r.prompt_tokens || 1;
    let from = 0;
    const parts = [[CACHED[0], r.cached_tokens], ...CAUSES.map(([cause]) => [cause, (r.misses || {})[cause] || 0])];
    for (const [name, tokens] of parts) {
      if (!tokens) continue;
      totals[name] += tokens;
      const color = [CACHED, ...CAUSES].find(([known]) => known === name)[1];
      const text = name === "cached"
        ? `Request ${i + 1}: ${count(tokens)} of ${count(r.prompt_tokens)} prompt tokens cached (${percent(tokens / whole)})`
        : `Request ${i + 1}: ${count(tokens)} tokens missed, cause: ${name}`;
      frame.svg.append(bar(frame, i, from, from + tokens / whole, color, text, { request: i + 1, part: name, tokens }));
      from += tokens / whole;
    }
  });
  const prompt = requests.reduce((sum, r) => sum + r.prompt_tokens, 0);
  const entries = [CACHED, ...CAUSES].map(([name, color, text]) => [name, color, `${text}: ${count(totals[name])}`]);
  return figureSection("cache", "Cached share per request, misses by cause",
    "share of each request's prompt tokens: cached, and each uncached token by the cause of its miss",
    frame.svg, legend(entries),
    headlines([["prompt", "prompt tokens", prompt, count], ["cached", "cached", totals.cached, count],
      ["cached_share", "cached / prompt", prompt ? totals.cached / prompt : null, percent],
      ["proxy_misses", "missed by the proxy's compaction", totals.compaction, count]]));
}

function billFigure(bill) {
  if (!bill) {
    return figureSection("bill", "The bill: through the proxy and direct", "",
      make("p", { class: "placeholder" }, "No bill for this conversation: this proxy's conversation data carries no prices."));
  }
  return figureSection("bill", "The bill: through the proxy and direct", "", make("p", {}, JSON.stringify(bill)));
}

async function showConversation(id) {
  const data = await read(`conversations/${encodeURIComponent(id)}.json`);
  const requests = data.requests;
  document.getElementById("title").textContent = `Conversation ${short(id)}`;
  document.getElementById("data").setAttribute("href", `conversations/${encodeURIComponent(id)}.json`);
  document.getElementById("data").textContent = `conversations/${short(id)}….json`;
  document.getElementById("figures").replaceChildren(promptFigure(requests), cacheFigure(requests), billFigure(data.bill));
  const first = requests[0] || {};
  return `${first.api || ""} · ${first.model || ""} · ${requests.length} requests`;
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
