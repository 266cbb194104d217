"""Per-key rate limits: 429 problem+json with Retry-After, per key, shared through Redis.

The limit counts requests by a hash of the bearer key, before authentication: a key over its
limit (valid or not) gets ``429`` ``rate-limited`` with ``Retry-After``; other keys are not
affected; the budget refills with time; with Redis two app instances (two workers) share one
count; with the default settings nothing is limited.
"""

from __future__ import annotations

import secrets
import time

import pytest
from fastapi.testclient import TestClient

from app.api.ratelimit import TokenBuckets
from app.bootstrap import create_app
from tests.service.conftest import ADMIN_KEY, auth, make_settings, new_key

RATE, BURST = 2.0, 5


def odometers(client: TestClient, key: str) -> int:
    """Status of one cheap authenticated request."""
    return client.get("/v1/odometers", headers=auth(key)).status_code


def test_a_key_over_its_burst_gets_429_and_others_do_not(sqlite_url: str) -> None:
    settings = make_settings(sqlite_url, rate_limit_per_second=RATE, rate_limit_burst=BURST)
    with TestClient(create_app(settings)) as client:
        viewer, other = new_key(client, "viewer"), new_key(client, "viewer")
        codes = [odometers(client, viewer) for _ in range(BURST)]
        assert codes == [200] * BURST
        throttled = client.get("/v1/odometers", headers=auth(viewer))
        assert throttled.status_code == 429
        assert throttled.headers["content-type"].startswith("application/problem+json")
        assert throttled.json()["type"] == "rate-limited"
        assert int(throttled.headers["retry-after"]) >= 1
        assert "x-request-id" in throttled.headers
        assert viewer not in throttled.text
        assert odometers(client, other) == 200
        # an unknown key is throttled as well (guessing keys costs the same)
        stranger = "not-a-key-" + secrets.token_hex(8)
        assert [odometers(client, stranger) for _ in range(BURST + 1)][-1] == 429
        time.sleep(1.0 / RATE + 0.1)  # one token back
        assert odometers(client, viewer) == 200


def test_two_workers_share_the_count_through_redis(sqlite_url: str, redis_url: str) -> None:
    settings = make_settings(
        sqlite_url, redis_url, rate_limit_per_second=RATE, rate_limit_burst=BURST
    )
    with TestClient(create_app(settings)) as one, TestClient(create_app(settings)) as two:
        viewer = new_key(one, "viewer")
        # both instances count the same key: together they admit at most one window's burst
        # (a window boundary in between may admit a second one)
        codes = [odometers(one if i % 2 else two, viewer) for i in range(4 * BURST)]
        assert codes.count(429) > 0
        assert codes.count(200) <= 2 * BURST


def test_no_limit_by_default(sqlite_url: str) -> None:
    with TestClient(create_app(make_settings(sqlite_url))) as client:
        assert {odometers(client, ADMIN_KEY) for _ in range(50)} == {200}


@pytest.mark.parametrize(("rate", "burst"), [(1.0, 1), (10.0, 3)])
def test_token_bucket_admits_the_burst_then_the_rate(rate: float, burst: int) -> None:
    buckets = TokenBuckets(rate, burst)
    assert all(buckets.take("k") == 0.0 for _ in range(burst))
    wait = buckets.take("k")
    assert 0.0 < wait <= 1.0 / rate
    assert buckets.take("other") == 0.0
