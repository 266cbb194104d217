// Population surveys (docs/surveys.md): the list with a live progress bar per survey, and one
// survey's progress, refusals by reason and estimate with its error bars. Everything shown
// comes from GET /v1/surveys and GET /v1/surveys/{id}.

import { getJson } from "./api.js";
import { element as svgElement } from "./chart.js";
import {
  TOP_VALUES,
  estimateCsv,
  histogramRows,
  renderHistogram,
  renderInterval,
  scalarRow,
} from "./estimate.js";
import { describeQuery, fmtTime, num } from "./format.js";
import { labelChip, listHash } from "./labels.js";

const PAGE = 200;
const MAX_SURVEYS = 1000;
// Each refresh of the list reads this many of the newest surveys.
const HEAD = 50;
const $ = (id) => document.getElementById(id);

// Statuses in which a survey's members are still being decided (its numbers still change).
const ACTIVE = new Set(["queued", "running"]);

export function isActive(survey) {
  return ACTIVE.has(survey.status);
}

// Why a member can be refused, in the order of progress.refused, with what it means.
export const REASONS = [
  ["budget-exhausted", "budget exhausted", "an answer could take the object's realized loss over its budget: the filter refused (nothing released, nothing spent)"],
  ["lifetime-exhausted", "lifetime exhausted", "an answer could take the loss summed over the object's data versions over its lifetime budget: refused (nothing released, nothing spent)"],
  ["quota-exhausted", "quota exhausted", "an answer could take the realized loss of the survey's project's own sub-history of the object over the project's quota: refused (nothing released, nothing spent)"],
  ["invalid-for-domain", "invalid for domain", "the query does not apply to the object's domain (e.g. an attribute it does not have)"],
  ["retired", "retired", "the object was retired when the survey reached it"],
];

export function refusedTotal(progress) {
  return REASONS.reduce((sum, [reason]) => sum + (progress.refused[reason] || 0), 0);
}

// The progress bar of a survey: accepted members, then refused ones, over all members.
export function progressBar(progress, label) {
  const refused = refusedTotal(progress);
  const total = progress.total;
  const part = (count) => (total > 0 ? (100 * count) / total : 0);
  const box = document.createElement("div");
  box.className = "progress";
  box.setAttribute("role", "progressbar");
  box.setAttribute("aria-label", label);
  box.setAttribute("aria-valuemin", "0");
  box.setAttribute("aria-valuemax", String(total));
  box.setAttribute("aria-valuenow", String(progress.decided));
  const words = `${progress.decided} of ${total} decided: ${progress.accepted} accepted, ${refused} refused`;
  box.setAttribute("aria-valuetext", words);
  box.title = words;
  box.dataset.total = String(total);
  box.dataset.decided = String(progress.decided);
  box.dataset.accepted = String(progress.accepted);
  box.dataset.refused = String(refused);
  const svg = svgElement("svg", { viewBox: "0 0 100 10", preserveAspectRatio: "none", "aria-hidden": "true" });
  svg.append(
    svgElement("rect", { class: "track", x: 0, y: 0, width: 100, height: 10 }),
    svgElement("rect", { class: "accepted", x: 0, y: 0, width: part(progress.accepted), height: 10 }),
    svgElement("rect", { class: "refused", x: part(progress.accepted), y: 0, width: part(refused), height: 10 }),
  );
  box.append(svg);
  return box;
}

function percent(progress) {
  // rounded down: 100% only once every member is decided
  return progress.total > 0 ? Math.floor((100 * progress.decided) / progress.total) : 0;
}

function progressText(progress) {
  return `${progress.decided} / ${progress.total} (${percent(progress)}%)`;
}

// Members left to decide and no worker running surveys (BROKER_URL set, no live surveys node).
const NO_WORKERS = "waiting for workers: no gatekeeper worker runs surveys";

function waitingBadge() {
  const span = document.createElement("span");
  span.className = "badge waiting-for-workers";
  span.textContent = "waiting for workers";
  span.title = `${NO_WORKERS}; the survey continues when one starts`;
  return span;
}

function badge(status) {
  const span = document.createElement("span");
  span.className = `badge status-${status}`;
  span.textContent = status;
  return span;
}

function cell(value, { numeric = false, text, node } = {}) {
  const td = document.createElement("td");
  if (node) {
    td.append(node);
  } else {
    td.textContent = text ?? num(value);
  }
  if (numeric) {
    td.className = "num";
    td.dataset.value = String(value);
    td.title = String(value);
  }
  return td;
}

