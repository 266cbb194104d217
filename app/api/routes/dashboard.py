"""The dashboard (``/dashboard/``): static HTML, JavaScript and CSS shipped in the package.

The files are public — the data they show comes from the JSON API, which the page calls with
the API key the user types in (docs/dashboard.md). Every file is served with a strict
Content-Security-Policy: scripts, styles and connections from this origin only, no inline
script, no framing. Only the files of ``app/api/static/dashboard`` are served; any other name is
a 404.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse

from app.services.errors import NotFound

router = APIRouter(include_in_schema=False)

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    # small files: always revalidate (ETag), so a new release is picked up at once
    "Cache-Control": "no-cache",
}
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


@dataclass(frozen=True)
class Asset:
    """One static file of the dashboard."""

    body: bytes
    content_type: str
    etag: str


@lru_cache(maxsize=1)
def assets() -> dict[str, Asset]:
    """The dashboard's files by name, read once from the installed package."""
    folder = resources.files("app.api").joinpath("static", "dashboard")
    found = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1] if "." in entry.name else ""
        if entry.is_file() and suffix in CONTENT_TYPES:
            body = entry.read_bytes()
            etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
            found[entry.name] = Asset(body, CONTENT_TYPES[suffix], etag)
    return found


def _serve(name: str, request: Request) -> Response:
    asset = assets().get(name)
    if asset is None:
        raise NotFound("no such dashboard file")
    headers = {**SECURITY_HEADERS, "ETag": asset.etag}
    if request.headers.get("if-none-match") == asset.etag:
        return Response(status_code=304, headers=headers)
    return Response(asset.body, media_type=asset.content_type, headers=headers)


@router.get("/dashboard")
async def dashboard_root() -> RedirectResponse:
    """Redirect to ``/dashboard/`` (relative, so it works behind a path prefix)."""
    return RedirectResponse("dashboard/", status_code=308, headers=SECURITY_HEADERS)


@router.get("/dashboard/")
async def dashboard_page(request: Request) -> Response:
    """The dashboard's page."""
    return _serve("index.html", request)


@router.get("/dashboard/{name}")
async def dashboard_file(name: str, request: Request) -> Response:
    """A script, style sheet or icon of the dashboard."""
    return _serve(name, request)
