// The list's filter: "field op number [and field op number ...]", or the start of an object id.

// Filterable numbers of a row (see rowOf in app.js), with the names a user may type.
export const FIELDS = {
  budget: "budget",
  lower: "lower",
  upper: "upper",
  loss: "upper",
  remaining: "remaining",
  basic: "basic",
  accepted: "accepted",
  rejected: "rejected",
};

const OPERATORS = {
  "<": (a, b) => a < b,
  "<=": (a, b) => a <= b,
  ">": (a, b) => a > b,
  ">=": (a, b) => a >= b,
  "=": (a, b) => Math.abs(a - b) <= 1e-9 * Math.max(1, Math.abs(a), Math.abs(b)),
};
OPERATORS["=="] = OPERATORS["="];

const TOKEN = /\s*(?:(<=|>=|==|<|>|=)|([A-Za-z_][A-Za-z_0-9]*)|([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?))/y;

function tokenize(text) {
  const tokens = [];
  TOKEN.lastIndex = 0;
  while (TOKEN.lastIndex < text.length) {
    if (/^\s*$/.test(text.slice(TOKEN.lastIndex))) {
      break;
    }
    const at = TOKEN.lastIndex;
    const match = TOKEN.exec(text);
    if (match === null) {
      throw new Error(`cannot read "${text.slice(at).trim()}"`);
    }
    if (match[1] !== undefined) {
      tokens.push({ kind: "op", text: match[1] });
    } else if (match[2] !== undefined) {
      tokens.push({ kind: "word", text: match[2] });
    } else {
      tokens.push({ kind: "number", text: match[3], value: Number(match[3]) });
    }
  }
  return tokens;
}

function parseConditions(tokens) {
  const conditions = [];
  let i = 0;
  for (;;) {
    const [field, op, number] = tokens.slice(i, i + 3);
    if (!field || field.kind !== "word" || !(field.text.toLowerCase() in FIELDS)) {
      const seen = field ? `"${field.text}"` : "nothing";
      throw new Error(`expected a field (${Object.keys(FIELDS).join(", ")}), found ${seen}`);
    }
    if (!op || op.kind !== "op") {
      throw new Error(`expected one of < <= > >= = after ${field.text}`);
    }
    if (!number || number.kind !== "number" || !Number.isFinite(number.value)) {
      throw new Error(`expected a number after ${field.text} ${op.text}`);
    }
    conditions.push({ field: FIELDS[field.text.toLowerCase()], op: op.text, value: number.value });
    i += 3;
    if (i === tokens.length) {
      return conditions;
    }
    if (tokens[i].kind !== "word" || tokens[i].text.toLowerCase() !== "and") {
      throw new Error(`expected "and", found "${tokens[i].text}"`);
    }
    i += 1;
  }
}

// {kind: "all" | "text" | "expression", test(row) -> boolean}, or {kind: "error", message}.
export function parseFilter(text) {
  const trimmed = text.trim();
  if (trimmed === "") {
    return { kind: "all", test: () => true };
  }
  if (!/[<>=]/.test(trimmed)) {
    // the start of an id, exact case: the service searches it (GET /v1/odometers?id_prefix=)
    return { kind: "text", prefix: trimmed, test: (row) => row.id.startsWith(trimmed) };
  }
  let conditions;
  try {
    conditions = parseConditions(tokenize(trimmed));
  } catch (error) {
    return { kind: "error", message: error.message };
  }
  return {
    kind: "expression",
    conditions,
    test: (row) => conditions.every((c) => OPERATORS[c.op](row[c.field], c.value)),
  };
}
