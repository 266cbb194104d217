"""The dashboard end to end: a real headless Chromium against the service on a socket.

The browser is driven by Playwright (``tests/service/browser.py``, Debian's Chromium). The page must
sign in with a viewer key, show each object's numbers exactly as the odometer JSON has them,
filter and sort, refresh by polling, draw the chart, show the history and the plain-language
reading, and report bad keys, revoked keys and an unreachable service — with no script error
and no Content-Security-Policy violation. A screenshot is saved under ``test-artifacts/``.
What is tested is the page and the service's answers, not the server process: the service is
served on a thread of the test process (``ThreadServer``, one uvicorn server as ``gatekeeper
serve --workers 1`` runs it).

Chromium is Debian's ``chromium`` package: without it these tests are skipped, except under
``CI=true``, where they fail.
"""

from __future__ import annotations

import itertools
import json
import math
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from app.db.migrate import upgrade
from app.engine.errors import InvalidInput
from app.services.objects import parse_label_filters
from tests.service.browser import Browser, Chromium, find_chromium
from tests.service.conftest import (
    ADMIN_KEY,
    IN_CI,
    POSTGRES_URL,
    ROOT,
    ThreadServer,
    auth,
    new_key,
    start_thread_server,
    unique_id,
)

# checked before any server starts, so that a missing browser skips (or fails) at once
pytestmark = pytest.mark.usefixtures("chromium")

ARTIFACTS = ROOT / "test-artifacts"
STATUS_SHOWN = (
    "!document.getElementById('status').hidden && document.getElementById('status').textContent"
)
DOMAIN = {
    "attributes": [
        {"name": "x", "type": "integer", "low": 0, "high": 3},
        {"name": "disease", "type": "categorical", "values": ["none", "flu", "covid"]},
    ]
}
GRR_X = {"mechanism": "grr", "attribute": "x", "epsilon": 0.1}
BINARY = {
    "mechanism": "binary_rr",
    "epsilon": 0.15,
    "predicate": {"attribute": "disease", "op": "==", "value": "flu"},
}


@pytest.fixture(scope="module")
def chromium() -> str:
    found = find_chromium()
    if found is None:
        message = "Chromium is not installed: `apt-get install chromium` (or set CHROMIUM)"
        if IN_CI:
            pytest.fail(f"CI=true requires it: {message}", pytrace=False)
        pytest.skip(message)
    return found


@pytest.fixture(scope="module")
def chromium_process(chromium: str) -> Iterator[Chromium]:
    started = Chromium(chromium)
    yield started
    started.close()


@pytest.fixture
def browser(chromium_process: Chromium) -> Iterator[Browser]:
    """A browser context of the module's Chromium, of this test's own (a fresh profile's)."""
    opened = chromium_process.browser()
    yield opened
    opened.close()


@pytest.fixture(scope="module")
def server(sqlite_url: str) -> Iterator[ThreadServer]:
    running = start_thread_server(database_url=sqlite_url, redis_url=None, bound_processes=0)
    yield running
    running.stop()


@pytest.fixture
def pg_server(postgres_url: str) -> Iterator[ThreadServer]:
    running = start_thread_server(database_url=postgres_url, redis_url=None, bound_processes=0)
    yield running
    running.stop()


@contextmanager
def database_refusing_connections(url: str) -> Iterator[None]:
    """The server's PostgreSQL database refuses connections (and drops open ones) for a while."""
    name = url.rsplit("/", 1)[1]
    admin = POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://")

    def allow(flag: bool) -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(flag).lower()}')
            if not flag:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                    (name,),
                )

    allow(False)
    try:
        yield
    finally:
        allow(True)


def js_num(value: float) -> str:
    """What the dashboard's ``num`` (format.js) prints: integers as is, else 4 significant digits.

    >>> [js_num(v) for v in (2.0, 0.5, 1.23456, 0.000123456, 12345.6)]
    ['2', '0.5', '1.235', '0.0001235', '12350']
    """
    if float(value).is_integer():
        return str(int(value))
    rounded = float(f"{value:.4g}")
    return str(int(rounded)) if rounded.is_integer() else repr(rounded)


def register(http: httpx.Client, oid: str, budget: float) -> None:
    r = http.post(
        "/v1/objects",
        headers=auth(ADMIN_KEY),
        json={
            "id": oid,
            "domain": DOMAIN,
            "value": {"x": 2, "disease": "flu"},
            "budget": {"epsilon": budget},
        },
    )
    assert r.status_code == 201, r.text


def submit(http: httpx.Client, key: str, oid: str, query: dict[str, Any]) -> None:
    r = http.post(f"/v1/objects/{oid}/queries", headers=auth(key), json={"query": query})
    assert r.status_code == 201, r.text


def sign_in(browser: Browser, key: str) -> None:
    browser.wait_for("!document.getElementById('sign-in-view').hidden")
    browser.type_into("#key", key)
    browser.click("#sign-in-form button")


def row_values(browser: Browser, oid: str) -> list[str]:
    """The exact numbers (data-value) of an object's row, in column order."""
    return list(
        browser.evaluate(
            f"[...document.querySelector('#objects tr[data-id={json.dumps(oid)}]')"
            ".querySelectorAll('td.num')].map(td => td.dataset.value)"
        )
    )


def visible_ids(browser: Browser) -> list[str]:
    return list(
        browser.evaluate(
            "[...document.querySelectorAll('#objects tbody tr')].map(r => r.dataset.id)"
        )
    )


def odometer_row(odometer: dict[str, Any]) -> list[str]:
    """What the page must show for an odometer, as JavaScript prints the numbers."""
    values = [
        odometer["budget"],
        odometer["realized_loss"]["lower"],
        odometer["realized_loss"]["upper"],
        odometer["remaining"],
        odometer["basic_composition"],
        odometer["accepted"],
        odometer["rejected"],
    ]
    # JSON numbers round-trip: the page's String(number) parses back to the same float
    return [repr(float(v)) for v in values]


def as_floats(values: list[str]) -> list[str]:
    return [repr(float(v)) for v in values]


