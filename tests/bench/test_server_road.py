"""``bench/server_road.py``'s pure parts: wrk's script and summary, the bare rung, the tables."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import server_road as sr  # noqa: E402


def test_wrk_summary_is_read_from_its_done_line() -> None:
    out = (
        "Running 4s test @ http://127.0.0.1:1\n  2 threads and 32 connections\n"
        'ROAD {"requests": 1200, "us": 4000000, "bad_status": 3, "connect": 0, "read": 1, '
        '"write": 0, "timeout": 0, "p50_us": 25000, "p99_us": 90000}\n'
        "Requests/sec: 300.00\n"
    )
    found = sr.parse_wrk(out)
    assert found["requests"] == 1200
    assert found["us"] == 4_000_000
    assert found["bad_status"] == 3
    assert found["read"] == 1
    assert found["p99_us"] == 90_000
    with pytest.raises(RuntimeError, match="no summary"):
        sr.parse_wrk("Requests/sec: 300.00\n")


def test_wrk_script_names_every_object_and_refuses_lua_escapes() -> None:
    body = json.dumps({"query": {"mechanism": "grr", "attribute": "a", "epsilon": 0.5}}).encode()
    text = sr.wrk_script(["o-1", "o-2"], "secret-key", body)
    assert 'local ids = {"o-1", "o-2"}' in text
    assert 'local auth = "Bearer secret-key"' in text
    assert f"local body = '{body.decode()}'" in text
    # every request a fresh Idempotency-Key: the run's salt, the thread and a counter
    assert '["Idempotency-Key"] = key' in text
    assert 'string.format("%s-%d-%d", salt, tid, counter)' in text
    assert "%%" not in text  # the template's escapes all resolved
    with pytest.raises(ValueError, match="Lua escapes"):
        sr.wrk_script(["o"], "k", b'{"a": "it\'s"}')


def _serve_bare(request: bytes) -> list[dict[str, Any]]:
    app = sr.bare_app()
    chunks = [
        {"type": "http.request", "body": request[:5], "more_body": True},
        {"type": "http.request", "body": request[5:], "more_body": False},
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return chunks.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app({"type": "http"}, receive, send))
    assert chunks == []  # the whole body was read
    return sent


def test_the_bare_rung_answers_a_submits_fixed_answer() -> None:
    start, body = _serve_bare(b'{"query": {}}')
    assert start["status"] == 201
    answer = json.loads(body["body"])
    assert set(answer) == {
        "query_id",
        "object_id",
        "seq",
        "version",
        "output",
        "epsilon",
        "odometer",
        "reused",
    }
    assert 300 <= len(body["body"]) <= 400  # a real answer's size
    assert (b"content-length", str(len(body["body"])).encode()) in start["headers"]


def test_the_response_model_is_built_from_an_answer() -> None:
    from datetime import UTC, datetime

    import async_probe as ap

    answer = ap.answer_body(sr.fixed_row("o-1"), 3, 7, datetime(2026, 1, 1, tzinfo=UTC))
    result = sr.submit_result(answer)
    assert result.model_dump(mode="json", exclude_none=True) == json.loads(json.dumps(answer))


def _row(
    server: float, pg: float = 0.0, client: float = 0.1, rate: float = 100.0
) -> dict[str, float]:
    return {"server": server, "pg": pg, "client": client, "rate": rate, "redis": 0.0}


def test_the_ladder_marks_rungs_below_a_quarter_of_pgbench() -> None:
    pgbench = sr.Arm("pgbench", rows=[_row(0.0, pg=0.3, client=0.1, rate=4000.0)] * 3)
    cheap = sr.Arm("bare", rows=[_row(0.05, client=0.05, rate=20000.0)] * 3)
    # pgbench 0.4 ms per tx: at 0.25x a request may cost 1.6 ms in all
    edge = sr.Arm("fastapi", rows=[_row(1.4, client=0.1, rate=1000.0)] * 3)
    dear = sr.Arm("real", rows=[_row(2.5, pg=1.0, client=0.1, rate=300.0)] * 3)
    lines = sr.ladder([cheap, edge, dear], pgbench)
    by_name = {line.split()[0]: line for line in lines[1:]}
    assert by_name["bare"].split()[-1] == "no"
    assert by_name["fastapi"].split()[-1] == "no"  # 1.5 ms: within
    assert by_name["real"].split()[-1] == "yes"
    # measured: 300 / 4000; by CPU: 0.4 / 3.6
    assert "0.075" in by_name["real"]
    assert "0.111" in by_name["real"]
    assert "1.600 ms of CPU in all" in lines[-1]


def test_a_layer_is_the_median_of_its_per_block_differences() -> None:
    low = sr.Arm("bare", rows=[_row(0.1), _row(0.2), _row(0.1)])
    high = sr.Arm("context", rows=[_row(0.3), _row(0.3), _row(0.6)])
    (line,) = sr.layer_costs({"bare": low, "context": high})
    assert line.startswith("bare -> context")
    assert "server  +0.200 ms (blocks +0.100..+0.500)" in line
