"""A response's head and body in one write (``app.api.wire``), and nothing else changed.

Each case drives uvicorn's own ``HttpToolsProtocol`` and ``OneWriteHttpToolsProtocol`` side by
side over a recording transport with the same request bytes and ASGI app: the bytes written are
the same, in the same order, and a small answer is one write instead of two. The first test is the
premise, checked against the installed uvicorn: if uvicorn ever writes a head and its body as one
(or a head in several writes, or not starting ``HTTP/1.1``), it fails, and the wrapper is to be
revisited. The live tests serve through a real uvicorn server (uvloop, sockets) with
``http=`` :data:`app.api.wire.HTTP`, as ``gatekeeper serve`` does.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from app.api import wire
from app.api.wire import HeadHeldTransport, OneWriteHttpToolsProtocol

App = Callable[[Any, Any, Any], Awaitable[None]]
GET = b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n"


class Recorder(asyncio.Transport):
    """A connection's transport that records what is written to it."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False
        self.protocol: Any = None

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self.writes.append(b"".join(bytes(d) for d in list_of_data))

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def write_eof(self) -> None:
        self.writes.append(b"<eof>")

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def get_protocol(self) -> Any:
        return self.protocol


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def _drive(
    protocol_class: type[HttpToolsProtocol],
    app: App,
    request: bytes,
    *,
    during: Callable[[Any, Recorder], Awaitable[None]] | None = None,
) -> Recorder:
    """Feed ``request`` to a protocol of ``protocol_class`` serving ``app``; its writes."""
    config = uvicorn.Config(app, log_config=None, lifespan="off")
    state = ServerState()
    state.default_headers = [(b"server", b"test")]
    protocol = protocol_class(config, state, {}, asyncio.get_running_loop())
    transport = Recorder()
    protocol.connection_made(transport)
    protocol.data_received(request)
    if during is not None:
        await during(protocol, transport)
    for _ in range(100):  # until every request's task is done
        await _turns()
        if not state.tasks:
            break
    await _turns()
    return transport


def _both(app: App, request: bytes, **kwargs: Any) -> tuple[Recorder, Recorder]:
    async def run() -> tuple[Recorder, Recorder]:
        before = await _drive(HttpToolsProtocol, app, request, **kwargs)
        after = await _drive(OneWriteHttpToolsProtocol, app, request, **kwargs)
        return before, after

    return asyncio.run(run())


async def small(scope: Any, receive: Any, send: Any) -> None:
    """A small JSON answer, as a submit's: the head, then the whole body."""
    await receive()
    body = b'{"ok": true, "path": "%s"}' % scope["path"].encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 201, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def test_uvicorn_writes_a_head_and_its_body_apart_and_the_protocol_in_one() -> None:
    """The premise (uvicorn: two writes, the first the head) and the change (one write, the
    same bytes)."""
    before, after = _both(small, GET)
    assert len(before.writes) == 2
    assert before.writes[0].startswith(b"HTTP/1.1 201 Created\r\n")
    assert before.writes[0].endswith(b"\r\n\r\n")
    assert before.writes[1] == b'{"ok": true, "path": "/x"}'
    assert after.writes == [b"".join(before.writes)]
    assert not after.closed


def test_keep_alive_and_pipelined_requests_one_write_each_in_order() -> None:
    """Three requests in one packet: three answers, each one write, in the requests' order."""
    request = GET.replace(b"/x", b"/a") + GET.replace(b"/x", b"/b") + GET.replace(b"/x", b"/c")
    before, after = _both(small, request)
    assert len(before.writes) == 6
    assert len(after.writes) == 3
    assert b"".join(after.writes) == b"".join(before.writes)
    assert [w.rsplit(b'"path": ', 1)[1] for w in after.writes] == [b'"/a"}', b'"/b"}', b'"/c"}']
    assert not after.closed


def test_connection_close_writes_the_answer_before_closing() -> None:
    """``Connection: close`` (and HTTP/1.0): the answer is written, then the transport closed."""
    for request in (
        b"GET /x HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n",
        b"GET /x HTTP/1.0\r\nhost: t\r\n\r\n",
    ):
        before, after = _both(small, request)
        assert after.writes == [b"".join(before.writes)]
        assert b"connection: close\r\n" in after.writes[0]
        assert before.closed
        assert after.closed