@pytest.mark.slow
def test_dashboard_end_to_end(
    server: ThreadServer, browser: Browser, capsys: pytest.CaptureFixture[str]
) -> None:
    http = httpx.Client(base_url=server.url, timeout=30)
    analyst = new_key(http, "analyst")
    viewer = new_key(http, "viewer")
    spent, fresh = unique_id("spent"), unique_id("fresh")
    register(http, spent, 1.0)
    register(http, fresh, 3.0)
    for query in [GRR_X, BINARY, GRR_X, GRR_X, BINARY, GRR_X]:
        submit(http, analyst, spent, query)
    submit(http, analyst, fresh, GRR_X)

    browser.navigate(f"{server.url}/dashboard/?poll=1")
    sign_in(browser, viewer)
    browser.wait_for(f"!!document.querySelector('#objects tr[data-id={json.dumps(spent)}]')")
    viewer_id = http.get("/v1/whoami", headers=auth(viewer)).json()["key_id"]
    assert (
        browser.evaluate("document.getElementById('who').textContent") == f"#{viewer_id} (viewer)"
    )
    assert browser.evaluate("sessionStorage.length") == 1
    assert browser.evaluate("localStorage.length") == 0

    # the numbers are the odometer JSON's
    listed = {o["id"]: o for o in http.get("/v1/odometers", headers=auth(viewer)).json()["items"]}
    for oid in (spent, fresh):
        assert as_floats(row_values(browser, oid)) == odometer_row(listed[oid])
    # the spent object's loss is exact (randomized response): outputs that cancel out leave it
    # at exactly 0, so its remaining budget can be exactly 1.0; the fresh one's is above 2.9
    assert listed[spent]["remaining"] <= 1.0 < 2.9 <= listed[fresh]["remaining"]

    # filter: an expression hides the fresh object, text matches ids, a bad one says why
    browser.type_into("#filter", "remaining <= 1")
    browser.wait_for(f"!document.querySelector('#objects tr[data-id={json.dumps(fresh)}]')")
    assert spent in visible_ids(browser)
    browser.type_into("#filter", "remaining <= 1 and accepted >= 7")
    browser.wait_for("document.querySelectorAll('#objects tbody tr').length === 0")
    browser.type_into("#filter", "accepted = 6 and rejected <= 0")
    browser.wait_for("document.querySelectorAll('#objects tbody tr').length === 1")
    assert visible_ids(browser) == [spent]
    # text is the start of an id, searched by the service (issue 25: not the loaded rows)
    browser.type_into("#filter", fresh[:-4])
    browser.wait_for(
        "document.querySelectorAll('#objects tbody tr').length === 1 && "
        f"!!document.querySelector('#objects tr[data-id={json.dumps(fresh)}]')"
    )
    assert visible_ids(browser) == [fresh]
    browser.type_into("#filter", "remaining <")
    message = browser.wait_for(
        "!document.getElementById('filter-error').hidden && "
        "document.getElementById('filter-error').textContent"
    )
    assert "expected a number" in message
    browser.evaluate(
        "(() => { const f = document.getElementById('filter'); f.value = '';"
        " f.dispatchEvent(new Event('input')); })()"
    )
    browser.wait_for("document.querySelectorAll('#objects tbody tr').length === 2")
    assert set(visible_ids(browser)) == {spent, fresh}

    # sort: by remaining, then reversed
    browser.click("#objects th[data-key=remaining] button")
    by_remaining = sorted(listed.values(), key=lambda o: (o["remaining"], o["id"]))
    assert visible_ids(browser) == [o["id"] for o in by_remaining]
    browser.click("#objects th[data-key=remaining] button")
    assert visible_ids(browser)[0] == by_remaining[-1]["id"]
    assert (
        browser.evaluate(
            "document.querySelector('#objects th[data-key=remaining]').getAttribute('aria-sort')"
        )
        == "descending"
    )

    ARTIFACTS.mkdir(exist_ok=True)
    browser.screenshot(ARTIFACTS / "dashboard-list.png")

    # polling: a new submit shows up without reloading
    submit(http, analyst, fresh, GRR_X)
    row = f"document.querySelector('#objects tr[data-id={json.dumps(fresh)}]')"
    browser.wait_for(f"{row}.querySelectorAll('td.num')[5].dataset.value === '2'", timeout=15)

    # one object: numbers, chart, reading, history
    browser.click(f"#objects tr[data-id={json.dumps(spent)}] a")
    browser.wait_for("document.querySelectorAll('#history tbody tr').length === 6")
    odometer = http.get(f"/v1/objects/{spent}/odometer", headers=auth(viewer)).json()
    shown = browser.evaluate(
        "Object.fromEntries([...document.querySelectorAll('#detail-numbers dd[id]')]"
        ".map(d => [d.id, d.dataset.value]))"
    )
    assert as_floats(
        [
            shown[f"num-{k}"]
            for k in ("budget", "lower", "upper", "remaining", "basic", "accepted", "rejected")
        ]
    ) == odometer_row(odometer)
    path = browser.evaluate("document.querySelector('#chart path.loss-upper').getAttribute('d')")
    assert path.count("L") == 6  # the origin and one point per accepted query
    assert browser.evaluate("document.querySelector('#chart path.basic').getAttribute('d')")
    assert browser.evaluate("!!document.querySelector('#chart line.budget')")
    assert browser.evaluate("document.querySelectorAll('#chart .dots circle').length") == 6
    box = browser.evaluate(
        "(() => { const b = document.querySelector('#chart path.loss-upper').getBBox();"
        " return [b.width, b.height]; })()"
    )
    assert box[0] > 100  # drawn, not collapsed
    assert box[1] > 10

    history = http.get(f"/v1/objects/{spent}/odometer/history", headers=auth(viewer)).json()
    seqs = browser.evaluate(
        "[...document.querySelectorAll('#history tbody tr')].map(r => r.dataset.seq)"
    )
    assert seqs == [str(p["accepted"]) for p in reversed(history["points"])]
    first = browser.evaluate(
        "[...document.querySelector('#history tbody tr:last-child').querySelectorAll('td.num')]"
        ".map(td => td.dataset.value)"
    )
    point = history["points"][0]
    assert as_floats(first) == [
        repr(float(v))
        for v in (
            1,
            point["epsilon"],
            point["realized_loss"]["lower"],
            point["realized_loss"]["upper"],
            point["basic_composition"],
        )
    ]

    loss = odometer["realized_loss"]["upper"]
    reading = browser.evaluate("document.getElementById('reading').textContent")
    # one number format everywhere (format.js): 4 significant digits, no trailing zeros
    assert f"e^{js_num(loss)} = {js_num(math.exp(loss))}" in reading
    assert browser.evaluate("document.getElementById('reading-half').textContent") == (
        js_num(math.exp(loss) / (1 + math.exp(loss)))
    )
    assert browser.evaluate("document.getElementById('reading-advantage').textContent") == (
        js_num(math.tanh(loss / 4))
    )
    browser.type_into("#prior", "0.2")
    top = 0.2 * math.exp(loss) / (0.2 * math.exp(loss) + 0.8)
    low = 0.2 / (0.2 + 0.8 * math.exp(loss))
    assert (
        browser.wait_for("document.getElementById('prior-result').textContent")
        == f" → after: at most {js_num(top)}, at least {js_num(low)}"
    )

    shot = browser.screenshot(ARTIFACTS / "dashboard.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with capsys.disabled():
        print(f"\ndashboard screenshot: {shot}")

    # an analyst also sees each query (its own) and its output
    browser.click("#sign-out")
    sign_in(browser, analyst)
    browser.wait_for(
        "document.querySelectorAll('#history tbody tr').length === 6 && "
        "document.querySelector('#history thead').textContent.includes('output')"
    )
    queries = browser.evaluate(
        "[...document.querySelectorAll('#history tbody tr')].map(r => r.cells[6].textContent)"
    )
    assert queries[-1] == "grr on x"
    assert queries[-2] == 'binary_rr [disease == "flu"]'

    assert browser.problems() == []


@pytest.mark.slow
def test_bad_and_revoked_keys_and_outages_are_shown(
    pg_server: ThreadServer, postgres_url: str, browser: Browser
) -> None:
    server = pg_server
    http = httpx.Client(base_url=server.url, timeout=30)
    browser.navigate(f"{server.url}/dashboard/?poll=1")
    sign_in(browser, "gk_not-a-key")
    message = browser.wait_for(
        "!document.getElementById('sign-in-error').hidden && "
        "document.getElementById('sign-in-error').textContent"
    )
    assert "not accepted" in message
    assert browser.evaluate("sessionStorage.length") == 0

    r = http.post("/v1/keys", json={"role": "viewer"}, headers=auth(ADMIN_KEY))
    key_id, viewer = r.json()["id"], r.json()["key"]
    sign_in(browser, viewer)
    browser.wait_for("!document.getElementById('list-view').hidden")
    # the key is kept for the tab: a reload stays signed in
    browser.navigate(f"{server.url}/dashboard/?poll=1")
    browser.wait_for("!document.getElementById('list-view').hidden")

    # revoked while the page polls: the page says so and keeps polling (backing off)
    assert http.delete(f"/v1/keys/{key_id}", headers=auth(ADMIN_KEY)).status_code == 200
    status = browser.wait_for(
        STATUS_SHOWN,
        timeout=15,
    )
    assert "not accepted" in status
    assert "Retrying in 2 s" in status
    browser.wait_for(
        "document.getElementById('status').textContent.includes('Retrying in 4 s')", timeout=15
    )

    # a new key, then the service goes away
    viewer = new_key(http, "viewer")
    browser.click("#sign-out")
    sign_in(browser, viewer)
    browser.wait_for(
        "!document.getElementById('list-view').hidden && document.getElementById('status').hidden"
    )
    # the database goes away: the service answers 503, the page says so and recovers by itself
    with database_refusing_connections(postgres_url):
        status = browser.wait_for(STATUS_SHOWN, timeout=15)
        assert "The service answered 503: the database is unavailable" in status
    browser.wait_for("document.getElementById('status').hidden", timeout=30)
    server.stop()
    status = browser.wait_for(
        STATUS_SHOWN,
        timeout=15,
    )
    assert "Cannot reach the service" in status

    assert browser.problems() == []


def test_the_policy_blocks_inline_script(server: ThreadServer, browser: Browser) -> None:
    """The page's CSP is enforced by the browser (and the violation detector works)."""
    browser.navigate(f"{server.url}/dashboard/")
    browser.wait_for("!document.getElementById('sign-in-view').hidden")
    assert browser.problems() == []
    browser.evaluate(
        "(() => { const s = document.createElement('script');"
        " s.textContent = 'window.injected = 1'; document.body.append(s); })()"
    )
    assert browser.evaluate("window.injected") is None
    violations = browser.wait_for("window.__cspViolations.length && window.__cspViolations")
    assert any("script-src" in v for v in violations)


FILTER_ROWS = [
    {
        "id": "alpha",
        "budget": 1,
        "lower": 0.3,
        "upper": 0.3,
        "remaining": 0.7,
        "basic": 0.7,
        "accepted": 6,
        "rejected": 0,
    },
    {
        "id": "Beta-2",
        "budget": 3,
        "lower": 0.1,
        "upper": 0.12,
        "remaining": 2.88,
        "basic": 0.1,
        "accepted": 1,
        "rejected": 2,
    },
]


#: (filter text, kind of filter, matching ids or the error message's key words)
FILTER_CASES: list[tuple[str, str, list[str] | str]] = [
    ("", "all", ["alpha", "Beta-2"]),
    ("Beta", "text", ["Beta-2"]),  # the start of an id, exact case (the service's id_prefix)
    ("beta", "text", []),
    ("eta", "text", []),
    ("remaining<1", "expression", ["alpha"]),
    ("REMAINING < 3 AND accepted>=2", "expression", ["alpha"]),
    ("loss = 0.12", "expression", ["Beta-2"]),
    ("upper == 0.3 and lower <= 0.3", "expression", ["alpha"]),
    ("rejected > 1e-1", "expression", ["Beta-2"]),
    ("budget >= .5 and budget <= 3 and remaining > -1", "expression", ["alpha", "Beta-2"]),
    ("remaining <", "error", "expected a number after remaining <"),
    ("height < 1", "error", "expected a field"),
    ("remaining < 1 or accepted > 2", "error", 'expected "and", found "or"'),
    ("remaining < 1 and", "error", "expected a field"),
    ("< 1", "error", "expected a field"),
    ("remaining < 1;", "error", 'cannot read ";"'),
]


def test_filter_expressions(server: ThreadServer, browser: Browser) -> None:
    """The filter module itself, imported in the page, on every kind of input."""
    browser.navigate(f"{server.url}/dashboard/")
    for text, kind, expected in FILTER_CASES:
        result = browser.evaluate(
            f"import('./filter.js').then(m => {{ const f = m.parseFilter({json.dumps(text)});"
            f" return {{kind: f.kind, message: f.message || null,"
            f" ids: f.test ? {json.dumps(FILTER_ROWS)}.filter(f.test).map(r => r.id) : null}}; }})"
        )
        assert result["kind"] == kind, (text, result)
        if isinstance(expected, str):
            assert expected in result["message"], (text, result)
        else:
            assert result["ids"] == expected, (text, result)


# screenshots for docs/dashboard.md are copied from here by hand (a test run never edits docs/)
DOCS_FIGURES = ARTIFACTS


def summary_expected(http: httpx.Client, key: str) -> dict[str, str]:
    """The summary strip's numbers computed from the odometers JSON (the metrics' rules).

    Near exhaustion is the ``gatekeeper_objects_near_exhaustion`` gauge's: less than 10% of the
    budget left, the exhausted included (issue 25: the page once left them out and disagreed).
    """
    items = http.get("/v1/odometers", params={"limit": 1000}, headers=auth(key)).json()["items"]
    active = [i for i in items if i["status"] != "retired"]
    exhausted = [i for i in active if i["remaining"] < 1e-6]
    near = [i for i in active if i["remaining"] < 0.1 * i["budget"]]
    return {
        "sum-objects": str(len(items)),
        "sum-exhausted": str(len(exhausted)),
        "sum-near": str(len(near)),
        "sum-rejected": str(sum(i["rejected"] for i in items)),
    }


def test_summary_legend_empty_filter_and_one_number_format(
    server: ThreadServer, browser: Browser
) -> None:
    http = httpx.Client(base_url=server.url, timeout=30)
    analyst = new_key(http, "analyst")
    near, spent = unique_id("near"), unique_id("spent")
    register(http, near, 0.55)
    register(http, spent, 0.5)
    submit(http, analyst, near, {**GRR_X, "epsilon": 0.5})  # basic 0.5 of 0.55: under 10% left
    submit(http, analyst, spent, {**GRR_X, "epsilon": 0.5})  # nothing left
    r = http.post(f"/v1/objects/{spent}/queries", headers=auth(analyst), json={"query": GRR_X})
    assert r.status_code == 409
    browser.navigate(f"{server.url}/dashboard/?poll=1")
    sign_in(browser, analyst)
    browser.wait_for(f"!!document.querySelector('#objects tr[data-id={json.dumps(spent)}]')")
    expected = summary_expected(http, analyst)
    assert int(expected["sum-exhausted"]) >= 1
    assert int(expected["sum-near"]) >= 2
    totals = http.get("/v1/odometers/totals", headers=auth(analyst)).json()
    assert expected == {
        "sum-objects": str(totals["objects"]),
        "sum-exhausted": str(totals["exhausted"]),
        "sum-near": str(totals["near_exhaustion"]),
        "sum-rejected": str(totals["rejected"]),
    }
    browser.wait_for(
        " && ".join(
            f"document.getElementById({json.dumps(k)}).textContent === {json.dumps(v)}"
            for k, v in expected.items()
        )
    )
    # the amber rows have a legend, and both kinds are highlighted
    legend = browser.evaluate("document.getElementById('legend-near').textContent")
    assert "Amber rows" in legend
    assert "10%" in legend
    for oid in (near, spent):
        assert browser.evaluate(
            f"document.querySelector('#objects tr[data-id={json.dumps(oid)}]')"
            ".classList.contains('near-exhaustion')"
        )
    # a filter that matches nothing says so; one that matches hides the message
    browser.type_into("#filter", "budget > 9999")
    browser.wait_for("!document.getElementById('no-match').hidden")
    assert browser.evaluate("document.getElementById('no-match').textContent") == (
        "No object matches this filter."
    )
    browser.type_into("#filter", near)
    browser.wait_for("document.getElementById('no-match').hidden")
    # one number format: every numeric cell prints its exact value as format.js does
    cells = browser.evaluate(
        "[...document.querySelectorAll('#objects tbody td.num')]"
        ".map(td => [td.dataset.value, td.textContent])"
    )
    assert cells
    for exact, shown in cells:
        assert shown == js_num(float(exact)), (exact, shown)
    DOCS_FIGURES.mkdir(exist_ok=True)
    browser.type_into("#filter", "")
    browser.screenshot(DOCS_FIGURES / "dashboard-summary.png")
    assert browser.problems() == []


def test_chart_band_rejections_domain_and_what_if(server: ThreadServer, browser: Browser) -> None:
    http = httpx.Client(base_url=server.url, timeout=30)
    analyst = new_key(http, "analyst")
    viewer = new_key(http, "viewer")
    oid = unique_id("whatif")
    register(http, oid, 0.5)
    for query in (GRR_X, BINARY, GRR_X):
        submit(http, analyst, oid, query)
    rejected = 0
    for _ in range(2):
        big = {**BINARY, "epsilon": 0.4}
        r = http.post(f"/v1/objects/{oid}/queries", headers=auth(analyst), json={"query": big})
        assert r.status_code == 409, r.text
        rejected += 1
    history = http.get(f"/v1/objects/{oid}/odometer/history", headers=auth(analyst)).json()
    assert [x["after_accepted"] for x in history["rejections"]] == [3, 3]

    browser.navigate(f"{server.url}/dashboard/?poll=1#/objects/{oid}")
    sign_in(browser, analyst)
    browser.wait_for("document.querySelectorAll('#history tbody tr').length === 3")
    # the certified band and the rejections on the chart, with their legend
    band = browser.evaluate("document.querySelector('#chart polygon.band').getAttribute('points')")
    assert len(band.split()) == 2 * (len(history["points"]) + 1)
    marks = browser.evaluate(
        "[...document.querySelectorAll('#chart path.rejection')].map(p => p.dataset.after)"
    )
    assert marks == ["3"]
    legend = browser.evaluate("document.getElementById('chart-legend').textContent")
    assert "certified band" in legend
    assert f"rejected queries ({rejected})" in legend
    # the domain, in words
    items = browser.wait_for(
        "[...document.querySelectorAll('#domain-list li')].map(li => li.textContent)"
    )
    assert items == [
        "x: integer from 0 to 3",
        'disease: categorical, one of "none", "flu", "covid"',
    ]
    # what if: a dry-run from the page shows the loss after each output
    assert browser.evaluate("document.getElementById('what-if').hidden") is False
    query = {"mechanism": "grr", "attribute": "disease", "epsilon": 0.05}
    browser.type_into("#what-if-query", json.dumps(query))
    browser.click("#what-if-run")
    browser.wait_for("!document.getElementById('what-if-result').hidden")
    dry = http.post(
        f"/v1/objects/{oid}/dry-run", headers=auth(analyst), json={"query": query}
    ).json()
    rows = browser.evaluate(
        "[...document.querySelectorAll('#what-if-result tbody tr')]"
        ".map(tr => [...tr.cells].map(td => td.textContent))"
    )
    assert rows == [
        [
            json.dumps(o["output"]),
            js_num(o["lower"]),
            js_num(o["upper"]),
            "yes" if o["upper"] <= dry["budget"] else "no",
        ]
        for o in dry["per_output"]
    ]
    decision = browser.evaluate("document.getElementById('what-if-decision').textContent")
    assert decision.startswith(
        "Would be accepted" if dry["decision"] == "accept" else "Would be rejected"
    )
    # a bad query is explained, not thrown
    browser.type_into("#what-if-query", "{not json")
    browser.click("#what-if-run")
    browser.wait_for("!document.getElementById('what-if-error').hidden")
    browser.type_into("#what-if-query", json.dumps({**query, "attribute": "nope"}))
    browser.click("#what-if-run")
    message = browser.wait_for(
        "!document.getElementById('what-if-error').hidden"
        " && document.getElementById('what-if-error').textContent.includes('attribute')"
        " && document.getElementById('what-if-error').textContent"
    )
    assert "nope" not in message or "attribute" in message
    browser.type_into("#what-if-query", json.dumps(query))
    browser.click("#what-if-run")
    browser.wait_for("!document.getElementById('what-if-result').hidden")
    DOCS_FIGURES.mkdir(exist_ok=True)
    browser.screenshot(DOCS_FIGURES / "dashboard-object.png")
    assert browser.problems() == []

    # a viewer gets no what-if panel (it may not dry-run) and a note instead of the domain
    browser.click("#sign-out")
    browser.navigate(f"{server.url}/dashboard/?poll=1#/objects/{oid}")
    sign_in(browser, viewer)
    note = browser.wait_for(
        "document.querySelector('#domain-list li')?.textContent.startsWith('An analyst')"
        " && document.querySelector('#domain-list li').textContent"
    )
    assert note == "An analyst or admin key shows the object's domain."
    assert browser.evaluate("document.getElementById('what-if').hidden") is True
    assert browser.problems() == []


# --- labels and population surveys -------------------------------------------------------------

SURVEY_DOMAIN = {
    "attributes": [{"name": "flu", "type": "categorical", "values": ["no", "yes", "unsure"]}]
}
SURVEY_GRR = {"mechanism": "grr", "attribute": "flu", "epsilon": 2.0}


def final_survey(survey_id: int) -> str:
    """Shown when the page shows survey ``survey_id`` as finished (and has stopped polling)."""
    return (
        f"document.getElementById('survey-name').textContent.endsWith(' #{survey_id}')"
        " && document.getElementById('updated').textContent.includes('no longer refreshing')"
    )


@pytest.fixture(scope="module")
def survey_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadServer]:
    """A server and database of their own: labelled objects stay out of the other tests' lists."""
    url = f"sqlite:///{tmp_path_factory.mktemp('surveys-db') / 'gatekeeper.db'}"
    upgrade(url)
    running = start_thread_server(database_url=url, redis_url=None, bound_processes=0)
    yield running
    running.stop()


