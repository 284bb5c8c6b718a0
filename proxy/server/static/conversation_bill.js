// The bill on a conversation page: what the provider billed through the proxy against the estimate of the same
// requests going direct (the JSON's `bill`, made by proxy/billing/bill.py), as bars of price and of tokens by kind.
// Both sides cover the same requests (`covered`): where going direct would have overflowed, the estimate stops.
"use strict";

const BILL_KINDS = [
  ["uncached_input", "#9aa3b5", "uncached input"],
  ["cached_input", "#2a9d6a", "cached input"],
  ["cache_write_input", "#c9a227", "cache writes"],
  ["output", "#2f6fdf", "output"],
];
const BILL_SIDES = [["covered", "through the proxy"], ["direct", "going direct (estimate)"]];
const BILL_PLOT = { width: 1000, left: 190, right: 150, row: 24, gap: 10, top: 6 };

function usd(value) {
  if (value === null || value === undefined) return "price unknown";
  const size = Math.abs(value);
  return (value < 0 ? "-$" : "$") + size.toFixed(size < 1 ? 4 : 2);
}

function billTokens(charge) {
  return BILL_KINDS.reduce((sum, [kind]) => sum + charge[kind], 0);
}

// One row: its label, its segments [[length share, color, title, data]] from the left, and its figure on the right.
function billRow(svg, index, label, segments, figure) {
  const y = BILL_PLOT.top + index * (BILL_PLOT.row + BILL_PLOT.gap);
  const span = BILL_PLOT.width - BILL_PLOT.left - BILL_PLOT.right;
  const middle = y + BILL_PLOT.row / 2 + 4;
  svg.append(make("svg:text", { x: BILL_PLOT.left - 8, y: middle, "text-anchor": "end", class: "row" }, label));
  let x = BILL_PLOT.left;
  for (const [length, color, title, data] of segments) {
    const attributes = { x, y, width: Math.max(0, length * span), height: BILL_PLOT.row, fill: color };
    for (const [key, value] of Object.entries(data)) attributes[`data-${key}`] = value;
    svg.append(titled(make("svg:rect", attributes), title));
    x += length * span;
  }
  svg.append(make("svg:text", { x: x + 6, y: middle, class: "row" }, figure));
}

function billPlot(bill) {
  const rows = 2 * BILL_SIDES.length;
  const height = BILL_PLOT.top + rows * (BILL_PLOT.row + BILL_PLOT.gap);
  const described = "The bill through the proxy and going direct";
  const svg = make("svg:svg", { viewBox: `0 0 ${BILL_PLOT.width} ${height}`, role: "img", "aria-label": described });
  const priced = BILL_SIDES.map(([side]) => bill[side].usd || 0);
  const tokens = BILL_SIDES.map(([side]) => billTokens(bill[side]));
  BILL_SIDES.forEach(([side, label], index) => {
    const charge = bill[side];
    const share = charge.usd ? charge.usd / Math.max(...priced) : 0;
    const title = `Price ${label}: ${usd(charge.usd)} for ${count(charge.requests)} requests`;
    const price = [share, "#1d2433", title, { bill: side, usd: charge.usd ?? "" }];
    billRow(svg, index, `price ${label}`, [price], usd(charge.usd));
    const segments = BILL_KINDS.map(([kind, color, name]) => [charge[kind] / (Math.max(...tokens) || 1), color,
      `Tokens ${label}: ${count(charge[kind])} ${name}`, { bill: side, kind, tokens: charge[kind] }]);
    billRow(svg, BILL_SIDES.length + index, `tokens ${label}`, segments, `${count(tokens[index])} tokens`);
  });
  return svg;
}

// What the estimate covers, in words: all the requests, or those before the one going direct could not have sent.
function billCoverage(bill) {
  const covered = `Both sides cover ${count(bill.covered.requests)} of the ${count(bill.proxy.requests)} requests`
    + " forwarded";
  const stopped = bill.stopped
    ? ": going direct, a later request would not have fitted the model's window, so the estimate stops before it."
    : " (the proxy's own calls, such as summaries, are billed through the proxy and have no direct counterpart).";
  const priced = bill.proxy.price === "known" ? ""
    : ` Prices: ${bill.proxy.price} (a model without a known price is counted in tokens only).`;
  const loading = bill.prices === "loading"
    ? " The price library was still loading when this was made: reload the page for its prices." : "";
  return make("p", { class: "divides" }, covered + stopped + priced + loading);
}

// A conversation's bill in the list, in words: through the proxy against going direct, over the same requests.
function billed(bill) {
  if (!bill) return "";
  return `billed ${usd(bill.covered.usd)} against ${usd(bill.direct.usd)} direct · `;
}

function billFigure(bill) {
  const title = "The bill: through the proxy and going direct";
  if (!bill) {
    const missing = "No bill in this conversation's data: this proxy does not price its conversations.";
    return figureSection("bill", title, "", make("p", { class: "placeholder" }, missing));
  }
  const saved = bill.covered.usd !== null && bill.direct.usd !== null ? bill.direct.usd - bill.covered.usd : null;
  return figureSection("bill", title,
    "what the provider billed through the proxy, against the same client requests sent as the client sent them",
    billPlot(bill),
    legend(BILL_KINDS.map(([kind, color, name]) => [kind, color, name])),
    headlines([["proxy_usd", "through the proxy", bill.covered.usd, usd],
      ["direct_usd", "going direct (estimate)", bill.direct.usd, usd], ["saved_usd", "saved (direct - proxy)", saved, usd]]),
    billCoverage(bill));
}
