// A survey's estimate with its error (docs/surveys.md "Estimates"), drawn as inline SVG:
// a histogram of shares with 95% interval whiskers (grr, unary_encoding, olh, hadamard; the
// largest TOP_VALUES shares when there are more values), or one point with its interval on a
// number line (a proportion or a mean); and the exact numbers of every value in a table and a CSV.

import { element } from "./chart.js";
import { num } from "./format.js";

const WIDTH = 640;
const HEIGHT = 300;
const MARGIN = { left: 56, right: 20, top: 16, bottom: 56 };

// About `count` round tick values covering [low, high] (low < high).
export function rangeTicks(low, high, count) {
  const raw = (high - low) / count;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * magnitude).find((s) => s >= raw);
  const first = Math.floor(low / step + 1e-9) * step;
  const values = [];
  for (let v = first; v < high + step * (1 - 1e-9); v += step) {
    values.push(Number(v.toPrecision(12)));
  }
  return values;
}

// The scale [low, high] a plot of `numbers` needs: always containing `base` (e.g. [0, 1]).
function span(numbers, base) {
  const low = Math.min(base[0], ...numbers);
  const high = Math.max(base[1], ...numbers);
  return high > low ? [low, high] : [low - 0.5, high + 0.5];
}

function tooltip(node, text) {
  node.append(element("title", {}, text));
  return node;
}

function interval(ci) {
  return `[${num(ci[0])}, ${num(ci[1])}]`;
}

// Values a histogram draws: beyond this many (olh and hadamard over thousands of values), the
// largest shares, in decreasing order; the table below the chart keeps every value.
export const TOP_VALUES = 40;

// The keys a histogram draws: all of them in the estimate's order, or the TOP_VALUES largest.
export function drawnKeys(estimate) {
  const keys = Object.keys(estimate.values);
  if (keys.length <= TOP_VALUES) {
    return keys;
  }
  return keys.sort((a, b) => estimate.values[b] - estimate.values[a]).slice(0, TOP_VALUES);
}

// The histogram: a bar per value (its share, from 0) and a whisker for its 95% interval.
export function renderHistogram(svg, estimate) {
  svg.replaceChildren();
  svg.setAttribute("viewBox", `0 0 ${WIDTH} ${HEIGHT}`);
  const keys = drawnKeys(estimate);
  const numbers = keys.flatMap((k) => [estimate.values[k], ...estimate.ci95[k]]);
  const yTicks = rangeTicks(...span(numbers, [0, 0.1]), 5);
  const yLow = yTicks[0];
  const yHigh = yTicks[yTicks.length - 1];
  const plotW = WIDTH - MARGIN.left - MARGIN.right;
  const plotH = HEIGHT - MARGIN.top - MARGIN.bottom;
  const y = (v) => MARGIN.top + plotH - ((v - yLow) / (yHigh - yLow)) * plotH;
  const slot = plotW / keys.length;
  const barW = Math.max(1, slot * 0.6);
  const x = (i) => MARGIN.left + slot * (i + 0.5);

  svg.append(element("title", {}, `Estimated share of the members by value, with 95% intervals (n = ${estimate.n})`));
  const grid = element("g", { class: "grid" });
  for (const v of yTicks) {
    grid.append(element("line", { x1: MARGIN.left, x2: WIDTH - MARGIN.right, y1: y(v), y2: y(v) }));
    grid.append(element("text", { x: MARGIN.left - 6, y: y(v) + 4, class: "tick y" }, num(v)));
  }
  svg.append(grid);
  // label every value while they fit, else about 20 of them
  const every = Math.max(1, Math.ceil(keys.length / 20));
  const labels = element("g", { class: "labels" });
  keys.forEach((key, i) => {
    if (i % every === 0) {
      const text = key.length > 12 ? `${key.slice(0, 11)}…` : key;
      labels.append(tooltip(element("text", { x: x(i), y: MARGIN.top + plotH + 16, class: "tick x" }, text), key));
    }
  });
  svg.append(labels);
  svg.append(
    element("text", { x: MARGIN.left + plotW / 2, y: HEIGHT - 8, class: "axis-label" }, "value"),
    element(
      "text",
      { x: 14, y: MARGIN.top + plotH / 2, class: "axis-label", transform: `rotate(-90 14 ${MARGIN.top + plotH / 2})` },
      "share of members",
    ),
  );
  const bars = element("g", { class: "bars" });
  const whiskers = element("g", { class: "whiskers" });
  const cap = Math.min(8, barW / 2);
  keys.forEach((key, i) => {
    const share = estimate.values[key];
    const [low, high] = estimate.ci95[key];
    const top = Math.min(y(share), y(0));
    const bar = element("rect", {
      class: share < 0 ? "bar negative" : "bar",
      x: x(i) - barW / 2,
      y: top,
      width: barW,
      height: Math.max(Math.abs(y(0) - y(share)), 0.5),
    });
    bar.dataset.key = key;
    const words = `${key}: share ${num(share)}, 95% interval ${interval(estimate.ci95[key])}, standard error ${num(estimate.stderr[key])}`;
    bars.append(tooltip(bar, words));
    const whisker = element("path", {
      class: "whisker",
      d: `M${x(i)} ${y(low)} V${y(high)} M${x(i) - cap} ${y(low)} H${x(i) + cap} M${x(i) - cap} ${y(high)} H${x(i) + cap}`,
    });
    whisker.dataset.key = key;
    whiskers.append(tooltip(whisker, words));
  });
  svg.append(bars, element("line", { class: "zero", x1: MARGIN.left, x2: WIDTH - MARGIN.right, y1: y(0), y2: y(0) }), whiskers);
}

