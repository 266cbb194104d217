// An object's data versions (issue 24): the realized loss of each version stacked in one bar
// against the lifetime budget ε_L, and a table of the versions. The lifetime's realized loss is
// exactly the sum of the versions' losses (a query reads one version, so the likelihood over the
// object's whole life factorizes), so the stack's length is the lifetime's upper bound.

import { element } from "./chart.js";
import { fmtTime, num } from "./format.js";

const WIDTH = 640;
const HEIGHT = 96;
const MARGIN = { left: 16, right: 16, top: 18, bottom: 30 };
const BAR = 28;

// Draw into `svg`, the legend into `legend`, the rows into `table`'s body and the chart's text
// alternative into `caption`.
// data: {lifetime: {budget, realized_loss, versions, remaining} | null, current: n,
//        versions: [{version, created_at, accepted, lower, upper}, ...] oldest first}.
export function renderVersions({ svg, legend, table, caption }, data) {
  const total = data.versions.reduce((sum, v) => sum + v.upper, 0);
  const budget = data.lifetime ? data.lifetime.budget : null;
  const top = Math.max(budget ?? 0, total, 1e-12) * 1.05;
  const plotW = WIDTH - MARGIN.left - MARGIN.right;
  const x = (v) => MARGIN.left + (v / top) * plotW;

  svg.replaceChildren();
  svg.append(element("title", {}, "Realized privacy loss of each data version, stacked"));
  caption.textContent = summary(data, total);
  svg.append(element("rect", { class: "track", x: MARGIN.left, y: MARGIN.top, width: plotW, height: BAR }));
  const segments = element("g", { class: "segments" });
  let start = 0;
  for (const v of data.versions) {
    const width = x(start + v.upper) - x(start);
    const segment = element("rect", {
      class: `segment ${v.version === data.current ? "current" : v.version % 2 ? "odd" : "even"}`,
      x: x(start).toFixed(2),
      y: MARGIN.top,
      width: Math.max(0, width).toFixed(2),
      height: BAR,
    });
    segment.dataset.version = String(v.version);
    segment.dataset.upper = String(v.upper);
    segment.append(
      element("title", {}, `version ${v.version}${v.version === data.current ? " (current)" : ""}: loss in [${num(v.lower)}, ${num(v.upper)}] after ${v.accepted} queries`),
    );
    segments.append(segment);
    start += v.upper;
  }
  svg.append(segments);
  svg.append(element("text", { x: MARGIN.left, y: HEIGHT - 8, class: "tick start" }, "0"));
  if (budget !== null) {
    const at = x(budget);
    svg.append(element("line", { class: "lifetime", x1: at, x2: at, y1: MARGIN.top - 8, y2: MARGIN.top + BAR + 8 }));
    svg.append(element("text", { x: at, y: HEIGHT - 8, class: "tick lifetime" }, `ε_L = ${num(budget)}`));
  } else {
    svg.append(element("text", { x: x(total), y: HEIGHT - 8, class: "tick end" }, num(total)));
  }

  legend.replaceChildren(
    ...[
      ["segment-current", `current version (${data.current})`],
      ["segment", "earlier versions (alternating shades)"],
      ...(budget !== null ? [["lifetime", `lifetime budget ε_L = ${num(budget)}`]] : []),
    ].map(([kind, label]) => {
      const item = document.createElement("span");
      item.className = "legend-item";
      const swatch = document.createElement("span");
      swatch.className = `swatch ${kind}`;
      item.append(swatch, label);
      return item;
    }),
  );

  const body = document.createElement("tbody");
  for (const v of [...data.versions].reverse()) {
    const tr = document.createElement("tr");
    tr.dataset.version = String(v.version);
    if (v.version === data.current) {
      tr.classList.add("current");
    }
    tr.append(
      cell(v.version, `${v.version}${v.version === data.current ? " (current)" : ""}`),
      cell(null, fmtTime(v.created_at)),
      cell(v.accepted),
      cell(v.lower),
      cell(v.upper),
    );
    body.append(tr);
  }
  table.tBodies[0].replaceWith(body);
}

function cell(value, text) {
  const td = document.createElement("td");
  td.textContent = text ?? num(value);
  if (value !== null) {
    td.className = "num";
    td.dataset.value = String(value);
    td.title = String(value);
  }
  return td;
}

// The chart's text alternative: every figure it draws, in words.
function summary(data, total) {
  const parts = [
    `Realized privacy loss of each of ${data.versions.length} data versions, stacked: ${num(total)} in all (upper bounds)`,
  ];
  if (data.lifetime) {
    parts.push(
      `against a lifetime budget of ${num(data.lifetime.budget)} (lifetime loss in [${num(data.lifetime.realized_loss.lower)}, ${num(data.lifetime.realized_loss.upper)}], ${num(data.lifetime.remaining)} remaining)`,
    );
  }
  return `${parts.join(" ")}.`;
}