def import_labelled(
    http: httpx.Client, study: str, n: int, *, budget: float = 5.0, start: int = 0
) -> list[str]:
    """Register ``n`` objects labelled ``study`` (sites a and b alternating) in one import."""
    flu = ["no", "yes", "unsure", "no"]
    items = [
        {
            "id": f"{study}-{i:03d}",
            "domain": SURVEY_DOMAIN,
            "value": {"flu": flu[i % 4]},
            "budget": {"epsilon": budget},
            "labels": {"study": study, "site": "ab"[i % 2]},
        }
        for i in range(start, start + n)
    ]
    r = http.post("/v1/imports", headers=auth(ADMIN_KEY), json={"objects": items})
    assert r.status_code == 200, r.text
    return [item["id"] for item in items]


def create_survey(
    http: httpx.Client, key: str, name: str, query: dict[str, Any], study: str
) -> int:
    body = {"name": name, "query": query, "cohort": {"labels": {"study": study}}}
    r = http.post("/v1/surveys", headers=auth(key), json=body)
    assert r.status_code == 202, r.text
    return int(r.json()["id"])


def finished_survey(http: httpx.Client, key: str, survey_id: int) -> dict[str, Any]:
    """The survey's JSON once it is no longer queued or running."""
    for _ in range(200):
        survey: dict[str, Any] = http.get(f"/v1/surveys/{survey_id}", headers=auth(key)).json()
        if survey["status"] not in ("queued", "running"):
            return survey
        time.sleep(0.05)
    raise AssertionError(f"survey {survey_id} did not finish: {survey}")


