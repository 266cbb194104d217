"""Structured JSON logs, one object per line, with the request id when there is one.

Nothing logged here ever includes a request body, a header value other than the request id, or
an object's value: the access line carries method, path template, status and duration only.
Fields passed as ``extra=`` reach the JSON line only when they are listed in
:data:`EXTRA_FIELDS`, so a body or value handed to a logger by mistake (here or in a library) is
dropped rather than written; exceptions are logged by their type, a message scrubbed of quoted
literals and numbers (:func:`scrub`; for database errors the driver's first line only, never the
statement or its parameters) and the stack's code locations, never local variables.
``tests/service/test_log_privacy.py`` checks a server's whole log for private values.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import traceback
from datetime import UTC, datetime
from typing import Any

#: The id of the request being served (set by the API middleware).
request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)

#: The ``extra=`` fields written to the JSON line (those of the access line).
EXTRA_FIELDS = ("method", "path", "status", "duration_ms")


class JsonFormatter(logging.Formatter):
    """Format records as JSON with ``time``, ``level``, ``logger``, ``message``, extras."""

    def format(self, record: logging.LogRecord) -> str:
        """One JSON object."""
        body: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        rid = request_id.get()
        if rid is not None:
            body["request_id"] = rid
        fields = vars(record)
        for key in EXTRA_FIELDS:
            if key in fields:
                body[key] = fields[key]
        if record.exc_info and record.exc_info[1] is not None:
            body.update(describe_error(record.exc_info[1]))
        return _ENCODER.encode(body)


#: ``json.dumps(body, default=str)``'s encoder, made once (``dumps`` makes one per call when
#: given ``default``).
_ENCODER = json.JSONEncoder(default=str)


#: Quoted literals and numbers in an error message: where a driver or library quotes input.
_LITERALS = re.compile(r"'[^']*'|\"[^\"]*\"|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def scrub(message: str) -> str:
    r"""The first line of ``message`` with quoted literals and numbers replaced by ``…``.

    Drivers put the statement's input in quotes (``invalid input syntax for type integer:
    "…"``) and in further lines (PostgreSQL's ``DETAIL: Failing row contains (…)``); numbers may
    be values. What remains says what went wrong without any of the data it went wrong on.

    >>> scrub('null value in column "at" violates not-null constraint\nDETAIL: row (1, x)')
    'null value in column … violates not-null constraint'
    >>> scrub("value too long for type character varying(400)")
    'value too long for type character varying(…)'
    """
    first = message.strip().split("\n", 1)[0]
    return _LITERALS.sub("…", first)[:500]


def describe_error(exc: BaseException) -> dict[str, Any]:
    """The log fields of an exception: its type, a scrubbed message and the stack frames.

    A SQLAlchemy ``StatementError`` prints the statement and its parameters; only the driver's
    own message (``exc.orig``) is kept, scrubbed (:func:`scrub`). Frames are ``file:line in
    function`` — code locations, never local variables.
    """
    cause = getattr(exc, "orig", None) or exc
    frames = [
        f"{_short(frame.filename)}:{frame.lineno} in {frame.name}"
        for frame in traceback.extract_tb(exc.__traceback__)
    ]
    kind = type(exc)
    return {
        "error": kind.__name__,
        "error_type": f"{kind.__module__}.{kind.__qualname__}",
        "error_message": scrub(str(cause)),
        "stack": frames[-40:],
    }


def _short(filename: str) -> str:
    """A frame's file relative to ``site-packages`` or the project (no home directories)."""
    for marker in ("site-packages/", "/app/"):
        if marker in filename:
            head = "app/" if marker == "/app/" else ""
            return head + filename.rsplit(marker, 1)[1]
    return filename.rsplit("/", 1)[-1]


def configure(level: str = "INFO") -> None:
    """Send every logger's records to stderr as JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    # our middleware writes the access line; uvicorn's would repeat it unstructured
    logging.getLogger("uvicorn.access").disabled = True
    # Alembic announces each autogenerate plugin at INFO on every start: noise unless debugging
    logging.getLogger("alembic.runtime.plugins").setLevel(
        logging.DEBUG if level.upper() == "DEBUG" else logging.WARNING
    )


def uvicorn_log_config(level: str) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` for uvicorn workers that uses :class:`JsonFormatter`."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "app.logs.JsonFormatter"}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"handlers": ["stderr"], "level": level.upper()},
        "loggers": {
            "uvicorn": {"handlers": [], "propagate": True},
            "uvicorn.error": {"handlers": [], "propagate": True},
            "uvicorn.access": {"handlers": [], "propagate": False, "level": "WARNING"},
        },
    }
