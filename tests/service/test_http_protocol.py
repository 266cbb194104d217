"""``gatekeeper serve``'s HTTP protocol: uvicorn's bytes, a response's head and body in one write.

:class:`app.api.http.OneWriteProtocol` is uvicorn's httptools protocol whose request cycles hold
a response's head until its body. These tests drive it and uvicorn's own protocol with the same
requests on a recording transport and compare what each wrote and whether it closed: the bytes
must be the same, and a response with a ``Content-Length`` must be one ``write`` (two in
uvicorn's). A streamed response, a ``HEAD``, HTTP/1.0, pipelined requests and the failures
(before the head, between head and body) are covered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

import app.cli as cli
from app.api.http import OneWriteProtocol

Scope = dict[str, Any]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


class Recording:
    """A transport that records what is written to it and whether it was closed."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )

    def write(self, data: bytes) -> None:
        assert not self.closed, "written after close"
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, *args: Any, **kwargs: Any) -> None:
        pass


async def json_app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    body = b'{"query_id":1,"path":"' + scope["path"].encode() + b'"}'
    await receive()
    await send(
        {
            "type": "http.response.start",
            "status": 201,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(body)),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def stream_app(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    for part in (b"one,", b"two,", b"three"):
        await send({"type": "http.response.body", "body": part, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def failing_before_head(scope: Scope, receive: Receive, send: Send) -> None:
    raise RuntimeError("before the head")


async def failing_after_head(scope: Scope, receive: Receive, send: Send) -> None:
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]}
    )
    raise RuntimeError("between the head and the body")


async def split_body(scope: Scope, receive: Receive, send: Send) -> None:
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"10")]}
    )
    await send({"type": "http.response.body", "body": b"12345", "more_body": True})
    await send({"type": "http.response.body", "body": b"67890"})


async def no_content(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


GET = b"GET /v1/objects/a HTTP/1.1\r\nhost: x\r\n\r\n"
POST = b"POST /v1/objects/a/queries HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}"


def serve(protocol_class: type[HttpToolsProtocol], app: Any, data: bytes) -> Recording:
    """``data`` sent to a fresh connection of ``protocol_class``; what it wrote."""
    loop = asyncio.new_event_loop()
    try:
        config = Config(app=app, http=protocol_class, lifespan="off", log_level="critical")
        config.load()
        state = ServerState()
        protocol = protocol_class(config=config, server_state=state, app_state={}, _loop=loop)
        transport = Recording()
        protocol.connection_made(transport)  # type: ignore[arg-type]
        protocol.data_received(data)

        async def settle() -> None:
            for _ in range(200):
                await asyncio.sleep(0)
                if not state.tasks:
                    await asyncio.sleep(0)
                    if not state.tasks:
                        return

        loop.run_until_complete(settle())
        if protocol.timeout_keep_alive_task is not None:
            protocol.timeout_keep_alive_task.cancel()
        return transport
    finally:
        loop.close()


#: (name, app, request bytes, writes with OneWriteProtocol, writes with uvicorn's protocol)
CASES = [
    ("json", json_app, POST, 1, 2),
    ("json GET", json_app, GET, 1, 2),
    ("pipelined", json_app, POST + GET + POST, 3, 6),
    ("HTTP/1.0", json_app, b"GET / HTTP/1.0\r\n\r\n", 1, 2),
    ("HEAD", json_app, b"HEAD / HTTP/1.1\r\nhost: x\r\n\r\n", 1, 1),
    ("connection: close", json_app, b"GET / HTTP/1.1\r\nconnection: close\r\n\r\n", 1, 2),
    ("stream", stream_app, GET, 5, 5),
    ("no content", no_content, GET, 1, 2),
    ("split body", split_body, GET, 2, 3),
    ("failing before the head", failing_before_head, GET, 1, 2),
    ("failing after the head", failing_after_head, GET, 1, 1),
]


@pytest.mark.parametrize(
    ("app", "data", "ours", "theirs"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_the_same_bytes_as_uvicorn_in_fewer_writes(
    app: Any, data: bytes, ours: int, theirs: int
) -> None:
    one = serve(OneWriteProtocol, app, data)
    uvicorn_s = serve(HttpToolsProtocol, app, data)
    assert b"".join(one.writes) == b"".join(uvicorn_s.writes)
    assert b"".join(one.writes).startswith(b"HTTP/1.")
    assert one.closed == uvicorn_s.closed
    assert (len(one.writes), len(uvicorn_s.writes)) == (ours, theirs)


def test_a_stream_s_head_goes_out_before_its_body() -> None:
    ours = serve(OneWriteProtocol, stream_app, GET)
    assert ours.writes[0].endswith(b"\r\n\r\n")
    assert b"one," not in ours.writes[0]


def test_serve_runs_uvicorn_with_the_one_write_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    seen: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda *args, **kwargs: seen.update(kwargs))
    monkeypatch.setattr(cli, "_prepare_database", lambda: (cli_settings(), _Engine()))
    for name in ("_encrypt_legacy_values", "_fold_object_counts", "_collect_states"):
        monkeypatch.setattr(cli, name, lambda engine: None)
    assert cli.main(["serve", "--workers", "1"]) == 0
    config = Config(app=json_app, http=seen["http"])
    config.load()
    assert config.http_protocol_class is OneWriteProtocol


class _Engine:
    def dispose(self) -> None:
        pass


def cli_settings() -> Any:
    from app.settings import get_settings

    return get_settings()
