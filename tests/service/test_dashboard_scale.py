"""The dashboard over more objects than a browser should load (issue 25, item 5), on PostgreSQL.

Reported at 20,002 objects: the filter searched only the first 20,000 rows loaded ("No object
matches" for ids that exist), the summary mixed the API's total with counts of loaded rows, and
"near exhaustion" disagreed with the metric. Now the page asks the service: its summary must
equal ``GET /v1/odometers/totals`` and the Prometheus gauges, and a search by id must find an
object far beyond the first page.

CI seeds 20,002 objects. By hand, at 10^6 (the issue's goal: first paint ≤ 2 s, a search by id
≤ 1 s, asserted when ``GATEKEEPER_DASHBOARD_OBJECTS`` is set):

    GATEKEEPER_DASHBOARD_OBJECTS=1000000 CI=true .venv/bin/pytest -n 0 -s \\
        tests/service/test_dashboard_scale.py

The measured times are printed (docs/benchmarks.md records them).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.service.browser import Browser, Chromium, find_chromium
from tests.service.conftest import (
    IN_CI,
    Server,
    ThreadServer,
    auth,
    new_key,
    start_server,
    start_thread_server,
)
from tests.service.factories import run_cli_process

ASKED = os.environ.get("GATEKEEPER_DASHBOARD_OBJECTS")
COUNT = int(ASKED or 20_002)
#: objects spent (ε = budget) and near exhaustion (0.95 of the budget), far from the first page
EXHAUSTED = sorted({COUNT // 2, COUNT - 3, COUNT - 1})
NEAR = sorted({COUNT // 3, COUNT - 2})

pytestmark = pytest.mark.slow
#: rows a page of the list shows (PAGE in app/api/static/dashboard/app.js)
PAGE = 250


def object_id(n: int) -> str:
    return f"scale-{n:07d}"


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
def seeded(
    tmp_path_factory: pytest.TempPathFactory, postgres_url: str
) -> Iterator[Server | ThreadServer]:
    """A server on a fresh PostgreSQL database holding COUNT objects (through the import CLI).

    In CI the service is served on a thread of the test process (what is checked is the page
    and the service's answers); the by-hand run at scale, which times first paint and search
    against the issue's goal, starts ``gatekeeper serve`` so that nothing of the test process
    shares the server's interpreter.
    """
    where = tmp_path_factory.mktemp("scale")
    lines = where / "objects.ndjson"
    domain = {"attributes": [{"name": "x", "type": "integer", "low": 0, "high": 3}]}
    with lines.open("w") as out:
        for n in range(COUNT):
            record = {
                "id": object_id(n),
                "domain": domain,
                "value": {"x": n % 4},
                "budget": {"epsilon": 1.0},
                "filter": "basic",
                "labels": {"site": "abc"[n % 3]},
            }
            out.write(json.dumps(record) + "\n")
    started = time.monotonic()
    # a subprocess: its timeout fails a hung import instead of stalling the suite (this slow
    # test imports 20,000 objects; the interpreter's start is nothing next to that)
    done = run_cli_process(
        "import", str(lines), "--quiet", "--jobs", "0", database_url=postgres_url, timeout=1800
    )
    assert done.returncode == 0, done.stderr
    print(f"\nimported {COUNT} objects in {time.monotonic() - started:.1f} s")
    running: Server | ThreadServer
    if ASKED:
        running = start_server(
            where, database_url=postgres_url, redis_url=None, workers=1, BOUND_PROCESSES="0"
        )
    else:
        running = start_thread_server(database_url=postgres_url, redis_url=None, bound_processes=0)
    http = httpx.Client(base_url=running.url, timeout=60)
    analyst = auth(new_key(http, "analyst"))
    for numbers, epsilon in ((EXHAUSTED, 1.0), (NEAR, 0.95)):
        for n in numbers:
            query = {"mechanism": "grr", "attribute": "x", "epsilon": epsilon}
            r = http.post(
                f"/v1/objects/{object_id(n)}/queries", json={"query": query}, headers=analyst
            )
            assert r.status_code == 201, r.text
    r = http.post(
        f"/v1/objects/{object_id(EXHAUSTED[-1])}/queries",
        json={"query": {"mechanism": "grr", "attribute": "x", "epsilon": 0.1}},
        headers=analyst,
    )
    assert r.status_code == 409, r.text
    yield running
    running.stop()


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


def gauges(http: httpx.Client) -> dict[str, float]:
    found = {}
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("gatekeeper_objects"):
            name, value = line.rsplit(" ", 1)
            found[name] = float(value)
    return found


SUMMARY = (
    "Object.fromEntries(['sum-objects', 'sum-exhausted', 'sum-near', 'sum-rejected']"
    ".map(id => [id, document.getElementById(id).dataset.value]))"
)


def test_totals_and_search_come_from_the_service(
    seeded: Server | ThreadServer, browser: Browser
) -> None:
    http = httpx.Client(base_url=seeded.url, timeout=60)
    viewer = new_key(http, "viewer")
    totals = http.get("/v1/odometers/totals", headers=auth(viewer)).json()
    assert totals == {
        "objects": COUNT,
        "active": COUNT,
        "retired": 0,
        "exhausted": len(EXHAUSTED),
        "near_exhaustion": len(EXHAUSTED) + len(NEAR),
        "rejected": 1,
    }
    metric = gauges(http)
    assert metric['gatekeeper_objects{status="active"}'] == totals["active"]
    assert metric["gatekeeper_objects_exhausted"] == totals["exhausted"]
    assert metric["gatekeeper_objects_near_exhaustion"] == totals["near_exhaustion"]
    listed = http.get("/v1/odometers", params={"limit": 1}, headers=auth(viewer)).json()
    assert listed["total"] == COUNT

    # first paint: sign in, then the first page and the service's totals
    browser.navigate(f"{seeded.url}/dashboard/?poll=60")
    browser.wait_for("!document.getElementById('sign-in-view').hidden")
    browser.type_into("#key", viewer)
    started = time.monotonic()
    browser.click("#sign-in-form button")
    browser.wait_for(
        f"document.querySelectorAll('#objects tbody tr').length === {PAGE}",
        timeout=60,
        interval=0.02,
    )
    first_paint = time.monotonic() - started
    browser.wait_for(
        "document.getElementById('sum-objects').dataset.value !== ''", timeout=60, interval=0.02
    )
    summary = time.monotonic() - started
    assert browser.evaluate(SUMMARY) == {
        "sum-objects": str(totals["objects"]),
        "sum-exhausted": str(totals["exhausted"]),
        "sum-near": str(totals["near_exhaustion"]),
        "sum-rejected": str(totals["rejected"]),
    }
    assert browser.evaluate("document.getElementById('count').textContent").startswith(
        f"{PAGE} of {COUNT} objects (rows 1–{PAGE})"
    )

    # a search by id finds the last object, far beyond the first page
    last = object_id(COUNT - 1)
    started = time.monotonic()
    browser.type_into("#filter", last)
    browser.wait_for(
        f"document.querySelectorAll('#objects tbody tr').length === 1 && "
        f"!!document.querySelector('#objects tr[data-id={json.dumps(last)}]')",
        timeout=30,
        interval=0.02,
    )
    search = time.monotonic() - started
    browser.wait_for("document.getElementById('sum-exhausted').dataset.value === '1'", timeout=30)
    assert browser.evaluate("document.getElementById('no-match').hidden")
    # a prefix of many: the first page of them, and the exact count
    prefix = object_id(COUNT - 1)[:-1]
    many = sum(object_id(n).startswith(prefix) for n in range(COUNT))
    browser.type_into("#filter", prefix)
    browser.wait_for(
        f"document.getElementById('count').textContent.startsWith('{many} of {many} objects')",
        timeout=30,
    )
    # an id that does not exist says so
    browser.type_into("#filter", "scale-x")
    browser.wait_for("!document.getElementById('no-match').hidden", timeout=30)

    # the status filter lists the exhausted objects (from the service, not the loaded rows)
    browser.type_into("#filter", "")
    browser.evaluate(
        "(() => { const s = document.getElementById('status-filter'); s.value = 'exhausted';"
        " s.dispatchEvent(new Event('change')); })()"
    )
    browser.wait_for(
        f"document.querySelectorAll('#objects tbody tr').length === {len(EXHAUSTED)}", timeout=30
    )
    assert sorted(
        browser.evaluate(
            "[...document.querySelectorAll('#objects tbody tr')].map(r => r.dataset.id)"
        )
    ) == [object_id(n) for n in EXHAUSTED]

    # the next page: the next rows in id order, after the first page's last
    browser.evaluate(
        "(() => { const s = document.getElementById('status-filter'); s.value = '';"
        " s.dispatchEvent(new Event('change')); })()"
    )
    browser.wait_for(
        f"document.querySelectorAll('#objects tbody tr').length === {PAGE}", timeout=30
    )
    browser.click("#page-next")
    browser.wait_for(
        f"!!document.querySelector('#objects tr[data-id={json.dumps(object_id(PAGE))}]')",
        timeout=30,
    )
    assert browser.evaluate("document.getElementById('count').textContent").startswith(
        f"{PAGE} of {COUNT} objects (rows {PAGE + 1}–{2 * PAGE})"
    )
    assert browser.problems() == []
    print(
        f"\n{COUNT} objects: first paint (rows) {first_paint:.2f} s, summary {summary:.2f} s, "
        f"search by id {search:.2f} s, load {os.getloadavg()[0]:.1f}"
    )
    if ASKED:  # the goal, asserted in the by-hand run at scale
        assert first_paint <= 2.0
        assert search <= 1.0
