// The dashboard: sign-in, the list of objects, one object's chart, reading and history, and
// the population surveys. Everything shown comes from the JSON API (GET /v1/whoami,
// /v1/odometers, /v1/objects/{id}/odometer, /odometer/history (?version=v for the earlier data
// versions) and, for analysts and admins, /queries; GET /v1/surveys and /v1/surveys/{id}).

import { ApiError, Poller, describeError, getJson, postJson } from "./api.js";
import { renderChart } from "./chart.js";
import { describeQuery, fmtTime, num } from "./format.js";
import { parseFilter } from "./filter.js";
import { MAX_LABEL_FILTERS, labelChips, labelQuery, labelsFromHash, listHash, parseLabel } from "./labels.js";
import { renderReading } from "./reading.js";
import { renderVersions } from "./versions.js";
import { clearSurvey, isActive, refreshSurveys, renderSurvey, renderSurveyList } from "./surveys.js";

const STORAGE_KEY = "gatekeeper.apiKey";
// Rows per page of the list: the service searches, filters, counts and pages (by keyset), so
// the page never holds more than this many objects, however many there are.
const PAGE = 250;
// Points per page when reading a closed data version's odometer history (the API's largest
// page): only its last point, the version's final loss, is kept.
const VERSION_PAGE = 10000;
// An id prefix the service can be asked for (the characters of an id: app/services/objects.py).
const ID_PREFIX = /^[A-Za-z0-9._:@-]{1,128}$/;
const $ = (id) => document.getElementById(id);

function pollSeconds() {
  const asked = Number(new URLSearchParams(window.location.search).get("poll"));
  return Number.isFinite(asked) && asked >= 1 ? asked : 5;
}

const state = {
  key: null,
  who: null,
  interval: pollSeconds(),
  poller: null,
  rows: [],
  total: 0,
  totals: null,
  loaded: false,
  // keyset paging: the id the shown page starts after (null: the first page), and the ones
  // of the pages before it (for "Previous")
  after: null,
  before: [],
  sortKey: "id",
  sortDir: 1,
  filter: parseFilter(""),
  labels: [],
  detail: null,
  surveys: null,
};

// --- small helpers -----------------------------------------------------------------------------

const VIEWS = ["sign-in-view", "list-view", "detail-view", "surveys-view", "survey-view"];

function show(viewId) {
  for (const id of VIEWS) {
    $(id).hidden = id !== viewId;
  }
  $("nav").hidden = viewId === "sign-in-view";
  const surveys = viewId === "surveys-view" || viewId === "survey-view";
  for (const [id, current] of [["nav-objects", !surveys], ["nav-surveys", surveys]]) {
    if (current) {
      $(id).setAttribute("aria-current", "page");
    } else {
      $(id).removeAttribute("aria-current");
    }
  }
}

function setStatus(message) {
  $("status").textContent = message;
  $("status").hidden = false;
}

function clearStatus() {
  $("status").hidden = true;
  $("status").textContent = "";
}

function fmt(value) {
  return num(value);
}

function cell(value, { numeric = false, text } = {}) {
  const td = document.createElement("td");
  td.textContent = text ?? fmt(value);
  if (numeric) {
    td.className = "num";
    td.dataset.value = String(value);
    td.title = String(value);
  }
  return td;
}

function objectHref(id) {
  return `#/objects/${encodeURIComponent(id)}`;
}

function encode(id) {
  return encodeURIComponent(id);
}

function mayReadQueries() {
  return state.who !== null && state.who.role !== "viewer";
}

function touched(poller) {
  $("updated").textContent = `Updated ${new Date().toLocaleTimeString()} · refreshing every ${poller.interval} s`;
}

function startPolling(task) {
  if (state.poller) {
    state.poller.stop();
  }
  const poller = new Poller(task, {
    interval: state.interval,
    onSuccess: () => {
      clearStatus();
      touched(poller);
    },
    onError: (error, delay) => {
      setStatus(`${describeError(error)} Retrying in ${delay} s.`);
    },
  });
  state.poller = poller;
  poller.start();
}

