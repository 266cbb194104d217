// Labels: public name/value metadata of objects (docs/surveys.md). The list's label filter
// (GET /v1/odometers?label=name:value, every label must match), kept in the address
// (#/?label=study%3Aflu) so that a filtered list can be linked to; and the chips showing them.

// The service's rules for a label (app/services/objects.py): a name of 1-64 letters, digits and
// ._- starting with a letter or digit; a value of 1-256 characters without control characters.
const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
const VALUE = /^[^\u0000-\u001f\u007f]{1,256}$/u;
// GET /v1/odometers takes at most this many label conditions.
export const MAX_LABEL_FILTERS = 20;

// "name:value" (split at the first colon; the value may contain colons, and spaces, kept as
// they are) as {name, value, text}, or {error} saying what is wrong.
export function parseLabel(text) {
  const at = text.indexOf(":");
  if (at < 0) {
    return { error: "a label filter is name:value, for example study:flu-2026" };
  }
  const name = text.slice(0, at);
  const value = text.slice(at + 1);
  if (!NAME.test(name)) {
    return { error: "a label name is 1-64 letters, digits, '.', '_' or '-' (starting with a letter or digit)" };
  }
  if (!VALUE.test(value)) {
    return { error: "a label value is 1-256 characters without control characters" };
  }
  return { name, value, text: `${name}:${value}` };
}

// The label filters ("name:value" strings) in the address of the objects list.
export function labelsFromHash(hash) {
  const at = hash.indexOf("?");
  if (at < 0) {
    return [];
  }
  const found = [];
  for (const text of new URLSearchParams(hash.slice(at + 1)).getAll("label")) {
    const label = parseLabel(text);
    if (!label.error && !found.includes(label.text)) {
      found.push(label.text);
    }
  }
  return found.slice(0, MAX_LABEL_FILTERS);
}

// The address of the objects list filtered by `labels` ("name:value" strings).
export function listHash(labels) {
  if (!labels.length) {
    return "#/";
  }
  return `#/?${labels.map((l) => `label=${encodeURIComponent(l)}`).join("&")}`;
}

// The query string part of GET /v1/odometers for `labels`.
export function labelQuery(labels) {
  return labels.map((l) => `&label=${encodeURIComponent(l)}`).join("");
}

// One label as a chip: a link to the objects carrying it, or a button calling onClick.
export function labelChip(name, value, { onClick } = {}) {
  const text = `${name}: ${value}`;
  const chip = document.createElement(onClick ? "button" : "a");
  chip.className = "chip";
  chip.textContent = text;
  chip.dataset.label = `${name}:${value}`;
  if (onClick) {
    chip.type = "button";
    chip.title = `Show only objects labelled ${text}`;
    chip.addEventListener("click", () => onClick(`${name}:${value}`));
  } else {
    chip.href = listHash([`${name}:${value}`]);
    chip.title = `Objects labelled ${text}`;
  }
  return chip;
}

// The chips of an object's labels (sorted by name), in a span.
export function labelChips(labels, options) {
  const box = document.createElement("span");
  box.className = "chips";
  for (const name of Object.keys(labels || {}).sort()) {
    box.append(labelChip(name, labels[name], options));
  }
  return box;
}
