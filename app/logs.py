"""Structured JSON logs, one object per line, with the request id when there is one.

Nothing logged here ever includes a request body, a header value other than the request id, or
an object's value: the access line carries method, path template, status and duration only.
Fields passed as ``extra=`` reach the JSON line only when they are listed in
:data:`EXTRA_FIELDS`, so a body or value handed to a logger by mistake (here or in a library) is
dropped rather than written; exceptions are logged by their type name, without message or
traceback (which can quote the input that caused them).
``tests/service/test_log_privacy.py`` checks a server's whole log for private values.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
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
        if record.exc_info and record.exc_info[0] is not None:
            body["error"] = record.exc_info[0].__name__
        return json.dumps(body, default=str)


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