def exact(values: list[Any]) -> list[str]:
    """Numbers as the page's data-value attributes must hold them (String(number) round-trips)."""
    return [repr(float(v)) for v in values]


def progress_of(browser: Browser, selector: str) -> dict[str, Any]:
    """The progress bar's numbers and the widths of its accepted and refused parts."""
    return dict(
        browser.evaluate(
            f"(() => {{ const p = document.querySelector({json.dumps(selector)});"
            " return {...p.dataset, now: p.getAttribute('aria-valuenow'),"
            " max: p.getAttribute('aria-valuemax'),"
            " accepted_width: Number(p.querySelector('rect.accepted').getAttribute('width')),"
            " refused_width: Number(p.querySelector('rect.refused').getAttribute('width'))}; })()"
        )
    )


def check_progress(shown: dict[str, Any], progress: dict[str, Any]) -> None:
    refused = sum(progress["refused"].values())
    assert (shown["total"], shown["decided"], shown["now"], shown["max"]) == (
        str(progress["total"]),
        str(progress["decided"]),
        str(progress["decided"]),
        str(progress["total"]),
    )
    assert (shown["accepted"], shown["refused"]) == (str(progress["accepted"]), str(refused))
    assert shown["accepted_width"] == pytest.approx(100 * progress["accepted"] / progress["total"])
    assert shown["refused_width"] == pytest.approx(100 * refused / progress["total"])


