// Calls to the gatekeeper's JSON API with the signed-in key, and polling with backoff.

// The API lives next to /dashboard/, wherever the service is mounted.
const API_BASE = new URL("../", document.baseURI);

export class ApiError extends Error {
  // status: the HTTP status, or 0 when the service could not be reached at all.
  constructor(status, detail) {
    super(detail);
    this.status = status;
    this.detail = detail;
  }
}

// Send a request with the key; answers the JSON document, throws ApiError with the
// problem+json detail on any failure (status 0 when the service could not be reached).
async function requestJson(path, key, init = {}) {
  let response;
  try {
    response = await fetch(new URL(path, API_BASE), {
      ...init,
      headers: { Authorization: `Bearer ${key}`, Accept: "application/json", ...(init.headers || {}) },
      cache: "no-store",
      credentials: "omit",
    });
  } catch (error) {
    throw new ApiError(0, "network error");
  }
  let body = null;
  try {
    body = await response.json();
  } catch (error) {
    body = null;
  }
  if (!response.ok) {
    const detail = body && typeof body.detail === "string" ? body.detail : response.statusText;
    throw new ApiError(response.status, detail || `HTTP ${response.status}`);
  }
  return body;
}

// GET a JSON document.
export function getJson(path, key) {
  return requestJson(path, key);
}

// POST a JSON body (a dry-run from the what-if panel).
export function postJson(path, key, body) {
  return requestJson(path, key, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
}

function sentence(text) {
  return /[.!?]$/.test(text) ? text : `${text}.`;
}

// A sentence for the user about what went wrong.
export function describeError(error) {
  return sentence(explain(error));
}

function explain(error) {
  if (!(error instanceof ApiError)) {
    return `Unexpected error in the page: ${error && error.message ? error.message : error}`;
  }
  switch (error.status) {
    case 0:
      return "Cannot reach the service (network error or the service is down).";
    case 401:
      return "The API key was not accepted (unknown or revoked). Sign out and sign in with a valid key.";
    case 403:
      return `This key's role may not read this: ${error.detail}`;
    case 404:
      return `Not found: ${error.detail}`;
    case 429:
      return "Too many requests for this key (rate limit).";
    default:
      if (error.status >= 500) {
        return `The service answered ${error.status}: ${error.detail}`;
      }
      return `Request failed (${error.status}): ${error.detail}`;
  }
}

// Runs `task(poller)` every `interval` seconds; after a failure it waits longer (doubling up to
// `maxInterval`), and reports through onError/onSuccess. The task may stop the poller for good
// (stop()).
export class Poller {
  constructor(task, { interval, maxInterval = 60, onError, onSuccess }) {
    this.task = task;
    this.interval = interval;
    this.maxInterval = Math.max(maxInterval, interval);
    this.onError = onError;
    this.onSuccess = onSuccess;
    this.failures = 0;
    this.timer = null;
    this.stopped = false;
  }

  // Seconds until the next run after `failures` failures in a row.
  delay() {
    return Math.min(this.maxInterval, this.interval * 2 ** this.failures);
  }

  start() {
    this.run();
  }

  async run() {
    if (this.stopped) {
      return;
    }
    try {
      await this.task(this);
      if (this.stopped) {
        return;
      }
      this.failures = 0;
      if (this.onSuccess) {
        this.onSuccess();
      }
    } catch (error) {
      if (this.stopped) {
        return;
      }
      this.failures += 1;
      if (this.onError) {
        this.onError(error, this.delay());
      }
    }
    this.timer = setTimeout(() => this.run(), this.delay() * 1000);
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
  }
}