def test_head_requests_write_the_head_alone_on_the_next_turn() -> None:
    """``HEAD``: uvicorn writes no body, so the held head goes out on its own, unchanged."""
    before, after = _both(small, b"HEAD /x HTTP/1.1\r\nhost: t\r\n\r\n")
    assert len(before.writes) == 1
    assert after.writes == before.writes


def test_a_streamed_head_is_not_kept_waiting_for_its_body() -> None:
    """A streaming answer (chunked): the head is written on the loop's next turn while the
    first part is not ready, then each part as it comes, the bytes uvicorn's."""
    seen_before_first_part: list[list[bytes]] = []

    def streaming() -> tuple[App, Callable[[Any, Recorder], Awaitable[None]]]:
        ready = asyncio.Event()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            await receive()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await ready.wait()
            for part in (b"one", b"two"):
                await send({"type": "http.response.body", "body": part, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        async def during(protocol: Any, transport: Recorder) -> None:
            await _turns()
            seen_before_first_part.append(list(transport.writes))
            ready.set()

        return app, during

    async def run() -> tuple[Recorder, Recorder]:
        app, during = streaming()
        before = await _drive(HttpToolsProtocol, app, GET, during=during)
        app, during = streaming()
        after = await _drive(OneWriteHttpToolsProtocol, app, GET, during=during)
        return before, after

    before, after = asyncio.run(run())
    assert after.writes == before.writes
    assert b"transfer-encoding: chunked\r\n" in after.writes[0]
    assert after.writes[1:] == [b"3\r\none\r\n", b"3\r\ntwo\r\n", b"0\r\n\r\n"]
    head = before.writes[0]
    assert seen_before_first_part == [[head], [head]]


def test_a_streamed_body_joins_its_head_when_ready_in_the_same_turn() -> None:
    """Chunked parts sent at once: the head and the first part in one write, the rest as
    uvicorn writes them; the same bytes."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"one", "more_body": True})
        await send({"type": "http.response.body", "body": b"two", "more_body": False})

    before, after = _both(app, GET)
    assert len(before.writes) == 3
    assert after.writes == [before.writes[0] + before.writes[1], before.writes[2]]


def test_expect_100_continue_is_written_at_once() -> None:
    """The interim ``100 Continue`` is not held: the client waits for it to send the body."""
    request = b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\nexpect: 100-continue\r\n\r\n"
    seen: list[list[bytes]] = []

    async def during(protocol: Any, transport: Recorder) -> None:
        await _turns()
        seen.append(list(transport.writes))
        protocol.data_received(b"{}")

    async def run() -> tuple[Recorder, Recorder]:
        before = await _drive(HttpToolsProtocol, small, request, during=during)
        after = await _drive(OneWriteHttpToolsProtocol, small, request, during=during)
        return before, after

    before, after = asyncio.run(run())
    continued = [b"HTTP/1.1 100 Continue\r\n\r\n"]
    assert seen == [continued, continued]
    assert before.writes[0] == after.writes[0] == continued[0]
    assert after.writes[1:] == [b"".join(before.writes[1:])]


def test_flow_control_still_pauses_the_answer() -> None:
    """The transport's ``pause_writing`` still stops uvicorn's writes until ``resume_writing``."""
    paused: list[list[bytes]] = []

    def paused_app() -> tuple[App, Callable[[Any, Recorder], Awaitable[None]]]:
        go = asyncio.Event()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            await receive()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"one", "more_body": True})
            await go.wait()
            await send({"type": "http.response.body", "body": b"two", "more_body": False})

        async def during(protocol: Any, transport: Recorder) -> None:
            await _turns()
            protocol.pause_writing()
            go.set()
            await _turns()
            paused.append(list(transport.writes))  # "two" waits
            protocol.resume_writing()

        return app, during

    async def run() -> tuple[Recorder, Recorder]:
        app, during = paused_app()
        before = await _drive(HttpToolsProtocol, app, GET, during=during)
        app, during = paused_app()
        after = await _drive(OneWriteHttpToolsProtocol, app, GET, during=during)
        return before, after

    before, after = asyncio.run(run())
    assert paused == [before.writes[:2], [before.writes[0] + before.writes[1]]]
    assert before.writes[2:] == after.writes[1:] == [b"3\r\ntwo\r\n0\r\n\r\n"]


def test_an_app_error_answers_500_in_one_write() -> None:
    """An application that raises before answering: uvicorn's 500, the same bytes, closed."""

    async def broken(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    before, after = _both(broken, GET)
    assert after.writes == [b"".join(before.writes)]
    assert after.writes[0].startswith(b"HTTP/1.1 500 ")
    assert before.closed
    assert after.closed


def test_the_held_head_and_the_transport() -> None:
    """``close`` and ``write_eof`` write a held head first, ``abort`` drops it, a held head
    counts in the write buffer, and a large body is handed over with the head unjoined."""

    async def run() -> None:
        loop = asyncio.get_running_loop()
        head = b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\n"

        under = Recorder()
        held = HeadHeldTransport(under, loop)
        held.write(head)
        assert under.writes == []
        assert held.get_write_buffer_size() == len(head)
        held.close()
        assert under.writes == [head]
        assert under.closed

        under = Recorder()
        held = HeadHeldTransport(under, loop)
        held.write(head)
        held.write_eof()
        assert under.writes == [head, b"<eof>"]

        under = Recorder()
        held = HeadHeldTransport(under, loop)
        held.write(head)
        held.abort()
        await _turns()
        assert under.writes == []
        assert under.aborted

        under = Recorder()
        held = HeadHeldTransport(under, loop)
        big = b"x" * (1 << 20)
        held.write(head)
        held.write(big)
        assert under.writes == [head + big]
        held.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        held.writelines([b"a", b"b"])
        assert under.writes[1:] == [b"HTTP/1.1 100 Continue\r\n\r\n", b"ab"]
        assert held.get_extra_info("peername") == ("127.0.0.1", 5000)

    asyncio.run(run())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _read_answer(sock: socket.socket) -> bytes:
    """One whole answer with a Content-Length from ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_a_real_server_with_uvloop_answers_through_the_wrapper(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``http=`` :data:`~app.api.wire.HTTP` on uvloop and real sockets: keep-alive answers whole
    and in order, each written to the wrapper as the head and its body joined."""
    joined: list[bytes] = []
    original = HeadHeldTransport.write

    def recording(self: HeadHeldTransport, data: Any) -> None:
        if self._held is not None:
            joined.append(self._held + bytes(data))
        original(self, data)

    monkeypatch.setattr(HeadHeldTransport, "write", recording)
    port = _free_port()
    config = uvicorn.Config(
        small, host="127.0.0.1", port=port, http=wire.HTTP, loop="uvloop", log_config=None
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.started
        with socket.create_connection(("127.0.0.1", port)) as sock:
            answers = []
            for path in (b"/a", b"/b"):
                sock.sendall(GET.replace(b"/x", path))
                answers.append(_read_answer(sock))
    finally:
        server.should_exit = True
        thread.join(10)
    assert [a.rsplit(b"\r\n\r\n", 1)[1] for a in answers] == [
        b'{"ok": true, "path": "/a"}',
        b'{"ok": true, "path": "/b"}',
    ]
    assert joined == answers


def test_gatekeeper_serve_passes_the_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    """``gatekeeper serve`` hands uvicorn :data:`app.api.wire.HTTP`, which names the class."""
    import argparse

    from app import cli, logs
    from app.settings import get_settings

    class Engine:
        def dispose(self) -> None:
            pass

    seen: dict[str, Any] = {}
    monkeypatch.setattr(logs, "configure", lambda level: None)
    monkeypatch.setattr(cli, "_prepare_database", lambda: (get_settings(), Engine()))
    for name in ("_encrypt_legacy_values", "_fold_object_counts", "_collect_states"):
        monkeypatch.setattr(cli, name, lambda engine: None)
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: seen.update(kw))
    args = argparse.Namespace(workers=1, host="127.0.0.1", port=1)
    assert cli.cmd_serve(args) == 0
    assert seen["http"] == wire.HTTP
    module, _, name = wire.HTTP.partition(":")
    assert getattr(__import__(module, fromlist=[name]), name) is OneWriteHttpToolsProtocol