@pytest.mark.slow
def test_surveys_progress_refusals_and_estimates_equal_the_json(
    survey_server: ThreadServer, browser: Browser
) -> None:
    server = survey_server
    http = httpx.Client(base_url=server.url, timeout=30)
    analyst = new_key(http, "analyst")
    viewer = new_key(http, "viewer")
    study = unique_id("flu")
    import_labelled(http, study, 60)
    import_labelled(http, study, 4, budget=0.5, start=60)  # too small for ε = 2: refused
    browser.navigate(f"{server.url}/dashboard/?poll=1#/surveys")
    sign_in(browser, viewer)
    browser.wait_for(
        "!document.getElementById('surveys-view').hidden"
        " && document.getElementById('updated').textContent.startsWith('Updated')"
    )
    # created while the list is open: it shows up by polling, and its bar reaches the end
    grr = create_survey(http, analyst, "flu share", SURVEY_GRR, study)
    row = f"document.querySelector('#surveys tr[data-id=\"{grr}\"]')"
    browser.wait_for(f"{row} && {row}.dataset.status === 'done'")
    survey = finished_survey(http, viewer, grr)
    progress = survey["progress"]
    assert progress == {
        "total": 64,
        "decided": 64,
        "accepted": 60,
        "reused": 0,
        "refused": {
            "budget-exhausted": 4,
            "lifetime-exhausted": 0,
            "quota-exhausted": 0,
            "invalid-for-domain": 0,
            "retired": 0,
        },
    }
    # the list: the progress bar and the refusals by reason are the JSON's
    check_progress(progress_of(browser, f"#surveys tr[data-id='{grr}'] .progress"), progress)
    cells = browser.evaluate(f"[...{row}.querySelectorAll('td.num')].map(td => td.dataset.value)")
    assert cells == ["60", "0", "4", "0", "0", "0", "0"]  # accepted, reused, refused by reason
    assert browser.evaluate(f"{row}.cells[1].textContent") == "grr on flu, ε = 2"
    assert browser.evaluate(f"{row}.querySelector('.progress-text').textContent") == (
        "64 / 64 (100%)"
    )

    # one survey: its numbers, progress, refusals and the histogram with its whiskers
    browser.click(f"#surveys tr[data-id='{grr}'] a")
    browser.wait_for(final_survey(grr))
    numbers = browser.evaluate(
        "Object.fromEntries([...document.querySelectorAll('#survey-numbers dd[id]')]"
        ".map(d => [d.id, d.dataset.value]))"
    )
    assert numbers == {
        "survey-total": "64",
        "survey-decided": "64",
        "survey-accepted": "60",
        "survey-reused": "0",
        "survey-refused-budget-exhausted": "4",
        "survey-refused-lifetime-exhausted": "0",
        "survey-refused-quota-exhausted": "0",
        "survey-refused-invalid-for-domain": "0",
        "survey-refused-retired": "0",
        "survey-pending": "0",
        "survey-groups": str(survey["groups"]),
    }
    check_progress(progress_of(browser, "#survey-progress .progress"), progress)
    refusals = browser.evaluate(
        "[...document.querySelectorAll('#survey-refusals tbody tr')]"
        ".map(tr => [tr.dataset.reason, tr.cells[1].dataset.value])"
    )
    assert refusals == [
        ["budget-exhausted", "4"],
        ["lifetime-exhausted", "0"],
        ["quota-exhausted", "0"],
        ["invalid-for-domain", "0"],
        ["retired", "0"],
    ]
    estimate = survey["estimate"]
    assert estimate["kind"] == "histogram"
    assert estimate["n"] == 60
    rows = browser.evaluate(
        "[...document.querySelectorAll('#estimate-table tbody tr')]"
        ".map(tr => [tr.dataset.key, ...[...tr.querySelectorAll('td.num')]"
        ".map(td => td.dataset.value)])"
    )
    assert [r[0] for r in rows] == ["no", "yes", "unsure"]
    for key, *shown in rows:
        assert exact(shown) == exact(
            [estimate["values"][key], estimate["stderr"][key], *estimate["ci95"][key]]
        )
    assert browser.evaluate("document.getElementById('estimate-n').textContent") == "60"
    # a bar and a whisker per value; the whisker spans the interval, the bar the share
    drawn = browser.evaluate(
        "[...document.querySelectorAll('#estimate-chart path.whisker')]"
        ".map(p => [p.dataset.key, p.querySelector('title').textContent])"
    )
    assert [d[0] for d in drawn] == ["no", "yes", "unsure"]
    for key, title in drawn:
        low, high = estimate["ci95"][key]
        assert f"share {js_num(estimate['values'][key])}" in title
        assert f"95% interval [{js_num(low)}, {js_num(high)}]" in title
    spans = browser.evaluate(
        "[...document.querySelectorAll('#estimate-chart path.whisker')].map(p => {"
        " const b = p.getBBox(); return [b.y, b.y + b.height]; })"
    )
    bars = browser.evaluate(
        "[...document.querySelectorAll('#estimate-chart rect.bar')].map(r => {"
        " const b = r.getBBox(); return [b.y, b.y + b.height]; })"
    )
    zero = float(
        browser.evaluate("document.querySelector('#estimate-chart line.zero').getAttribute('y1')")
    )
    keys = ["no", "yes", "unsure"]
    # pixels per unit of share, from the first whisker; the rest must agree with it
    scale = (spans[0][1] - spans[0][0]) / (estimate["ci95"]["no"][1] - estimate["ci95"]["no"][0])
    for key, (top, bottom), (bar_top, bar_bottom) in zip(keys, spans, bars, strict=True):
        low, high = estimate["ci95"][key]
        assert bottom - top == pytest.approx((high - low) * scale, rel=1e-3)
        assert zero - top == pytest.approx(high * scale, abs=0.5)
        share = estimate["values"][key]
        assert (bar_bottom - bar_top) == pytest.approx(max(abs(share) * scale, 0.5), abs=0.5)
    notes = browser.evaluate("document.getElementById('estimate-notes').textContent")
    assert "4 of 64 decided members were refused" in notes
    assert "The shares sum to 1" in notes
    # a finished survey's page no longer polls
    calls = (
        "performance.getEntriesByType('resource')"
        f".filter(e => e.name.endsWith('/v1/surveys/{grr}')).length"
    )
    before = browser.evaluate(calls)
    time.sleep(1.5)
    assert browser.evaluate(calls) == before
    ARTIFACTS.mkdir(exist_ok=True)
    browser.screenshot(DOCS_FIGURES / "dashboard-survey.png")

    # a proportion: one point with its interval
    binary = {
        "mechanism": "binary_rr",
        "epsilon": 1.0,
        "predicate": {"attribute": "flu", "op": "==", "value": "yes"},
    }
    share = create_survey(http, analyst, "share with flu", binary, study)
    proportion = finished_survey(http, viewer, share)["estimate"]
    browser.navigate(f"{server.url}/dashboard/?poll=1#/surveys/{share}")
    browser.wait_for(final_survey(share))
    scalar = browser.evaluate(
        "['est-value', 'est-stderr', 'est-low', 'est-high']"
        ".map(id => document.getElementById(id).dataset.value)"
    )
    assert exact(scalar) == exact([proportion["value"], proportion["stderr"], *proportion["ci95"]])
    assert proportion["kind"] == "proportion"
    assert browser.evaluate("document.querySelectorAll('#estimate-chart circle.point').length") == 1

    # no estimate: a matrix query says why; a survey nobody accepted says so
    matrix = {"mechanism": "matrix", "outputs": [0, 1], "probabilities": [[0.6, 0.4]] * 3}
    no_estimator = create_survey(http, analyst, "matrix", matrix, study)
    assert finished_survey(http, viewer, no_estimator)["estimate_unavailable"] == (
        "no generic estimator for a matrix mechanism"
    )
    browser.navigate(f"{server.url}/dashboard/?poll=1#/surveys/{no_estimator}")
    browser.wait_for(final_survey(no_estimator))
    assert browser.evaluate("document.getElementById('estimate-message').textContent") == (
        "No estimate for this survey: no generic estimator for a matrix mechanism."
    )
    assert browser.evaluate("document.getElementById('estimate-figure').hidden") is True
    assert browser.evaluate("document.getElementById('estimate-table').hidden") is True
    nobody = create_survey(http, analyst, "too costly", {**SURVEY_GRR, "epsilon": 40.0}, study)
    refused = finished_survey(http, viewer, nobody)
    assert refused["progress"]["accepted"] == 0
    assert refused["estimate"] is None
    browser.navigate(f"{server.url}/dashboard/?poll=1#/surveys/{nobody}")
    browser.wait_for(final_survey(nobody))
    assert browser.evaluate("document.getElementById('estimate-message').textContent") == (
        "No member accepted the query (see the refusals), so there is nothing to estimate."
    )

    # the list with all of them, for docs/dashboard.md
    browser.navigate(f"{server.url}/dashboard/?poll=1#/surveys")
    browser.wait_for(f"!!document.querySelector('#surveys tr[data-id=\"{nobody}\"]')")
    listed = browser.evaluate(
        "[...document.querySelectorAll('#surveys tbody tr')].map(tr => tr.dataset.id)"
    )
    assert listed[:4] == [str(i) for i in (nobody, no_estimator, share, grr)]  # newest first
    browser.screenshot(DOCS_FIGURES / "dashboard-surveys.png")
    # a refresh of the list reads the newest surveys, and of the older ones only those that
    # were still running (here 2 newest: the two older ones, one of them seen as running)
    read = browser.evaluate(
        "import('./surveys.js').then(async m => {"
        " const key = sessionStorage.getItem('gatekeeper.apiKey');"
        " const first = await m.refreshSurveys(key, null, 2);"
        " performance.clearResourceTimings();"
        f" const seen = first.items.map(s => s.id === {share} ? {{...s, status: 'running'}} : s);"
        " const again = await m.refreshSurveys(key, {items: seen, more: false}, 2);"
        " const mine = performance.getEntriesByType('resource').map(e => new URL(e.name))"
        ".filter(u => u.search === '?limit=2' || /surveys[/][0-9]+$/.test(u.pathname));"
        " return {first: first.items.map(s => [s.id, s.status]),"
        " again: again.items.map(s => [s.id, s.status]),"
        " urls: mine.map(u => u.pathname + u.search)}; })"
    )
    everything = [[i, "done"] for i in (nobody, no_estimator, share, grr)]
    assert read["first"] == everything
    assert read["again"] == everything
    assert read["urls"] == ["/v1/surveys?limit=2", f"/v1/surveys/{share}"]
    assert browser.problems() == []


