"""A response's head and first body part in one write to the socket: uvicorn's HTTP protocol.

uvicorn (``httptools``, checked on 0.54) writes an answer's status line and headers
(``http.response.start``) and its body (``http.response.body``) with two ``transport.write``
calls, and uvloop's transport writes each at once: two ``write`` syscalls and, with
``TCP_NODELAY``, two TCP segments for every small answer (a submit's is ≈ 500 bytes) — a second
syscall on the server and a second wake-up of the client. :class:`OneWriteHttpToolsProtocol` is
uvicorn's own protocol given a transport (:class:`HeadHeldTransport`) that holds a response's
head back until the next write, which normally comes in the same turn of the event loop (the
body: Starlette's ``Response`` sends both without yielding), and then writes both as one. If
nothing follows in that turn (a streaming response whose first part is not ready), the head is
written on the loop's next turn (``call_soon``): a streamed answer's head is never kept waiting
for its body. ``close`` and ``write_eof`` write a held head first; ``abort`` drops it with the
connection. Nothing else changes: the bytes on the wire, their order, chunked encoding, ``HEAD``,
keep-alive, pipelining and flow control are uvicorn's (the transport under the wrapper pauses
and resumes the protocol as before).

It depends on uvicorn's public configuration only — a protocol class passed as ``http=``
(:data:`HTTP`, what ``gatekeeper serve`` passes) — and on the asyncio ``Protocol`` and
``Transport`` interfaces: ``connection_made`` receives the wrapper instead of the socket's
transport. What it assumes of uvicorn (a head is one ``write`` starting ``HTTP/1.1`` and the
body's first part is the next write of the connection) is checked by
``tests/service/test_one_write.py`` against the installed uvicorn; if it stops holding, the
answers stay correct (any write is only ever delayed to the loop's next turn, in order) and the
test fails.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

#: The ``http=`` value of ``gatekeeper serve``'s uvicorn (an import string: workers load it).
HTTP = "app.api.wire:OneWriteHttpToolsProtocol"

#: A head is joined to the next write by copying both when that write is at most this long,
#: else both are handed over as a list (``writelines``: a ``writev`` on uvloop, no copy).
_JOIN_BELOW = 64 * 1024


class HeadHeldTransport(asyncio.Transport):
    """A connection's transport that writes a response's head together with what follows it.

    A write that is a response's head (``HTTP/1.1 `` and not an interim ``1xx``) is held, and
    the next write of the connection is sent with it; a head nothing follows in the same turn
    of the loop is sent on the next. Every other method is the wrapped transport's.
    """

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    # writing
    def write(self, data: bytes | bytearray | memoryview) -> None:  # type: ignore[override]
        """Write ``data`` after any held head; hold it if it is a response's head."""
        held = self._held
        if held is not None:
            self._held = None
            if len(data) <= _JOIN_BELOW:
                self._transport.write(held + bytes(data))
            else:
                self._transport.writelines((held, data))
        elif data[:9] == b"HTTP/1.1 " and data[9:10] != b"1":
            self._held = bytes(data)
            self._loop.call_soon(self._flush)
        else:
            self._transport.write(data)

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:  # type: ignore[override]
        """Write the parts after any held head (nothing of them is held)."""
        self._flush()
        self._transport.writelines(list_of_data)

    def _flush(self) -> None:
        """Write a held head on its own (nothing followed it in its turn of the loop)."""
        held = self._held
        if held is not None:
            self._held = None
            if not self._transport.is_closing():
                self._transport.write(held)

    def write_eof(self) -> None:
        """End the writing side after any held head."""
        self._flush()
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        """The wrapped transport's answer."""
        return self._transport.can_write_eof()

    def close(self) -> None:
        """Close after any held head is written (the transport sends what it buffered)."""
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        """Close at once: a held head is dropped with everything the transport buffered."""
        self._held = None
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        """Bytes waiting to be written: the transport's and a held head's."""
        held = self._held
        return self._transport.get_write_buffer_size() + (len(held) if held else 0)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        """The wrapped transport's limits."""
        return self._transport.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        """Set the wrapped transport's limits."""
        self._transport.set_write_buffer_limits(high, low)

    # the rest: the wrapped transport's
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """The wrapped transport's extra information (socket, peer name, SSL)."""
        return self._transport.get_extra_info(name, default)

    def is_closing(self) -> bool:
        """Whether the wrapped transport is closing."""
        return self._transport.is_closing()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        """Hand the wrapped transport's events to ``protocol`` (a WebSocket upgrade)."""
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        """The protocol receiving the wrapped transport's events."""
        return self._transport.get_protocol()

    def is_reading(self) -> bool:
        """Whether the wrapped transport is reading."""
        return self._transport.is_reading()

    def pause_reading(self) -> None:
        """Pause the wrapped transport's reading."""
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        """Resume the wrapped transport's reading."""
        self._transport.resume_reading()


class OneWriteHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's ``httptools`` protocol on a :class:`HeadHeldTransport` (module docstring)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        """Take the connection with its transport wrapped."""
        # a TCP server's stream transport (uvloop's is not a subclass of asyncio.Transport)
        super().connection_made(HeadHeldTransport(cast(asyncio.Transport, transport), self.loop))
