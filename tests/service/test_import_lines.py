"""``gatekeeper import`` names the first bad line of a file (issue 23, 7).

A batch was parsed as JSON line by line and validated afterwards, so a malformed line was
reported before an invalid line above it: fixing the reported line only revealed an earlier one.
"""

from __future__ import annotations

import json

import pytest

from app.engine.limits import DEFAULT_LIMITS
from app.services.imports import BadLine, parse_lines

DOMAIN = {"attributes": [{"name": "x", "type": "integer", "low": 0, "high": 3}]}


def line(oid: str, epsilon: float = 1.0) -> bytes:
    body = {"id": oid, "domain": DOMAIN, "value": {"x": 1}, "budget": {"epsilon": epsilon}}
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("lines", "first"),
    [
        ([line("a"), line("b", -1), line("c"), b"{not json"], "line 2, field budget.epsilon"),
        ([line("a"), b"{not json", line("b", -1)], "line 2: not valid JSON"),
        ([b"[1, 2", line("b", -1)], "line 1: not valid JSON"),
        ([line("a"), line("a"), b"{"], "line 2, field id: repeats the id"),
    ],
    ids=["invalid-then-malformed", "malformed-then-invalid", "malformed-first", "repeated-id"],
)
def test_the_first_bad_line_is_reported(lines: list[bytes], first: str) -> None:
    with pytest.raises(BadLine) as caught:
        parse_lines(list(enumerate(lines, start=1)), DEFAULT_LIMITS)
    assert str(caught.value).startswith(first)


def test_good_lines_are_registrations() -> None:
    done = parse_lines([(1, line("a")), (3, line("b"))], DEFAULT_LIMITS)
    assert [r.id for r in done] == ["a", "b"]
