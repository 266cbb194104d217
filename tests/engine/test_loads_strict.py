"""The strict JSON reader with one prebuilt decoder answers as ``json.loads`` with a fresh hook.

:func:`app.engine.jsonfields.loads_strict` parses every request body (and the CLI's files).
It used to call ``json.loads(raw, object_pairs_hook=...)`` with a new closure per call, which
builds a ``JSONDecoder`` per call; it now uses one decoder whose hook notes a repeated key for the
calling thread. These compare it, input by input, with that former reader (kept here): the same
document, or the same exception with the same message — str, bytes and bytearray, every UTF
encoding ``json.loads`` detects, a BOM, a key given twice at any depth, lone surrogates, syntax
errors after a repeat, too deep a nesting — and from several threads at once.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from app.engine import jsonfields
from app.engine.jsonfields import NotText, RepeatedKey, loads_strict


def former(raw: Any) -> Any:
    """``loads_strict`` as it was: a hook closure per call, ``json.loads`` building the decoder."""
    twice_seen = False

    def as_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal twice_seen
        obj = dict(pairs)
        if len(obj) == len(pairs):
            return obj
        twice_seen = True
        twice = jsonfields._Twice(obj)
        twice.repeated = jsonfields._first_repeated(pairs)
        return twice

    document = json.loads(raw, object_pairs_hook=as_object)
    if twice_seen:
        try:
            repeated = jsonfields._first_path(document, "", jsonfields._repeated_here)
        except RecursionError:
            repeated = "body"
        raise RepeatedKey(repeated or "body")
    if isinstance(raw, str) or jsonfields._SURROGATE_ESCAPE.search(raw):
        try:
            where = jsonfields._first_path(document, "", jsonfields._surrogate_here)
        except RecursionError:
            where = "body"
        if where is not None:
            raise NotText(where or "body")
    return document


def outcome(read: Any, raw: Any) -> tuple[str, Any]:
    try:
        document = read(raw)
    except (RepeatedKey, NotText) as exc:
        return type(exc).__name__, exc.field
    except (ValueError, TypeError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        return type(exc).__name__, str(exc)
    return "document", (type(document).__name__, json.dumps(document))


TEXTS = [
    '{"query": {"mechanism": "grr", "attribute": "b", "epsilon": 0.5}}',
    '{"query": {"epsilon": 1, "epsilon": 50}}',
    '{"a": 1, "a": 2}',
    '{"a": {"x": 1, "x": 2}, "a": 3}',
    '{"a": [{"b": 1}, {"c": 1, "c": 2}], "d": {"e": 1, "e": 1}}',
    '{"a": 1, "a": 2',  # a repeat, then a syntax error
    '{"a": 1,}',
    "[1, 2, 3]",
    '"text"',
    "1e400",
    "NaN",
    "",
    "  ",
    '{"s": "\\ud800"}',
    '{"\\udc00": 1}',
    '{"s": "\\ud83d\\ude00"}',
    '{"s": "é ü ∑ 😀"}',
    '{"deep": ' + "[" * 50 + "]" * 50 + "}",
    "[" * 100_000 + "]" * 100_000,
    '{"x": 1} trailing',
]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("kind", ["str", "utf-8", "bytearray", "utf-8-sig", "utf-16", "utf-32"])
def test_loads_strict_answers_as_the_former_reader(text: str, kind: str) -> None:
    raw: Any
    if kind == "str":
        raw = text
    elif kind == "bytearray":
        raw = bytearray(text.encode("utf-8", "surrogatepass"))
    else:
        raw = text.encode(kind, "surrogatepass")
    assert outcome(loads_strict, raw) == outcome(former, raw)


@pytest.mark.parametrize(
    "raw",
    ['\ufeff{"a": 1}', b"\xff\xfe", b'{"a": "\xc3"}', b"\x00", 12, None, ["[]"]],
)
def test_boms_bad_encodings_and_other_types_fail_as_before(raw: Any) -> None:
    assert outcome(loads_strict, raw) == outcome(former, raw)


def test_no_decoder_is_built_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    made = []
    real_init = json.JSONDecoder.__init__

    def counted(self: json.JSONDecoder, *args: Any, **kwargs: Any) -> None:
        made.append(kwargs)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(json.JSONDecoder, "__init__", counted)
    assert loads_strict(b'{"query": {"epsilon": 1}}') == {"query": {"epsilon": 1}}
    with pytest.raises(RepeatedKey):
        loads_strict(b'{"a": 1, "a": 2}')
    assert made == []


def test_threads_see_only_their_own_repeats() -> None:
    """A repeat in one thread's document is never reported for another thread's."""
    clean = b'{"a": {"b": [1, 2, {"c": 3}]}, "d": "e"}'
    twice = b'{"a": {"b": [1, 2, {"c": 3, "c": 4}]}, "d": "e"}'
    wrong: list[str] = []
    start = threading.Barrier(4)

    def work(n: int) -> None:
        start.wait()
        for i in range(3000):
            repeat = (i + n) % 2 == 0
            try:
                loads_strict(twice if repeat else clean)
            except RepeatedKey as exc:
                if not repeat or exc.field != "a.b[2].c":
                    wrong.append(f"thread {n}: {exc.field} on a clean document")
            else:
                if repeat:
                    wrong.append(f"thread {n}: a repeat not reported")

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