// --- sign-in -----------------------------------------------------------------------------------

function showSignedIn() {
  $("who").textContent = `#${state.who.key_id} (${state.who.role})`;
  $("session").hidden = false;
}

async function signIn(key) {
  const who = await getJson("v1/whoami", key);
  state.key = key;
  state.who = who;
  sessionStorage.setItem(STORAGE_KEY, key);
  showSignedIn();
}

function signOut(message) {
  if (state.poller) {
    state.poller.stop();
    state.poller = null;
  }
  sessionStorage.removeItem(STORAGE_KEY);
  state.key = null;
  state.who = null;
  state.rows = [];
  state.detail = null;
  state.surveys = null;
  $("session").hidden = true;
  clearStatus();
  $("sign-in-error").hidden = !message;
  $("sign-in-error").textContent = message || "";
  $("key").value = "";
  show("sign-in-view");
  $("key").focus();
}

async function onSignInSubmit(event) {
  event.preventDefault();
  const key = $("key").value.trim();
  $("sign-in-error").hidden = true;
  try {
    await signIn(key);
  } catch (error) {
    const message =
      error instanceof ApiError && error.status === 401
        ? "This API key was not accepted: it is unknown or has been revoked."
        : describeError(error);
    $("sign-in-error").textContent = message;
    $("sign-in-error").hidden = false;
    return;
  }
  $("key").value = "";
  route();
}

// A key saved in this tab: check it (retrying while the service is unreachable).
function resume(key) {
  show("sign-in-view");
  state.poller = new Poller(
    async () => {
      try {
        await signIn(key);
      } catch (error) {
        if (error instanceof ApiError && error.status === 401) {
          signOut("Your saved API key is no longer accepted; sign in again.");
          return;
        }
        throw error;
      }
      state.poller.stop();
      route();
    },
    {
      interval: state.interval,
      onError: (error, delay) => setStatus(`${describeError(error)} Retrying in ${delay} s.`),
    },
  );
  state.poller.start();
}

// --- the list of objects -----------------------------------------------------------------------

function rowOf(item) {
  return {
    id: item.id,
    filter: item.filter,
    labels: item.labels || {},
    status: item.status,
    budget: item.budget,
    lower: item.realized_loss.lower,
    upper: item.realized_loss.upper,
    remaining: item.remaining,
    basic: item.basic_composition,
    accepted: item.accepted,
    rejected: item.rejected,
    updated: item.updated_at,
  };
}

// What the service is asked for: the label filters, the id prefix typed in the filter box, the
// status and "include retired". The same for the page and for its totals.
function listParams() {
  const params = [labelQuery(state.labels)];
  if (state.filter.kind === "text") {
    params.push(`&id_prefix=${encodeURIComponent(state.filter.prefix)}`);
  }
  if ($("include-retired").checked) {
    params.push("&include_retired=true");
  }
  return params.join("");
}

// A typed id that no id can start with (a space, a character ids never hold): nothing matches,
// so the service is not asked.
function impossiblePrefix() {
  return state.filter.kind === "text" && !ID_PREFIX.test(state.filter.prefix);
}

async function loadList(poller) {
  if (impossiblePrefix()) {
    state.rows = [];
    state.total = 0;
    state.totals = { objects: 0, active: 0, retired: 0, exhausted: 0, near_exhaustion: 0, rejected: 0 };
    state.loaded = true;
    renderList();
    return;
  }
  const params = listParams();
  const status = $("status-filter").value ? `&status=${$("status-filter").value}` : "";
  const after = state.after === null ? "" : `&after=${encodeURIComponent(state.after)}`;
  // both asked at once; the rows are shown as soon as they come (the totals scan every
  // matching object, which takes longer with many), the summary when its counts come
  const pending = getJson(`v1/odometers/totals?${params.slice(1)}`, state.key);
  pending.catch(() => {}); // a failure is reported below, where it is awaited
  const page = await getJson(`v1/odometers?limit=${PAGE}${after}${status}${params}`, state.key);
  if (poller.stopped) {
    return; // replaced (another filter, include retired, another page): not this list any more
  }
  state.rows = page.items.map(rowOf);
  state.total = page.total;
  state.loaded = true;
  renderList();
  const totals = await pending;
  if (poller.stopped) {
    return;
  }
  state.totals = totals;
  renderSummary();
}