@pytest.mark.slow
def test_a_survey_waiting_for_workers_says_so_in_the_list_and_on_its_page(
    tmp_path: Path, redis_url: str, browser: Browser
) -> None:
    """BROKER_URL set and no ``gatekeeper worker``: the survey's ``waiting_for_workers`` shows
    as a badge in the list and a sentence on its page, instead of a silent "queued"."""
    import redis

    namespace = "t" + secrets.token_hex(4)
    url = f"sqlite:///{tmp_path / 'gatekeeper.db'}"
    upgrade(url)
    server = start_thread_server(
        database_url=url,
        redis_url=redis_url,
        bound_processes=0,
        broker_url=redis_url,
        broker_namespace=namespace,
    )
    try:
        http = httpx.Client(base_url=server.url, timeout=30)
        analyst = new_key(http, "analyst")
        viewer = new_key(http, "viewer")
        study = unique_id("wait")
        import_labelled(http, study, 6)
        survey_id = create_survey(http, analyst, "no workers", SURVEY_GRR, study)
        survey = http.get(f"/v1/surveys/{survey_id}", headers=auth(viewer)).json()
        assert (survey["status"], survey["waiting_for_workers"]) == ("queued", True)
        browser.navigate(f"{server.url}/dashboard/?poll=1#/surveys")
        sign_in(browser, viewer)
        row = f"document.querySelector('#surveys tr[data-id=\"{survey_id}\"]')"
        browser.wait_for(f"{row} && {row}.dataset.waitingForWorkers === 'true'")
        badge = browser.evaluate(f"{row}.querySelector('.badge.waiting-for-workers').textContent")
        assert badge == "waiting for workers"
        browser.click(f"#surveys tr[data-id='{survey_id}'] a")
        text = "document.getElementById('survey-progress-text')"
        browser.wait_for(f"{text} && {text}.dataset.waitingForWorkers === 'true'")
        assert "waiting for workers" in browser.evaluate(f"{text}.textContent")
        assert browser.evaluate(
            "document.querySelector('#survey-status .badge.waiting-for-workers') !== null"
        )
        assert browser.problems() == []
    finally:
        server.stop()
        client = redis.Redis.from_url(redis_url)
        for key in client.scan_iter(match=f"*{namespace}*"):
            client.delete(key)
        client.close()


def test_a_running_survey_is_drawn_as_provisional(server: ThreadServer, browser: Browser) -> None:
    """The survey module on surveys still running: a partial bar, a provisional estimate."""
    browser.navigate(f"{server.url}/dashboard/")
    running = {
        "id": 7,
        "name": "halfway",
        "status": "running",
        "query": SURVEY_GRR,
        "cohort": {"ids": ["a", "b"]},
        "progress": {
            "total": 40,
            "decided": 10,
            "accepted": 0,
            "refused": {"budget-exhausted": 3, "invalid-for-domain": 1, "retired": 0},
        },
        "groups": 2,
        "estimate": None,
        "estimate_unavailable": "no accepted members",
    }
    shown = browser.evaluate(
        "import('./surveys.js').then(m => {"
        f" const s = {json.dumps(running)}; m.renderSurvey(s);"
        " const p = document.querySelector('#survey-progress .progress');"
        " return {active: m.isActive(s),"
        " text: document.getElementById('survey-progress-text').textContent,"
        " message: document.getElementById('estimate-message').textContent,"
        " notes: document.getElementById('estimate-notes').textContent,"
        " label: p.getAttribute('aria-valuetext'),"
        " widths: [...p.querySelectorAll('rect')].map(r => Number(r.getAttribute('width')))}; })"
    )
    assert shown["active"] is True
    assert shown["text"] == "10 / 40 (25%) decided · running"
    assert shown["label"] == "10 of 40 decided: 0 accepted, 4 refused"
    assert shown["widths"] == [100, 0, 10]
    assert shown["message"] == (
        "No member has accepted the query yet: the estimate appears with the first accepted answer."
    )
    assert "Provisional" in shown["notes"]

    # accepted members already: a provisional unary-encoding histogram, one share below 0
    unary = {
        **running,
        "query": {"mechanism": "unary_encoding", "attribute": "flu", "epsilon": 1.0},
        "progress": {**running["progress"], "accepted": 6},
        "estimate": {
            "kind": "histogram",
            "n": 6,
            "values": {"no": 0.75, "yes": -0.125, "unsure": 0.5},
            "stderr": {"no": 0.3, "yes": 0.25, "unsure": 0.31},
            "ci95": {"no": [0.2, 1.1], "yes": [-0.5, 0.4], "unsure": [-0.1, 0.9]},
        },
        "outputs": {'"no"': 5, '"yes"': 1, '"unsure"': 3},
    }
    del unary["estimate_unavailable"]
    drawn = browser.evaluate(
        "import('./surveys.js').then(m => {"
        f" m.renderSurvey({json.dumps(unary)});"
        " const zero = Number(document.querySelector('#estimate-chart line.zero')"
        ".getAttribute('y1'));"
        " return {title: document.getElementById('estimate-title').textContent,"
        " message: document.getElementById('estimate-message').hidden,"
        " notes: document.getElementById('estimate-notes').textContent,"
        " bars: [...document.querySelectorAll('#estimate-chart rect.bar')].map(r =>"
        " [r.dataset.key, r.classList.contains('negative'), Number(r.getAttribute('y')) >= zero]),"
        " outputs: [...document.querySelectorAll('#outputs-table tbody tr')]"
        ".map(tr => [tr.cells[0].textContent, tr.cells[1].dataset.value])}; })"
    )
    assert drawn["title"] == "Estimate over n = 6 accepted members"
    assert drawn["message"] is True
    # a negative share is drawn down from 0, the others up to it
    assert drawn["bars"] == [["no", False, False], ["yes", True, True], ["unsure", False, False]]
    assert "Provisional" in drawn["notes"]
    assert "Unary-encoding shares sum to 1 only on average" in drawn["notes"]
    assert drawn["outputs"] == [['"no"', "5"], ['"yes"', "1"], ['"unsure"', "3"]]

    # a mean of a linear query: one point with its interval, on the query's range
    linear = {
        **running,
        "query": {"mechanism": "linear", "weights": {"x": 1}, "range": [10, 20], "epsilon": 1},
        "progress": {**running["progress"], "accepted": 6},
        "estimate": {"kind": "mean", "n": 6, "value": 14.5, "stderr": 1.2, "ci95": [12, 21.5]},
    }
    del linear["estimate_unavailable"]
    mean = browser.evaluate(
        "import('./surveys.js').then(m => {"
        f" m.renderSurvey({json.dumps(linear)});"
        " const svg = document.getElementById('estimate-chart');"
        " const x = (t) => Number(t.getAttribute('x'));"
        " const ticks = [...svg.querySelectorAll('.tick.x')];"
        " const at = (v) => x(ticks.find(t => t.textContent === String(v)));"
        " const point = Number(svg.querySelector('circle.point').getAttribute('cx'));"
        " return {ticks: ticks.map(t => t.textContent),"
        " where: (point - at(10)) / (at(20) - at(10)),"
        " numbers: ['est-value', 'est-stderr', 'est-low', 'est-high']"
        ".map(id => document.getElementById(id).dataset.value)}; })"
    )
    # the line runs from the range's low end to past the interval's high end
    assert mean["ticks"][0] == "10"
    assert float(mean["ticks"][-1]) >= 21.5
    assert mean["where"] == pytest.approx(0.45)
    assert mean["numbers"] == ["14.5", "1.2", "12", "21.5"]

    # over without every member decided: cancelled, or failed with its error
    ended = {**running, "status": "cancelled"}
    failed = {**running, "status": "failed", "error": "the worker stopped"}
    said = browser.evaluate(
        "import('./surveys.js').then(m => [...["
        f"{json.dumps(ended)}, {json.dumps(failed)}].map(s => {{ m.renderSurvey(s);"
        " return [m.isActive(s), document.getElementById('survey-progress-text').textContent,"
        " document.getElementById('survey-error').hidden ? null :"
        " document.getElementById('survey-error').textContent,"
        " document.getElementById('estimate-message').textContent]; })])"
    )
    nobody = "No member accepted the query (see the refusals), so there is nothing to estimate."
    assert said == [
        [
            False,
            "10 / 40 (25%) decided · cancelled: the members not decided were never asked",
            None,
            nobody,
        ],
        [
            False,
            "10 / 40 (25%) decided · failed: the members decided keep their answers",
            "The survey failed: the worker stopped",
            nobody,
        ],
    ]
    assert browser.problems() == []


