// The loss chart of one object, drawn as inline SVG: realized loss (upper, and lower where it
// differs) after each accepted query, next to basic composition and the budget.

import { num } from "./format.js";

const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 640;
const HEIGHT = 320;
const MARGIN = { left: 56, right: 20, top: 16, bottom: 44 };

// An SVG element with its attributes (and text): the charts, the estimate plots and the progress
// bars all build their SVG through this.
export function element(name, attributes, text) {
  const node = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) {
    node.setAttribute(key, String(value));
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

// About `count` round tick values from 0 to at least `max`.
export function ticks(max, count, integer) {
  const raw = max / count;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  let step = [1, 2, 2.5, 5, 10].map((m) => m * magnitude).find((s) => s >= raw);
  if (integer) {
    step = Math.max(1, Math.ceil(step));
  }
  const values = [];
  for (let v = 0; v <= max + step * 1e-9; v += step) {
    values.push(Number(v.toPrecision(12)));
  }
  if (values[values.length - 1] < max) {
    values.push(Number((values[values.length - 1] + step).toPrecision(12)));
  }
  return values;
}

// Whether the lower bound differs visibly from the upper one anywhere.
export function lowerDiffers(points) {
  return points.some((p) => p.upper - p.lower > 1e-6 * Math.max(1, p.upper));
}

function pathOf(points, x, y, key) {
  return points.map((p, i) => `${i ? "L" : "M"}${x(p.accepted).toFixed(2)} ${y(p[key]).toFixed(2)}`).join(" ");
}

// Draw into `svg` (emptied first); `legend` gets a key of the lines.
// data: {budget, points: [{accepted, lower, upper, basic}, ...] in query order,
//        rejections: [{after_accepted, at}, ...]}.
export function renderChart(svg, legend, data) {
  svg.replaceChildren();
  const points = [{ accepted: 0, lower: 0, upper: 0, basic: 0 }, ...data.points];
  const n = points[points.length - 1].accepted;
  const top = Math.max(data.budget, ...points.map((p) => Math.max(p.upper, p.basic))) * 1.08;
  const yTicks = ticks(top, 5, false);
  const xTicks = ticks(Math.max(n, 1), Math.min(Math.max(n, 1), 8), true);
  const xMax = xTicks[xTicks.length - 1];
  const yMax = yTicks[yTicks.length - 1];
  const plotW = WIDTH - MARGIN.left - MARGIN.right;
  const plotH = HEIGHT - MARGIN.top - MARGIN.bottom;
  const x = (v) => MARGIN.left + (v / xMax) * plotW;
  const y = (v) => MARGIN.top + plotH - (v / yMax) * plotH;

  svg.append(element("title", {}, "Realized privacy loss against the number of accepted queries"));
  const grid = element("g", { class: "grid" });
  for (const v of yTicks) {
    grid.append(element("line", { x1: MARGIN.left, x2: WIDTH - MARGIN.right, y1: y(v), y2: y(v) }));
    grid.append(element("text", { x: MARGIN.left - 6, y: y(v) + 4, class: "tick y" }, num(v)));
  }
  for (const v of xTicks) {
    grid.append(element("line", { x1: x(v), x2: x(v), y1: MARGIN.top, y2: MARGIN.top + plotH }));
    grid.append(element("text", { x: x(v), y: MARGIN.top + plotH + 16, class: "tick x" }, String(v)));
  }
  svg.append(grid);
  svg.append(
    element("text", { x: MARGIN.left + plotW / 2, y: HEIGHT - 6, class: "axis-label" }, "accepted queries"),
    element(
      "text",
      { x: 14, y: MARGIN.top + plotH / 2, class: "axis-label", transform: `rotate(-90 14 ${MARGIN.top + plotH / 2})` },
      "privacy loss (ε)",
    ),
  );

  svg.append(element("line", { class: "budget", x1: MARGIN.left, x2: WIDTH - MARGIN.right, y1: y(data.budget), y2: y(data.budget) }));
  svg.append(element("path", { class: "basic", d: pathOf(points, x, y, "basic") }));
  const showLower = lowerDiffers(points);
  // the certified band: the realized loss lies between the lower and upper bounds
  const band = [
    ...points.map((p) => `${x(p.accepted).toFixed(2)},${y(p.upper).toFixed(2)}`),
    ...[...points].reverse().map((p) => `${x(p.accepted).toFixed(2)},${y(p.lower).toFixed(2)}`),
  ].join(" ");
  svg.append(element("polygon", { class: "band", points: band }));
  if (showLower) {
    svg.append(element("path", { class: "loss-lower", d: pathOf(points, x, y, "lower") }));
  }
  svg.append(element("path", { class: "loss-upper", d: pathOf(points, x, y, "upper") }));
  if (points.length <= 200) {
    const dots = element("g", { class: "dots" });
    for (const p of points.slice(1)) {
      const dot = element("circle", { cx: x(p.accepted), cy: y(p.upper), r: 3 });
      dot.append(element("title", {}, `after query ${p.accepted}: loss in [${num(p.lower)}, ${num(p.upper)}], basic ${num(p.basic)}`));
      dots.append(dot);
    }
    svg.append(dots);
  }

  // rejected submits, between the accepted queries they came after (a cross on the loss line)
  const rejections = data.rejections || [];
  if (rejections.length) {
    const marks = element("g", { class: "rejections" });
    const counts = new Map();
    for (const r of rejections) {
      counts.set(r.after_accepted, (counts.get(r.after_accepted) || 0) + 1);
    }
    for (const [after, count] of counts) {
      const at = points.find((p) => p.accepted === after) || points[points.length - 1];
      const cx = x(Math.min(after + 0.5, xMax));
      const cy = y(at.upper);
      const mark = element("path", {
        class: "rejection",
        d: `M${cx - 4} ${cy - 4} L${cx + 4} ${cy + 4} M${cx - 4} ${cy + 4} L${cx + 4} ${cy - 4}`,
      });
      mark.dataset.after = String(after);
      mark.append(element("title", {}, `${count} rejected after query ${after}`));
      marks.append(mark);
    }
    svg.append(marks);
  }

  legend.replaceChildren();
  const entries = [
    ["loss-upper", "realized loss (upper bound)"],
    ...(showLower ? [["loss-lower", "realized loss (lower bound)"]] : []),
    ["band", "certified band: lower ≤ loss ≤ upper"],
    ...(rejections.length ? [["rejection", `rejected queries (${rejections.length})`]] : []),
    ["basic", "basic composition Σε"],
    ["budget", `budget ε_g = ${num(data.budget)}`],
  ];
  for (const [kind, label] of entries) {
    const item = document.createElement("span");
    item.className = "legend-item";
    const swatch = document.createElement("span");
    swatch.className = `swatch ${kind}`;
    item.append(swatch, label);
    legend.append(item);
  }
}
