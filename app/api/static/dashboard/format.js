// One number format for the whole dashboard (list, numbers, chart, reading, what-if):
// integers as they are, anything else to 4 significant digits without trailing zeros
// (0.5, 1.234, 0.0001235, 12350). The exact value is in each cell's title.

export function num(value) {
  if (typeof value !== "number" || !Number.isFinite(value)) {
    return String(value ?? "");
  }
  if (Number.isInteger(value)) {
    return String(value);
  }
  return String(Number(value.toPrecision(4)));
}