// Back to the first page and ask again (a filter, the status or "include retired" changed).
function reloadList() {
  state.after = null;
  state.before = [];
  state.totals = null; // counted again for the new filters
  state.loaded = false;
  if (state.key !== null) {
    startPolling(loadList);
  }
}

function nextPage() {
  if (state.rows.length === 0) {
    return;
  }
  state.before.push(state.after);
  state.after = state.rows[state.rows.length - 1].id;
  startPolling(loadList);
}

function previousPage() {
  state.after = state.before.length ? state.before.pop() : null;
  startPolling(loadList);
}

function compare(a, b) {
  const x = a[state.sortKey];
  const y = b[state.sortKey];
  if (typeof x === "number" && typeof y === "number") {
    return (x - y) * state.sortDir || a.id.localeCompare(b.id);
  }
  return String(x ?? "").localeCompare(String(y ?? "")) * state.sortDir || a.id.localeCompare(b.id);
}

function renderList() {
  const filterError = $("filter-error");
  if (state.filter.kind === "error") {
    filterError.textContent = `Filter not understood: ${state.filter.message}`;
    filterError.hidden = false;
  } else {
    filterError.hidden = true;
  }
  const test = state.filter.kind === "error" ? () => true : state.filter.test;
  const shown = state.rows.filter(test).sort(compare);
  const body = document.createElement("tbody");
  for (const row of shown) {
    const tr = document.createElement("tr");
    tr.dataset.id = row.id;
    if (row.status === "retired") {
      tr.classList.add("retired");
    }
    if (row.status !== "retired" && row.remaining < 0.1 * row.budget) {
      tr.classList.add("near-exhaustion");
    }
    const idCell = document.createElement("td");
    const link = document.createElement("a");
    link.href = objectHref(row.id);
    link.textContent = row.id;
    idCell.append(link);
    if (Object.keys(row.labels).length) {
      const chips = labelChips(row.labels, { onClick: addLabelFilter });
      chips.classList.add("row-labels");
      idCell.append(chips);
    }
    tr.append(
      idCell,
      cell(row.filter, { text: row.status === "retired" ? `${row.filter} (retired)` : row.filter }),
      cell(row.budget, { numeric: true }),
      cell(row.lower, { numeric: true }),
      cell(row.upper, { numeric: true }),
      cell(row.remaining, { numeric: true }),
      cell(row.basic, { numeric: true }),
      cell(row.accepted, { numeric: true }),
      cell(row.rejected, { numeric: true }),
      cell(row.updated, { text: fmtTime(row.updated) }),
    );
    body.append(tr);
  }
  $("objects").tBodies[0].replaceWith(body);
  const filtered = state.filter.kind !== "all" || state.labels.length > 0 || $("status-filter").value;
  $("no-match").hidden = !(state.loaded && shown.length === 0 && (state.rows.length > 0 || filtered));
  renderSummary();
  renderPager();
  const labelled = state.labels.length ? ` with ${state.labels.length > 1 ? "these labels" : "this label"}` : "";
  $("count").textContent = `${shown.length} of ${state.total} objects${labelled}${pageNote()}`;
  for (const th of $("objects").tHead.rows[0].cells) {
    const sorted = th.dataset.key === state.sortKey;
    th.setAttribute("aria-sort", sorted ? (state.sortDir > 0 ? "ascending" : "descending") : "none");
  }
}