// The cohort in words, with its labels as links to the objects carrying them now.
function cohortNode(cohort) {
  const span = document.createElement("span");
  if (cohort.labels) {
    const labels = Object.keys(cohort.labels).sort();
    for (const name of labels) {
      span.append(labelChip(name, cohort.labels[name]));
    }
    if (labels.length > 1) {
      const all = document.createElement("a");
      all.href = listHash(labels.map((name) => `${name}:${cohort.labels[name]}`));
      all.textContent = "(objects with all)";
      all.className = "muted";
      span.append(" ", all);
    }
  } else if (cohort.ids) {
    span.textContent = `${cohort.ids.length} listed objects`;
  }
  return span;
}

function epsilonOf(query) {
  return typeof query.epsilon === "number" ? query.epsilon : null;
}

// "grr on flu, ε = 1": the query and its declared ε (a matrix query may declare none).
function queryText(query) {
  const epsilon = epsilonOf(query);
  return epsilon === null ? describeQuery(query) : `${describeQuery(query)}, ε = ${num(epsilon)}`;
}

// A short local date and time (the full one goes in a tooltip); `seconds` to show them.
function shortTime(iso, seconds = false) {
  const date = new Date(iso);
  if (!iso || Number.isNaN(date.getTime())) {
    return fmtTime(iso);
  }
  return date.toLocaleString(undefined, { dateStyle: "short", timeStyle: seconds ? "medium" : "short" });
}

// The surveys, newest first: {items, more}. The first time (`known` null) every page is read
// (up to MAX_SURVEYS); after that, the newest `head` (new surveys appear, running ones move)
// and, of the older ones in `known`, only those still queued or running (GET /v1/surveys/{id}):
// a finished survey's numbers are final, so it is not read again.
export async function refreshSurveys(key, known, head = HEAD) {
  const first = await getJson(`v1/surveys?limit=${head}`, key);
  const items = new Map(first.items.map((s) => [s.id, s]));
  let more = false;
  if (first.next_before === null || first.next_before === undefined) {
    // the newest page holds them all
  } else if (known === null) {
    let before = first.next_before;
    while (before !== null && items.size < MAX_SURVEYS) {
      const page = await getJson(`v1/surveys?limit=${PAGE}&before=${before}`, key);
      for (const s of page.items) {
        items.set(s.id, s);
      }
      before = page.next_before ?? null;
    }
    more = before !== null;
  } else {
    for (const s of known.items) {
      if (!items.has(s.id)) {
        items.set(s.id, isActive(s) ? await getJson(`v1/surveys/${s.id}`, key) : s);
      }
    }
    more = known.more;
  }
  return { items: [...items.values()].sort((a, b) => b.id - a.id), more };
}

// The list of surveys: one row each with its live progress and refusals by reason.
export function renderSurveyList({ items, more }) {
  const body = document.createElement("tbody");
  for (const survey of items) {
    const p = survey.progress;
    const tr = document.createElement("tr");
    tr.dataset.id = String(survey.id);
    tr.dataset.status = survey.status;
    tr.dataset.waitingForWorkers = String(Boolean(survey.waiting_for_workers));
    const name = document.createElement("a");
    name.href = `#/surveys/${survey.id}`;
    name.textContent = survey.name;
    const id = document.createElement("span");
    id.className = "muted";
    id.textContent = ` #${survey.id}`;
    const created = document.createElement("div");
    created.className = "created muted";
    created.textContent = shortTime(survey.created_at);
    created.title = `created ${fmtTime(survey.created_at)}`;
    const nameCell = cell(null, { node: name });
    nameCell.append(id, " ", badge(survey.status));
    if (survey.waiting_for_workers) {
      nameCell.append(" ", waitingBadge());
    }
    nameCell.append(created);
    const progress = document.createElement("div");
    progress.className = "progress-cell";
    const text = document.createElement("span");
    text.className = "progress-text";
    text.textContent = progressText(p);
    progress.append(progressBar(p, `Progress of survey ${survey.name}`), text);
    const queryCell = cell(null, { text: queryText(survey.query) });
    queryCell.className = "query";
    tr.append(
      nameCell,
      queryCell,
      cell(null, { node: cohortNode(survey.cohort) }),
      cell(null, { node: progress }),
      cell(p.accepted, { numeric: true }),
      cell(p.reused ?? 0, { numeric: true }),
      ...REASONS.map(([reason]) => cell(p.refused[reason] || 0, { numeric: true })),
    );
    body.append(tr);
  }
  $("surveys").tBodies[0].replaceWith(body);
  $("no-surveys").hidden = items.length > 0;
  const running = items.filter(isActive).length;
  $("survey-count").textContent =
    `${items.length} ${items.length === 1 ? "survey" : "surveys"}${more ? ` (the newest ${items.length})` : ""}` +
    (running ? ` · ${running} in progress` : "");
}