def test_labels_filter_the_list_and_show_on_the_object(
    survey_server: ThreadServer, browser: Browser
) -> None:
    server = survey_server
    http = httpx.Client(base_url=server.url, timeout=30)
    analyst = new_key(http, "analyst")
    study = unique_id("lab")
    ids = import_labelled(http, study, 6)
    other = unique_id("other")
    register(http, other, 1.0)

    def listed(*labels: str) -> list[str]:
        r = http.get("/v1/odometers", params={"label": list(labels)}, headers=auth(analyst))
        return sorted(o["id"] for o in r.json()["items"])

    browser.navigate(f"{server.url}/dashboard/?poll=1")
    sign_in(browser, analyst)
    browser.wait_for(f"!!document.querySelector('#objects tr[data-id={json.dumps(other)}]')")
    # a row shows its labels
    chips = browser.evaluate(
        f"[...document.querySelectorAll('#objects tr[data-id=\"{ids[1]}\"] .chip')]"
        ".map(c => c.textContent)"
    )
    assert chips == ["site: b", f"study: {study}"]
    # typed: only the objects carrying the label are loaded, as GET /v1/odometers?label= says
    browser.type_into("#label-filter", f"study:{study}")
    browser.click("#label-form button")
    browser.wait_for(f"document.querySelectorAll('#objects tbody tr').length === {len(ids)}")
    assert sorted(visible_ids(browser)) == listed(f"study:{study}") == sorted(ids)
    assert "label=study%3A" in browser.evaluate("window.location.hash")
    # clicked: a label in a row adds a second condition (all must hold)
    browser.click(f"#objects tr[data-id='{ids[0]}'] button.chip[data-label='site:a']")
    browser.wait_for("document.querySelectorAll('#label-chips .chip').length === 2")
    browser.wait_for(f"document.querySelectorAll('#objects tbody tr').length === {len(ids) // 2}")
    assert sorted(visible_ids(browser)) == listed(f"study:{study}", "site:a")
    browser.screenshot(DOCS_FIGURES / "dashboard-labels.png")
    assert browser.evaluate("document.getElementById('count').textContent").startswith(
        f"{len(ids) // 2} of {len(ids) // 2} objects with these labels"
    )
    # the filter is in the address: a reload keeps it
    browser.navigate(browser.evaluate("window.location.href"))
    browser.wait_for(f"document.querySelectorAll('#objects tbody tr').length === {len(ids) // 2}")
    # removed again
    browser.click("#label-chips .chip[data-label='site:a'] button.remove")
    browser.wait_for(f"document.querySelectorAll('#objects tbody tr').length === {len(ids)}")
    # a label filter that cannot be read says why and changes nothing
    browser.type_into("#label-filter", "no colon here")
    browser.click("#label-form button")
    message = browser.wait_for(
        "!document.getElementById('label-error').hidden"
        " && document.getElementById('label-error').textContent"
    )
    assert "name:value" in message
    assert len(visible_ids(browser)) == len(ids)
    # one object: its labels, linking to the list of objects carrying each
    browser.click(f"#objects tr[data-id='{ids[0]}'] a")
    labels = browser.wait_for(
        "document.querySelectorAll('#detail-labels a.chip').length === 2 &&"
        " [...document.querySelectorAll('#detail-labels a.chip')]"
        ".map(a => [a.textContent, a.getAttribute('href')])"
    )
    assert labels == [
        ["site: a", "#/?label=site%3Aa"],
        [f"study: {study}", f"#/?label=study%3A{study}"],
    ]
    assert browser.problems() == []


#: label filters the page must accept or refuse exactly as the service does
LABEL_CASES = [
    "study:flu-2026",
    "site:a:b",  # the value may hold colons
    "n.a_b-c:with spaces ",
    "9lives:x",
    "n" * 64 + ":x",
    "n" * 65 + ":x",
    "n:" + "v" * 256,
    "n:" + "v" * 257,
    "n:" + "😀" * 256,  # counted in code points, as Python does
    "n:é",
    "é:x",
    "-n:x",
    "bad name:x",
    ":x",
    "x:",
    "no colon",
    "n:tab\there",
    "n:del\x7f",
]


def test_the_page_reads_label_filters_as_the_service_does(
    server: ThreadServer, browser: Browser
) -> None:
    browser.navigate(f"{server.url}/dashboard/")
    page = browser.evaluate(
        "import('./labels.js').then(m =>"
        f" {json.dumps(LABEL_CASES)}.map(t => {{ const l = m.parseLabel(t);"
        " return l.error ? null : [l.name, l.value]; }))"
    )
    service = []
    for text in LABEL_CASES:
        try:
            service.append(list(parse_label_filters([text])[0]))
        except InvalidInput:
            service.append(None)
    assert page == service
    assert service.count(None) == 10  # the cases cover both verdicts