// Which rows of how many this page shows ("rows 1001–2000"), when there is more than one page.
function pageNote() {
  if (state.after === null && state.rows.length >= state.total) {
    return "";
  }
  const first = state.before.length * PAGE + 1;
  const expression = state.filter.kind === "expression" ? "; the expression filters this page" : "";
  return ` (rows ${first}–${first + state.rows.length - 1}${expression})`;
}

function renderPager() {
  $("pager").hidden = state.after === null && state.rows.length < PAGE;
  $("page-previous").disabled = state.after === null;
  $("page-next").disabled = state.rows.length < PAGE;
}

// The summary strip: the service's counts (GET /v1/odometers/totals) over every object the
// labels and id prefix select — not the loaded rows — with the definitions of the metrics.
function renderSummary() {
  const totals = state.totals;
  for (const [id, key] of [
    ["sum-objects", "objects"],
    ["sum-exhausted", "exhausted"],
    ["sum-near", "near_exhaustion"],
    ["sum-rejected", "rejected"],
  ]) {
    $(id).textContent = totals === null ? "–" : num(totals[key]);
    $(id).dataset.value = totals === null ? "" : String(totals[key]);
  }
}

// --- label filters (in the address: #/?label=name%3Avalue) --------------------------------------

function renderLabelFilters() {
  const chips = $("label-chips");
  chips.replaceChildren(
    ...state.labels.map((text) => {
      const chip = document.createElement("span");
      chip.className = "chip active";
      chip.dataset.label = text;
      const at = text.indexOf(":");
      chip.append(`${text.slice(0, at)}: ${text.slice(at + 1)}`);
      const remove = document.createElement("button");
      remove.type = "button";
      remove.className = "remove";
      remove.textContent = "×";
      remove.setAttribute("aria-label", `Remove the label filter ${text}`);
      remove.addEventListener("click", () => {
        window.location.hash = listHash(state.labels.filter((l) => l !== text));
      });
      chip.append(remove);
      return chip;
    }),
  );
}

function addLabelFilter(text) {
  const label = parseLabel(text);
  const error = $("label-error");
  if (label.error) {
    error.textContent = `Label filter not understood: ${label.error}.`;
    error.hidden = false;
    return false;
  }
  if (!state.labels.includes(label.text) && state.labels.length >= MAX_LABEL_FILTERS) {
    error.textContent = `At most ${MAX_LABEL_FILTERS} label filters.`;
    error.hidden = false;
    return false;
  }
  error.hidden = true;
  if (!state.labels.includes(label.text)) {
    window.location.hash = listHash([...state.labels, label.text]);
  }
  return true;
}

function onLabelSubmit(event) {
  event.preventDefault();
  // what is typed is trimmed (a click on a label passes its exact text)
  if (addLabelFilter($("label-filter").value.trim())) {
    $("label-filter").value = "";
  }
}

function onHeaderClick(event) {
  const th = event.target.closest("th");
  if (!th || !th.dataset.key) {
    return;
  }
  if (state.sortKey === th.dataset.key) {
    state.sortDir = -state.sortDir;
  } else {
    state.sortKey = th.dataset.key;
    state.sortDir = 1;
  }
  renderList();
}

// --- one object --------------------------------------------------------------------------------

function newDetail(id) {
  return {
    id,
    odometer: null,
    meta: null,
    points: [],
    rejections: [],
    rejectedSeen: -1,
    queries: new Map(),
    drawn: "",
    read: "",
    // the current data version's start, and each closed version's final accounting (a closed
    // version never changes, so each is read once)
    created: null,
    closed: new Map(),
    drawnVersions: "",
    prior: 0.5,
  };
}