function definition(list, key, label, value, { numeric = true, text } = {}) {
  const dt = document.createElement("dt");
  dt.textContent = label;
  const dd = document.createElement("dd");
  if (key) {
    dd.id = `survey-${key}`;
  }
  if (numeric) {
    dd.dataset.value = String(value);
    dd.title = String(value);
  }
  dd.textContent = text ?? num(value);
  list.append(dt, dd);
}

function renderNumbers(survey) {
  const p = survey.progress;
  const list = $("survey-numbers");
  list.replaceChildren();
  definition(list, "total", "Members", p.total);
  definition(list, "decided", "Decided", p.decided);
  definition(list, "accepted", "Accepted (answered)", p.accepted);
  definition(list, "reused", "Reused (of the accepted: a stored identical answer, nothing charged)", p.reused ?? 0);
  for (const [reason, words] of REASONS) {
    definition(list, `refused-${reason}`, `Refused: ${words}`, p.refused[reason] || 0);
  }
  definition(list, "pending", "Not decided yet", p.total - p.decided);
  definition(list, "groups", "Decision groups", survey.groups ?? 0);
  for (const [key, label] of [["created_at", "Created"], ["started_at", "Started"], ["finished_at", "Finished"]]) {
    if (survey[key]) {
      definition(list, null, label, null, { numeric: false, text: shortTime(survey[key], true) });
      list.lastChild.title = fmtTime(survey[key]);
    }
  }
}

function renderProgress(survey) {
  const p = survey.progress;
  const box = $("survey-progress");
  const text = document.createElement("p");
  text.className = "progress-text";
  text.id = "survey-progress-text";
  const state = {
    queued: "waiting to start",
    running: "running",
    done: "done",
    cancelled: "cancelled: the members not decided were never asked",
    failed: "failed: the members decided keep their answers",
  }[survey.status];
  text.textContent =
    `${progressText(p)} decided · ${state ?? survey.status}` +
    (survey.waiting_for_workers ? ` · ${NO_WORKERS}` : "");
  text.dataset.waitingForWorkers = String(Boolean(survey.waiting_for_workers));
  box.replaceChildren(progressBar(p, `Progress of survey ${survey.name}`), text);
  const body = document.createElement("tbody");
  for (const [reason, words, meaning] of REASONS) {
    const tr = document.createElement("tr");
    tr.dataset.reason = reason;
    tr.append(cell(null, { text: words }), cell(p.refused[reason] || 0, { numeric: true }), cell(null, { text: meaning }));
    tr.cells[2].className = "wrap muted";
    body.append(tr);
  }
  $("survey-refusals").tBodies[0].replaceWith(body);
}

// Why there is no estimate, in a sentence.
function noEstimateMessage(survey) {
  const reason = survey.estimate_unavailable || "no estimate";
  if (survey.progress.accepted === 0) {
    return isActive(survey)
      ? "No member has accepted the query yet: the estimate appears with the first accepted answer."
      : "No member accepted the query (see the refusals), so there is nothing to estimate.";
  }
  return `No estimate for this survey: ${reason}.`;
}

// Whose shares sum to 1 only on average (each value's share is estimated on its own).
const SHARE_NAMES = { unary_encoding: "Unary-encoding", olh: "Local-hashing", hadamard: "Hadamard-response" };

function estimateNotes(survey) {
  const notes = [];
  const p = survey.progress;
  const refused = refusedTotal(p);
  if (isActive(survey)) {
    notes.push("Provisional: the survey is still running; the estimate covers the members accepted so far.");
  }
  if (refused > 0) {
    notes.push(
      `${refused} of ${p.decided} decided members were refused: the estimate describes the ${p.accepted} accepted members, who need not be a random part of the cohort.`,
    );
  }
  const kind = survey.estimate && survey.estimate.kind;
  if (kind === "histogram") {
    notes.push(
      "Each share is unbiased and not clipped to [0, 1], so by chance it can be below 0 or above 1. " +
        (survey.query.mechanism === "grr"
          ? "The shares sum to 1. "
          : `${SHARE_NAMES[survey.query.mechanism] || "These"} shares sum to 1 only on average. `) +
        "Each interval is a 95% Wilson interval for that value alone (not simultaneous).",
    );
  } else if (kind) {
    notes.push("The estimate is unbiased and not clipped to its range; the interval is a 95% Wilson interval.");
  }
  return notes.join(" ");
}