def test_a_histogram_over_many_values_draws_the_largest_and_lists_all(
    server: ThreadServer, browser: Browser
) -> None:
    """An ``olh`` estimate over 1,000 values: 40 bars with whiskers (the largest shares, largest
    first), a table of all 1,000 values, and a CSV with every value at full precision."""
    browser.navigate(f"{server.url}/dashboard/")
    k = 1000
    shares = {str(v): round(0.5 / (v + 1) - 0.0004 * (v % 7), 9) for v in range(k)}
    survey = {
        "id": 11,
        "name": "apps",
        "status": "completed",
        "query": {"mechanism": "olh", "attribute": "app", "epsilon": 1.0, "g": 4},
        "cohort": {"labels": {"panel": "a"}},
        "progress": {"total": 5000, "decided": 5000, "accepted": 5000,
                     "refused": {"budget-exhausted": 0}},
        "groups": 1,
        "estimate": {
            "kind": "histogram",
            "n": 5000,
            "values": shares,
            "stderr": dict.fromkeys(shares, 0.01),
            "ci95": {key: [value - 0.02, value + 0.02] for key, value in shares.items()},
        },
    }  # fmt: skip
    drawn = browser.evaluate(
        "Promise.all([import('./surveys.js'), import('./estimate.js')]).then(([m, e]) => {"
        f" const s = {json.dumps(survey)}; m.renderSurvey(s);"
        " const link = document.getElementById('estimate-csv');"
        " const csv = e.estimateCsv(s.estimate);"
        " const blob = link.href.startsWith('blob:');"
        " return {bars: [...document.querySelectorAll('#estimate-chart rect.bar')]"
        "   .map(r => r.dataset.key),"
        " whiskers: document.querySelectorAll('#estimate-chart path.whisker').length,"
        " rows: document.querySelectorAll('#estimate-table tbody tr').length,"
        " top: document.getElementById('estimate-top').textContent,"
        " topHidden: document.getElementById('estimate-top').hidden,"
        " linkHidden: link.hidden, file: link.download, csv: csv, blob: blob,"
        " notes: document.getElementById('estimate-notes').textContent}; })"
    )
    expected = sorted(shares, key=lambda key: -shares[key])[:40]
    assert drawn["bars"] == expected
    assert drawn["whiskers"] == 40
    assert drawn["rows"] == k
    assert drawn["topHidden"] is False
    assert drawn["top"] == "the 40 largest of 1000 values (all in the table)"
    assert drawn["linkHidden"] is False
    assert drawn["file"] == "survey-11-estimate.csv"
    assert drawn["blob"] is True  # the link downloads estimateCsv's text (the page's CSP forbids
    # fetching it back, so the text is checked from the function the link is built with)
    lines = drawn["csv"].split("\r\n")
    assert lines[0] == "value,estimate,stderr,ci95_low,ci95_high"
    assert len(lines) == k + 2  # header, k rows, the final line break
    assert lines[1].split(",")[:2] == ["0", repr(shares["0"])]
    assert "Local-hashing shares sum to 1 only on average" in drawn["notes"]


# --- data versions (issue 24) -------------------------------------------------------------------


def test_an_objects_versions_are_stacked_against_its_lifetime_budget(
    server: ThreadServer, browser: Browser
) -> None:
    http = httpx.Client(base_url=server.url, timeout=30)
    viewer = new_key(http, "viewer")
    analyst = new_key(http, "analyst")
    oid = unique_id("versions")
    r = http.post(
        "/v1/objects",
        headers=auth(ADMIN_KEY),
        json={
            "id": oid,
            "domain": DOMAIN,
            "value": {"x": 2, "disease": "flu"},
            "budget": {"epsilon": 0.5},
            "lifetime": {"epsilon": 1.2},
        },
    )
    assert r.status_code == 201, r.text
    # version 1: two queries; version 2: one; version 3 (current): one
    for query in (GRR_X, BINARY):
        submit(http, analyst, oid, query)
    for value, queries in (
        ({"x": 1, "disease": "none"}, [GRR_X]),
        ({"x": 3, "disease": "covid"}, [BINARY]),
    ):
        r = http.post(f"/v1/objects/{oid}/versions", headers=auth(ADMIN_KEY), json={"value": value})
        assert r.status_code == 201, r.text
        for query in queries:
            submit(http, analyst, oid, query)
    odometer = http.get(f"/v1/objects/{oid}/odometer", headers=auth(viewer)).json()
    assert odometer["version"] == 3
    expected = []
    for version in (1, 2, 3):
        page = http.get(
            f"/v1/objects/{oid}/odometer/history",
            params={"version": version},
            headers=auth(viewer),
        ).json()
        assert page["version"] == version, page
        assert page["created_at"], page
        last = page["points"][-1]
        expected.append((version, page["created_at"], last["accepted"], last["realized_loss"]))
    # the versions' losses add up to the lifetime's (bounds add)
    assert math.isclose(
        sum(e[3]["upper"] for e in expected), odometer["lifetime"]["realized_loss"]["upper"]
    )

    browser.navigate(f"{server.url}/dashboard/?poll=1#/objects/{oid}")
    sign_in(browser, viewer)
    browser.wait_for(
        "!document.getElementById('versions').hidden"
        " && document.querySelectorAll('#versions-chart rect.segment').length === 3"
    )
    segments = browser.evaluate(
        "[...document.querySelectorAll('#versions-chart rect.segment')]"
        ".map(r => [r.dataset.version, r.dataset.upper, r.classList.contains('current'),"
        " Number(r.getAttribute('x')), Number(r.getAttribute('width'))])"
    )
    assert [s[:3] for s in segments] == [
        [str(v), repr(float(loss["upper"])), v == 3] for v, _, _, loss in expected
    ]
    # stacked: each segment starts where the one before ends, widths in proportion to the loss
    for before, after in itertools.pairwise(segments):
        assert after[3] == pytest.approx(before[3] + before[4], abs=0.02)
    # pixels per unit of loss, from the whole stack (coordinates are drawn to 0.01 px)
    total = sum(loss["upper"] for _, _, _, loss in expected)
    scale = (segments[-1][3] + segments[-1][4] - segments[0][3]) / total
    for segment, (_, _, _, loss) in zip(segments, expected, strict=True):
        assert segment[4] == pytest.approx(loss["upper"] * scale, abs=0.05)
    # the lifetime line at ε_L on the same scale
    line = browser.evaluate(
        "Number(document.querySelector('#versions-chart line.lifetime').getAttribute('x1'))"
    )
    assert line == pytest.approx(segments[0][3] + 1.2 * scale, abs=0.05)
    legend = browser.evaluate("document.getElementById('versions-legend').textContent")
    assert "current version (3)" in legend
    assert "ε_L = 1.2" in legend
    # the table, newest first, with the API's exact numbers
    rows = browser.evaluate(
        "[...document.querySelectorAll('#versions-table tbody tr')].map(tr => ["
        "tr.dataset.version, tr.cells[1].textContent,"
        " ...[...tr.querySelectorAll('td.num')].slice(1).map(td => td.dataset.value)])"
    )
    created = browser.evaluate(
        f"{json.dumps([e[1] for e in reversed(expected)])}"
        ".map(iso => new Date(iso).toLocaleString())"
    )
    assert rows == [
        [str(v), shown, str(accepted), repr(float(loss["lower"])), repr(float(loss["upper"]))]
        for (v, _, accepted, loss), shown in zip(reversed(expected), created, strict=True)
    ]
    # the text alternative says what the bar shows
    caption = browser.evaluate("document.getElementById('versions-summary').textContent")
    lifetime = odometer["lifetime"]
    assert caption.startswith("Realized privacy loss of each of 3 data versions, stacked:")
    assert f"lifetime budget of {js_num(1.2)}" in caption
    assert f"{js_num(lifetime['remaining'])} remaining" in caption

    ARTIFACTS.mkdir(exist_ok=True)
    browser.screenshot(ARTIFACTS / "dashboard-versions.png")

    # a new version while the page is open: a fourth segment, the history starts again
    r = http.post(
        f"/v1/objects/{oid}/versions",
        headers=auth(ADMIN_KEY),
        json={"value": {"x": 0, "disease": "none"}},
    )
    assert r.status_code == 201, r.text
    browser.wait_for(
        "document.querySelectorAll('#versions-chart rect.segment').length === 4"
        " && document.querySelector('#versions-chart rect.segment.current').dataset.version === '4'"
        " && document.querySelectorAll('#history tbody tr').length === 0"
    )
    assert browser.problems() == []


def test_an_object_with_one_version_and_no_lifetime_shows_no_versions_card(
    server: ThreadServer, browser: Browser
) -> None:
    http = httpx.Client(base_url=server.url, timeout=30)
    viewer = new_key(http, "viewer")
    oid = unique_id("oneversion")
    register(http, oid, 0.5)
    submit(http, new_key(http, "analyst"), oid, GRR_X)
    browser.navigate(f"{server.url}/dashboard/?poll=1#/objects/{oid}")
    sign_in(browser, viewer)
    browser.wait_for("document.querySelectorAll('#history tbody tr').length === 1")
    assert browser.evaluate("document.getElementById('versions').hidden") is True
    assert browser.problems() == []