async function loadDetail() {
  const d = state.detail;
  const base = `v1/objects/${encode(d.id)}`;
  const odometer = await getJson(`${base}/odometer`, state.key);
  if (d.odometer !== null && d.odometer.version !== odometer.version) {
    // a new data version: its history (points, rejections, queries) starts again
    d.points = [];
    d.rejections = [];
    d.queries = new Map();
    d.rejectedSeen = -1;
    d.created = null;
    d.drawn = "";
  }
  if (d.meta === null) {
    // object metadata (its domain) is for analysts and admins, as GET /v1/objects/{id} is
    d.meta = mayReadQueries() ? await getJson(base, state.key) : { domain: null };
    renderDomain(d.meta.domain);
    setUpWhatIf(d);
  }
  const last = () => (d.points.length ? d.points[d.points.length - 1].accepted : 0);
  if (d.odometer === null || last() < odometer.accepted || d.rejectedSeen !== odometer.rejected) {
    const before = last();
    let after = before;
    // rejections at or after `before` are listed again by the pages read now
    d.rejections = d.rejections.filter((r) => r.after_accepted < before);
    for (;;) {
      const page = await getJson(`${base}/odometer/history?limit=${PAGE}&after=${after}`, state.key);
      if (page.version === odometer.version) {
        d.created = page.created_at ?? null;
      }
      d.rejections.push(...(page.rejections || []));
      for (const p of page.points) {
        d.points.push({
          accepted: p.accepted,
          lower: p.realized_loss.lower,
          upper: p.realized_loss.upper,
          basic: p.basic_composition,
          epsilon: p.epsilon,
          at: p.at,
        });
      }
      if (page.next_after === null || page.next_after === undefined) {
        break;
      }
      after = page.next_after;
    }
    if (mayReadQueries()) {
      after = before;
      for (;;) {
        const page = await getJson(`${base}/queries?limit=${PAGE}&after=${after}`, state.key);
        for (const q of page.items) {
          d.queries.set(q.seq, q);
        }
        if (page.next_after === null || page.next_after === undefined) {
          break;
        }
        after = page.next_after;
      }
    }
  }
  if (d.created === null && d.points.length === 0) {
    // the current version's start, when no page was read above
    const page = await getJson(`${base}/odometer/history?limit=1&after=0`, state.key);
    d.created = page.version === odometer.version ? (page.created_at ?? null) : null;
  }
  await loadClosedVersions(d, base, odometer.version);
  d.odometer = odometer;
  d.rejectedSeen = odometer.rejected;
  renderDetail();
}

// Each closed data version's start and final loss: the last point of its odometer history.
async function loadClosedVersions(d, base, current) {
  for (let version = 1; version < current; version += 1) {
    if (d.closed.has(version)) {
      continue;
    }
    let after = 0;
    let last = null;
    let created = null;
    for (;;) {
      const page = await getJson(
        `${base}/odometer/history?version=${version}&limit=${VERSION_PAGE}&after=${after}`,
        state.key,
      );
      created = page.created_at ?? null;
      if (page.points.length) {
        last = page.points[page.points.length - 1];
      }
      if (page.next_after === null || page.next_after === undefined) {
        break;
      }
      after = page.next_after;
    }
    d.closed.set(version, {
      version,
      created_at: created,
      accepted: last ? last.accepted : 0,
      lower: last ? last.realized_loss.lower : 0,
      upper: last ? last.realized_loss.upper : 0,
    });
  }
}

// The data versions card: shown for an object with more than one version or a lifetime budget.
function renderVersionsCard(d) {
  const odometer = d.odometer;
  const card = $("versions");
  card.hidden = odometer.version <= 1 && !odometer.lifetime;
  if (card.hidden) {
    return;
  }
  const versions = [...d.closed.values()].filter((v) => v.version < odometer.version);
  versions.sort((a, b) => a.version - b.version);
  versions.push({
    version: odometer.version,
    created_at: d.created,
    accepted: odometer.accepted,
    lower: odometer.realized_loss.lower,
    upper: odometer.realized_loss.upper,
  });
  const drawn = JSON.stringify([versions, odometer.lifetime ?? null]);
  if (drawn === d.drawnVersions) {
    return;
  }
  renderVersions(
    { svg: $("versions-chart"), legend: $("versions-legend"), table: $("versions-table"), caption: $("versions-summary") },
    { lifetime: odometer.lifetime ?? null, current: odometer.version, versions },
  );
  d.drawnVersions = drawn;
}

