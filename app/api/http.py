"""uvicorn's httptools protocol, with a response's head and first body part in one socket write.

uvicorn writes the status line and headers when the application sends ``http.response.start``
and the body when it sends ``http.response.body``: two ``transport.write`` calls, two ``sendto``
system calls per answer. In the profile of a single submit through HTTP the head's write was the
event loop's largest own share (docs/benchmarks.md, "h/submit3"). :class:`OneWriteProtocol` is
uvicorn's :class:`~uvicorn.protocols.http.httptools_impl.HttpToolsProtocol` whose request cycles
keep a response's head (unless it is a stream's, chunked) and write it with the first body
part. The bytes on the wire are uvicorn's own, in the same order: its code builds
and checks the head, logs, counts the body against the length, closes a connection that is not
kept alive and completes the response; only the moment the head leaves changes (with the body,
microseconds later). A streamed (chunked) response's head still goes out at once, and if the
body message fails uvicorn's checks the head is written before the error propagates, as before.

``gatekeeper serve`` selects it (``uvicorn.run(http=PROTOCOL)``) when httptools is installed
(uvicorn's ``standard`` extra, which the project depends on).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

if TYPE_CHECKING:
    import asyncio

    from uvicorn._types import ASGISendEvent

#: The import string ``uvicorn.run(http=…)`` takes for :class:`OneWriteProtocol`.
PROTOCOL = "app.api.http:OneWriteProtocol"


class _HeadHeld:
    """A cycle's transport: while :attr:`holding`, writes wait and go out with the next one."""

    __slots__ = ("held", "holding", "transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.held: list[bytes] = []
        self.holding = False

    def write(self, data: bytes) -> None:
        if self.holding:
            self.held.append(data)
        elif self.held:
            self.held.append(data)
            self.flush()
        else:
            self.transport.write(data)

    def flush(self) -> None:
        """Write what is held (one write), and hold no more."""
        self.holding = False
        if self.held:
            data, self.held = b"".join(self.held), []
            self.transport.write(data)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


class OneWriteCycle(RequestResponseCycle):
    """uvicorn's request cycle, holding a response's head until its first body part."""

    transport: _HeadHeld  # type: ignore[assignment]

    async def send(self, message: ASGISendEvent) -> None:
        """The ``send`` of uvicorn, a response's head held (see the class) until its body."""
        starts = not self.response_started and message["type"] == "http.response.start"
        transport = self.transport
        transport.holding = starts
        try:
            await super().send(message)
        finally:
            transport.holding = False
            # a head that is not a stream's (chunked) waits for the body's first part (a HEAD's,
            # which writes no body, goes out as the body message completes it); anything else
            # goes out now: a stream's head, what an error left held
            if not (starts and self.response_started and not self.chunked_encoding):
                transport.flush()


class OneWriteProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol whose request cycles are :class:`OneWriteCycle`."""

    def on_headers_complete(self) -> None:
        """As uvicorn's, then the request's new cycle made a :class:`OneWriteCycle`."""
        before = self.cycle
        super().on_headers_complete()
        cycle = self.cycle
        # the cycle uvicorn just made (its task made, not started): the same object, this class
        if cycle is not before and type(cycle) is RequestResponseCycle:
            cycle.__class__ = OneWriteCycle
            cycle.transport = _HeadHeld(cycle.transport)  # type: ignore[assignment]
