"""Submit latency does not depend on the private value (two-sample Kolmogorov–Smirnov test).

Two objects identical but for their true value (the lowest and the highest point of the domain)
receive the same ``grr`` and ``binary_rr`` submits, interleaved in an order drawn at random for
each pair, so that drift (a growing history, other load on the machine, garbage collection)
affects both alike. The latency of each submit through the in-process app is recorded and the two
samples are compared with ``scipy.stats.ks_2samp``: the test fails if they differ at the 1%
level. The sampler's own code does the same work whatever the value (``app.engine.sampling``);
this checks the whole submit path: decryption of the value, sampling, recording.

``GATEKEEPER_TIMING_SAMPLES`` sets the submits per object (1,000 by default; docs/reliability.md
records a run with 10,000).
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator

import numpy as np
import pytest
from fastapi.testclient import TestClient
from scipy.stats import ks_2samp

from app.bootstrap import create_app
from tests.service.conftest import ADMIN_KEY, auth, make_settings, new_key, unique_id

pytestmark = pytest.mark.slow

SAMPLES = int(os.environ.get("GATEKEEPER_TIMING_SAMPLES", "1000"))
DOMAIN = {
    "attributes": [
        {"name": "x", "type": "integer", "low": 0, "high": 7},
        {"name": "c", "type": "categorical", "values": ["a", "b", "c"]},
    ]
}
VALUES = ({"x": 0, "c": "a"}, {"x": 7, "c": "c"})
QUERIES = (
    {"mechanism": "grr", "attribute": "x", "epsilon": 0.5},
    {"mechanism": "grr", "attribute": "c", "epsilon": 0.5},
    {
        "mechanism": "binary_rr",
        "epsilon": 0.5,
        "predicate": {"attribute": "x", "op": "<=", "value": 3},
    },
)


@pytest.fixture(scope="module")
def client(sqlite_url: str) -> Iterator[TestClient]:
    """The in-process app on the module's SQLite file (no network noise)."""
    with TestClient(create_app(make_settings(sqlite_url))) as test_client:
        yield test_client


def test_submit_latency_does_not_depend_on_the_value(client: TestClient) -> None:
    objects = []
    for value in VALUES:
        object_id = unique_id("timing")
        response = client.post(
            "/v1/objects",
            json={
                "id": object_id,
                "domain": DOMAIN,
                "value": value,
                "budget": {"epsilon": 10000.0},
                "filter": "basic",
            },
            headers=auth(ADMIN_KEY),
        )
        assert response.status_code == 201, response.text
        objects.append(object_id)
    analyst = auth(new_key(client, "analyst"))
    latencies: tuple[list[float], list[float]] = ([], [])

    def submit(which: int, query: dict[str, object]) -> None:
        start = time.perf_counter()
        response = client.post(
            f"/v1/objects/{objects[which]}/queries", json={"query": query}, headers=analyst
        )
        latencies[which].append(time.perf_counter() - start)
        assert response.status_code == 201, response.text

    for _ in range(20):  # warm-up, not recorded
        for which in (0, 1):
            client.post(
                f"/v1/objects/{objects[which]}/queries",
                json={"query": QUERIES[0]},
                headers=analyst,
            )
    for i in range(SAMPLES):
        query = QUERIES[i % len(QUERIES)]
        first = secrets.randbelow(2)
        submit(first, query)
        submit(1 - first, query)
    low, high = np.array(latencies[0]), np.array(latencies[1])
    result = ks_2samp(low, high)
    summary = (
        f"{SAMPLES} submits per value: median {1e3 * np.median(low):.3f} vs"
        f" {1e3 * np.median(high):.3f} ms, KS statistic {result.statistic:.4f},"
        f" p = {result.pvalue:.3f}"
    )
    print(summary)
    assert result.pvalue > 0.01, summary