function describeAttribute(attribute) {
  if (attribute.type === "categorical") {
    return `${attribute.name}: categorical, one of ${attribute.values.map((v) => JSON.stringify(v)).join(", ")}`;
  }
  return `${attribute.name}: ${attribute.type} from ${num(attribute.low)} to ${num(attribute.high)}`;
}

function renderDomain(domain) {
  const list = $("domain-list");
  if (domain === null) {
    const item = document.createElement("li");
    item.className = "muted";
    item.textContent = "An analyst or admin key shows the object's domain.";
    list.replaceChildren(item);
    return;
  }
  list.replaceChildren(
    ...domain.attributes.map((attribute) => {
      const item = document.createElement("li");
      item.textContent = describeAttribute(attribute);
      return item;
    }),
  );
}

// "What if": analysts and admins dry-run a query on this object (viewers may not).
function setUpWhatIf(d) {
  const panel = $("what-if");
  panel.hidden = !mayReadQueries();
  if (panel.hidden) {
    return;
  }
  const first = d.meta.domain.attributes.find((a) => a.type !== "real") || d.meta.domain.attributes[0];
  $("what-if-query").value = JSON.stringify(
    first.type === "real"
      ? { mechanism: "linear", weights: { [first.name]: 1 }, range: [first.low, first.high], epsilon: 0.1 }
      : { mechanism: "grr", attribute: first.name, epsilon: 0.1 },
  );
  $("what-if-result").hidden = true;
  $("what-if-decision").textContent = "";
  $("what-if-error").hidden = true;
}

async function runWhatIf() {
  const d = state.detail;
  const error = $("what-if-error");
  error.hidden = true;
  let query;
  try {
    query = JSON.parse($("what-if-query").value);
  } catch (problem) {
    error.textContent = "The query is not valid JSON.";
    error.hidden = false;
    return;
  }
  let answer;
  try {
    answer = await postJson(`v1/objects/${encode(d.id)}/dry-run`, state.key, { query });
  } catch (problem) {
    error.textContent = describeError(problem);
    error.hidden = false;
    $("what-if-result").hidden = true;
    $("what-if-decision").textContent = "";
    return;
  }
  const decision = $("what-if-decision");
  decision.textContent = `${answer.decision === "accept" ? "Would be accepted" : "Would be rejected"}: worst case after ${num(answer.worst_case_after)} against a budget of ${num(answer.budget)}.`;
  decision.className = answer.decision;
  const body = document.createElement("tbody");
  for (const entry of answer.per_output) {
    const tr = document.createElement("tr");
    const within = entry.upper <= answer.budget;
    tr.append(
      cell(null, { text: JSON.stringify(entry.output) }),
      cell(entry.lower, { numeric: true }),
      cell(entry.upper, { numeric: true }),
      cell(null, { text: within ? "yes" : "no" }),
    );
    tr.lastChild.className = within ? "accept" : "reject";
    body.append(tr);
  }
  $("what-if-result").tBodies[0].replaceWith(body);
  $("what-if-result").hidden = false;
}

function renderNumbers(odometer) {
  const list = $("detail-numbers");
  list.replaceChildren();
  const items = [
    ["budget", "Budget ε_g", odometer.budget],
    ["lower", "Realized loss, lower bound", odometer.realized_loss.lower],
    ["upper", "Realized loss, upper bound", odometer.realized_loss.upper],
    ["remaining", "Remaining budget", odometer.remaining],
    ["basic", "Basic composition Σε", odometer.basic_composition],
    ["accepted", "Accepted queries", odometer.accepted],
    ["rejected", "Rejected queries", odometer.rejected],
  ];
  for (const [key, label, value] of items) {
    const dt = document.createElement("dt");
    dt.textContent = label;
    const dd = document.createElement("dd");
    dd.id = `num-${key}`;
    dd.dataset.value = String(value);
    dd.title = String(value);
    dd.textContent = fmt(value);
    list.append(dt, dd);
  }
  const dt = document.createElement("dt");
  dt.textContent = "Updated";
  const dd = document.createElement("dd");
  dd.textContent = fmtTime(odometer.updated_at);
  list.append(dt, dd);
}

