"""The ``gatekeeper`` command line: ``loss`` (the calculator) and ``serve``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from app.engine.calculator import compute_loss
from app.engine.errors import InvalidInput, Unsupported


def _read_json(source: str) -> Any:
    if source == "-":
        return json.load(sys.stdin)
    with open(source, encoding="utf-8") as handle:
        return json.load(handle)


def _problem(kind: str, title: str, detail: str, field: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"type": kind, "title": title, "detail": detail}
    if field is not None:
        body["errors"] = [{"field": field, "message": detail}]
    return body


def cmd_loss(args: argparse.Namespace) -> int:
    """Print the calculator's JSON answer for FILE (``-`` for stdin); problems go to stderr."""
    try:
        request = _read_json(args.file)
    except FileNotFoundError:
        print(
            json.dumps(_problem("file-not-found", "File not found", "no such file", None)),
            file=sys.stderr,
        )
        return 2
    except json.JSONDecodeError as exc:
        detail = f"not valid JSON (line {exc.lineno}, column {exc.colno})"
        print(json.dumps(_problem("invalid-json", "Invalid JSON", detail, None)), file=sys.stderr)
        return 2
    try:
        answer = compute_loss(request)
    except InvalidInput as exc:
        print(
            json.dumps(_problem("validation-error", "Invalid input", exc.message, exc.field)),
            file=sys.stderr,
        )
        return 2
    except Unsupported as exc:
        print(
            json.dumps(_problem("unsupported", "Not supported", exc.message, exc.field)),
            file=sys.stderr,
        )
        return 3
    json.dump(answer, sys.stdout, indent=2 if args.pretty else None)
    sys.stdout.write("\n")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Start the HTTP service (not built yet: prints a notice and exits cleanly)."""
    print(
        f"gatekeeper: service not built yet (would listen on {args.host}:{args.port}); "
        "the engine and `gatekeeper loss` are available."
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``gatekeeper`` command."""
    parser = argparse.ArgumentParser(prog="gatekeeper", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    loss = sub.add_parser("loss", help="realized privacy loss of a history (JSON in, JSON out)")
    loss.add_argument("file", help="request JSON file, or - for standard input")
    loss.add_argument("--pretty", action="store_true", help="indent the JSON answer")
    loss.set_defaults(func=cmd_loss)
    serve = sub.add_parser("serve", help="start the HTTP service")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--workers", type=int, default=1)
    serve.set_defaults(func=cmd_serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
