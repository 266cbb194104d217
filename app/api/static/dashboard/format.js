// One number format for the whole dashboard (list, numbers, chart, reading, what-if):
// integers as they are, anything else to 4 significant digits without trailing zeros
// (0.5, 1.234, 0.0001235, 12350). The exact value is in each cell's title.
// Also the few words that describe a query, and local times.

export function num(value) {
  if (typeof value !== "number" || !Number.isFinite(value)) {
    return String(value ?? "");
  }
  if (Number.isInteger(value)) {
    return String(value);
  }
  return String(Number(value.toPrecision(4)));
}

// A query in a few words: "grr on flu", 'binary_rr [disease == "flu"]', "matrix (2 outputs)".
export function describeQuery(query) {
  const parts = [query.mechanism];
  if (query.attribute) {
    parts.push(`on ${query.attribute}`);
  }
  if (query.predicate) {
    parts.push(`[${query.predicate.attribute} ${query.predicate.op} ${JSON.stringify(query.predicate.value)}]`);
  }
  if (query.weights) {
    parts.push(`weights ${JSON.stringify(query.weights)}`);
  }
  if (query.range) {
    parts.push(`range [${num(query.range[0])}, ${num(query.range[1])}]`);
  }
  if (query.variant) {
    parts.push(query.variant);
  }
  if (Array.isArray(query.outputs)) {
    parts.push(`(${query.outputs.length} outputs)`);
  }
  return parts.join(" ");
}

// A moment from the API (ISO 8601) in the reader's local time; "" for none.
export function fmtTime(iso) {
  if (!iso) {
    return "";
  }
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? iso : date.toLocaleString();
}