function renderHistory(d) {
  const withQueries = mayReadQueries();
  const head = $("history").tHead.rows[0];
  const columns = [
    ["#", true],
    ["time", false],
    ["ε of the query", true],
    ["loss lower after", true],
    ["loss upper after", true],
    ["basic composition after", true],
  ];
  if (withQueries) {
    columns.push(["query", false], ["output", false]);
  }
  head.replaceChildren(
    ...columns.map(([name, numeric]) => {
      const th = document.createElement("th");
      th.scope = "col";
      th.textContent = name;
      if (numeric) {
        th.className = "num";
      }
      return th;
    }),
  );
  $("history-note").textContent = withQueries
    ? state.who.role === "analyst"
      ? "Newest first. As an analyst you see the query and output of your own queries only."
      : "Newest first."
    : "Newest first. A viewer key shows the loss after each query; analyst and admin keys also show each query and its output.";
  const body = document.createElement("tbody");
  for (const p of [...d.points].reverse()) {
    const tr = document.createElement("tr");
    tr.dataset.seq = String(p.accepted);
    tr.append(
      cell(p.accepted, { numeric: true }),
      cell(p.at, { text: fmtTime(p.at) }),
      cell(p.epsilon, { numeric: true }),
      cell(p.lower, { numeric: true }),
      cell(p.upper, { numeric: true }),
      cell(p.basic, { numeric: true }),
    );
    if (withQueries) {
      const q = d.queries.get(p.accepted);
      tr.append(
        cell(null, { text: q ? describeQuery(q.query) : "(another analyst's)" }),
        cell(null, { text: q ? JSON.stringify(q.output) : "" }),
      );
    }
    body.append(tr);
  }
  $("history").tBodies[0].replaceWith(body);
}

// An object's labels (public metadata): from its metadata (analyst, admin) or the list's row.
function renderDetailLabels(labels) {
  const box = $("detail-labels");
  if (labels === null) {
    box.replaceChildren("shown from the list of objects, or with an analyst or admin key");
    box.className = "chips muted";
  } else if (Object.keys(labels).length === 0) {
    box.replaceChildren("none");
    box.className = "chips muted";
  } else {
    box.replaceChildren(...labelChips(labels).childNodes);
    box.className = "chips";
  }
}

function renderDetail() {
  const d = state.detail;
  const odometer = d.odometer;
  $("detail-id").textContent = d.id;
  const known = state.rows.find((r) => r.id === d.id);
  $("detail-meta").textContent = known ? `· ${known.filter} filter · ${known.status}` : "";
  renderDetailLabels(d.meta && d.meta.labels ? d.meta.labels : known ? known.labels : null);
  renderNumbers(odometer);
  renderVersionsCard(d);
  const drawn = `${d.points.length}:${d.rejections.length}:${odometer.realized_loss.upper}:${odometer.budget}`;
  if (drawn !== d.drawn) {
    renderChart($("chart"), $("chart-legend"), {
      budget: odometer.budget,
      points: d.points,
      rejections: d.rejections,
    });
    renderHistory(d);
    d.drawn = drawn;
  }
  const read = `${odometer.realized_loss.lower}:${odometer.realized_loss.upper}:${odometer.accepted}`;
  if (read !== d.read) {
    const input = renderReading($("reading"), {
      loss: odometer.realized_loss.upper,
      lower: odometer.realized_loss.lower,
      budget: odometer.budget,
      accepted: odometer.accepted,
      prior: d.prior,
    });
    input.addEventListener("input", () => {
      d.prior = Number(input.value);
    });
    d.read = read;
  }
}