// The range a proportion or mean is drawn on: [0, 1], or the linear query's range.
function baseRange(survey) {
  const q = survey.query;
  if (q.mechanism === "linear" && Array.isArray(q.range)) {
    return [q.range[0], q.range[1]];
  }
  return [0, 1];
}

function renderOutputs(survey) {
  const details = $("outputs");
  const outputs = survey.outputs;
  details.hidden = !outputs;
  if (!outputs) {
    return;
  }
  const body = document.createElement("tbody");
  for (const [output, count] of Object.entries(outputs)) {
    const tr = document.createElement("tr");
    tr.append(cell(null, { text: output }), cell(count, { numeric: true }));
    body.append(tr);
  }
  $("outputs-table").tBodies[0].replaceWith(body);
}

function renderEstimate(survey) {
  const estimate = survey.estimate;
  const message = $("estimate-message");
  const figure = $("estimate-figure");
  const table = $("estimate-table");
  $("estimate-notes").textContent = estimateNotes(survey);
  renderOutputs(survey);
  const csv = $("estimate-csv");
  if (csv.href) {
    URL.revokeObjectURL(csv.href);
    csv.removeAttribute("href");
  }
  csv.hidden = !estimate;
  $("estimate-top").hidden = true;
  if (!estimate) {
    $("estimate-title").textContent = "Estimate";
    message.textContent = noEstimateMessage(survey);
    message.hidden = false;
    figure.hidden = true;
    table.hidden = true;
    return;
  }
  message.hidden = true;
  $("estimate-title").textContent = `Estimate over n = ${estimate.n} accepted members`;
  const svg = $("estimate-chart");
  const head = table.tHead.rows[0];
  const body = document.createElement("tbody");
  if (estimate.kind === "histogram") {
    renderHistogram(svg, estimate);
    svg.setAttribute("aria-label", `Estimated share by value with 95% intervals, n = ${estimate.n}`);
    head.cells[0].textContent = "value";
    head.cells[1].textContent = "share";
    body.append(...histogramRows(estimate));
    const count = Object.keys(estimate.values).length;
    if (count > TOP_VALUES) {
      $("estimate-top").textContent = `the ${TOP_VALUES} largest of ${count} values (all in the table)`;
      $("estimate-top").hidden = false;
    }
  } else {
    renderInterval(svg, estimate, baseRange(survey));
    svg.setAttribute("aria-label", `Estimated ${estimate.kind} with its 95% interval, n = ${estimate.n}`);
    head.cells[0].textContent = "estimate";
    head.cells[1].textContent = estimate.kind === "proportion" ? "proportion" : "mean";
    body.append(scalarRow(estimate));
  }
  table.tBodies[0].replaceWith(body);
  csv.href = URL.createObjectURL(new Blob([estimateCsv(estimate)], { type: "text/csv" }));
  csv.download = `survey-${survey.id}-estimate.csv`;
  $("estimate-n").textContent = String(estimate.n);
  $("estimate-n").dataset.value = String(estimate.n);
  figure.hidden = false;
  table.hidden = false;
}

// Empty the survey page (before another survey is loaded into it).
export function clearSurvey(id) {
  $("survey-name").textContent = `#${id}`;
  for (const box of ["survey-status", "survey-about", "survey-numbers", "survey-progress", "estimate-notes"]) {
    $(box).replaceChildren();
  }
  $("survey-refusals").tBodies[0].replaceChildren();
  for (const part of ["survey-error", "estimate-message", "estimate-figure", "estimate-table", "outputs"]) {
    $(part).hidden = true;
  }
  $("estimate-title").textContent = "Estimate";
}

// One survey: its numbers, progress, refusals by reason and estimate.
export function renderSurvey(survey) {
  $("survey-name").textContent = `${survey.name} #${survey.id}`;
  $("survey-status").replaceChildren(
    badge(survey.status),
    ...(survey.waiting_for_workers ? [" ", waitingBadge()] : []),
  );
  const about = $("survey-about");
  about.replaceChildren(queryText(survey.query), " · cohort: ", cohortNode(survey.cohort));
  $("survey-error").hidden = !survey.error;
  $("survey-error").textContent = survey.error ? `The survey failed: ${survey.error}` : "";
  renderNumbers(survey);
  renderProgress(survey);
  renderEstimate(survey);
}