// One number (a proportion or a mean) with its 95% interval, on a line from `base[0]` to
// `base[1]` (widened to the interval when it reaches beyond).
export function renderInterval(svg, estimate, base) {
  const height = 110;
  svg.replaceChildren();
  svg.setAttribute("viewBox", `0 0 ${WIDTH} ${height}`);
  const ticks = rangeTicks(...span([estimate.value, ...estimate.ci95], base), 8);
  const low = ticks[0];
  const high = ticks[ticks.length - 1];
  const left = MARGIN.left;
  const right = WIDTH - MARGIN.right;
  const x = (v) => left + ((v - low) / (high - low)) * (right - left);
  const axisY = 70;
  const lineY = 40;
  svg.append(element("title", {}, `Estimate ${num(estimate.value)} with its 95% interval ${interval(estimate.ci95)} (n = ${estimate.n})`));
  const grid = element("g", { class: "grid" });
  for (const v of ticks) {
    grid.append(element("line", { x1: x(v), x2: x(v), y1: 16, y2: axisY }));
    grid.append(element("text", { x: x(v), y: axisY + 16, class: "tick x" }, num(v)));
  }
  svg.append(grid, element("line", { class: "axis", x1: left, x2: right, y1: axisY, y2: axisY }));
  const [ciLow, ciHigh] = estimate.ci95;
  const whisker = element("path", {
    class: "whisker",
    d: `M${x(ciLow)} ${lineY} H${x(ciHigh)} M${x(ciLow)} ${lineY - 8} V${lineY + 8} M${x(ciHigh)} ${lineY - 8} V${lineY + 8}`,
  });
  const words = `estimate ${num(estimate.value)}, 95% interval ${interval(estimate.ci95)}, standard error ${num(estimate.stderr)}`;
  svg.append(tooltip(whisker, words));
  svg.append(tooltip(element("circle", { class: "point", cx: x(estimate.value), cy: lineY, r: 5 }), words));
  svg.append(element("text", { x: x(estimate.value), y: lineY - 14, class: "point-label" }, num(estimate.value)));
}

function numberCell(value, id) {
  const td = document.createElement("td");
  td.className = "num";
  td.textContent = num(value);
  td.title = String(value);
  td.dataset.value = String(value);
  if (id) {
    td.id = id;
  }
  return td;
}

function textCell(text) {
  const td = document.createElement("td");
  td.textContent = text;
  return td;
}

// The histogram's numbers: value, share, standard error, 95% interval.
export function histogramRows(estimate) {
  return Object.keys(estimate.values).map((key) => {
    const tr = document.createElement("tr");
    tr.dataset.key = key;
    tr.append(
      textCell(key),
      numberCell(estimate.values[key]),
      numberCell(estimate.stderr[key]),
      numberCell(estimate.ci95[key][0]),
      numberCell(estimate.ci95[key][1]),
    );
    return tr;
  });
}

// One CSV field: quoted when it holds a comma, a quote or a line break (RFC 4180).
function csvField(text) {
  return /[",\r\n]/.test(text) ? `"${text.replaceAll('"', '""')}"` : text;
}

// The estimate as CSV text: every value of a histogram, or the one number; full precision.
export function estimateCsv(estimate) {
  const lines = ["value,estimate,stderr,ci95_low,ci95_high"];
  if (estimate.kind === "histogram") {
    for (const key of Object.keys(estimate.values)) {
      const [low, high] = estimate.ci95[key];
      lines.push([csvField(key), estimate.values[key], estimate.stderr[key], low, high].join(","));
    }
  } else {
    lines.push([estimate.kind, estimate.value, estimate.stderr, ...estimate.ci95].join(","));
  }
  return `${lines.join("\r\n")}\r\n`;
}

// A proportion's or mean's numbers, one row: estimate, standard error, 95% interval.
export function scalarRow(estimate) {
  const tr = document.createElement("tr");
  tr.append(
    textCell(estimate.kind),
    numberCell(estimate.value, "est-value"),
    numberCell(estimate.stderr, "est-stderr"),
    numberCell(estimate.ci95[0], "est-low"),
    numberCell(estimate.ci95[1], "est-high"),
  );
  return tr;
}