// --- surveys -----------------------------------------------------------------------------------

// The list of surveys: every page once, then at each refresh the newest ones and the older
// ones still running (refreshSurveys).
async function loadSurveyList(poller) {
  const found = await refreshSurveys(state.key, state.surveys);
  if (poller.stopped) {
    return;
  }
  state.surveys = found;
  renderSurveyList(found);
}

// One survey: refreshed while queued or running; once done, cancelled or failed its numbers
// are final and polling stops.
async function loadSurvey(poller, id) {
  const survey = await getJson(`v1/surveys/${id}`, state.key);
  if (poller.stopped) {
    return;
  }
  renderSurvey(survey);
  document.title = `${survey.name} · survey · ldp-gatekeeper`;
  if (!isActive(survey)) {
    poller.stop();
    clearStatus();
    $("updated").textContent = `Updated ${new Date().toLocaleTimeString()} · survey ${survey.status}: final, no longer refreshing`;
  }
}

// --- routing -----------------------------------------------------------------------------------

function route() {
  if (state.key === null) {
    show("sign-in-view");
    return;
  }
  const hash = window.location.hash;
  const survey = /^#\/surveys\/(\d+)$/.exec(hash);
  if (survey) {
    state.detail = null;
    clearSurvey(survey[1]);
    $("updated").textContent = "Loading the survey…";
    show("survey-view");
    document.title = `survey #${survey[1]} · ldp-gatekeeper`;
    startPolling((poller) => loadSurvey(poller, survey[1]));
    return;
  }
  if (/^#\/surveys\/?$/.test(hash)) {
    state.detail = null;
    state.surveys = null;
    show("surveys-view");
    document.title = "surveys · ldp-gatekeeper";
    startPolling(loadSurveyList);
    return;
  }
  const match = /^#\/objects\/(.+)$/.exec(hash);
  if (match) {
    const id = decodeURIComponent(match[1]);
    if (!state.detail || state.detail.id !== id) {
      state.detail = newDetail(id);
    }
    show("detail-view");
    document.title = `${id} · ldp-gatekeeper`;
    startPolling(loadDetail);
  } else {
    state.detail = null;
    const labels = labelsFromHash(hash);
    if (labels.join("\n") !== state.labels.join("\n")) {
      state.labels = labels;
      state.rows = [];
      state.total = 0;
      state.totals = null;
      state.loaded = false;
      state.after = null;
      state.before = [];
      renderList();
    }
    renderLabelFilters();
    show("list-view");
    document.title = "ldp-gatekeeper · privacy budgets";
    startPolling(loadList);
  }
}

function main() {
  $("sign-in-form").addEventListener("submit", onSignInSubmit);
  $("sign-out").addEventListener("click", () => signOut(""));
  $("objects").tHead.addEventListener("click", onHeaderClick);
  $("what-if-run").addEventListener("click", () => {
    runWhatIf();
  });
  $("label-form").addEventListener("submit", onLabelSubmit);
  let typing = null;
  $("filter").addEventListener("input", () => {
    const before = state.filter;
    state.filter = parseFilter($("filter").value);
    const prefix = (f) => (f.kind === "text" ? f.prefix : null);
    if (prefix(before) === prefix(state.filter)) {
      renderList(); // an expression: it filters the rows of this page
      return;
    }
    // an id prefix is searched by the service: once typing pauses
    clearTimeout(typing);
    typing = setTimeout(reloadList, 200);
  });
  $("include-retired").addEventListener("change", reloadList);
  $("status-filter").addEventListener("change", reloadList);
  $("page-next").addEventListener("click", nextPage);
  $("page-previous").addEventListener("click", previousPage);
  window.addEventListener("hashchange", route);
  const saved = sessionStorage.getItem(STORAGE_KEY);
  if (saved) {
    resume(saved);
  } else {
    signOut("");
  }
}

main();
