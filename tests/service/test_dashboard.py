"""The dashboard's files and headers, and ``GET /v1/whoami`` (in-process, SQLite and PostgreSQL).

The page, its scripts and styles are public and served with a strict Content-Security-Policy;
what they show needs a key, which ``/v1/whoami`` checks. The browser itself runs in
``test_dashboard_browser.py``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.api.routes.dashboard import CONTENT_SECURITY_POLICY, assets
from tests.service.conftest import ADMIN_KEY, ROOT, auth

PROBLEM = "application/problem+json"
STATIC = ROOT / "app" / "api" / "static" / "dashboard"
EXPECTED_POLICY = {
    "default-src": "'self'",
    "script-src": "'self'",
    "style-src": "'self'",
    "img-src": "'self'",
    "connect-src": "'self'",
    "object-src": "'none'",
    "base-uri": "'none'",
    "form-action": "'none'",
    "frame-ancestors": "'none'",
}


def policy(header: str) -> dict[str, str]:
    return dict(part.strip().split(" ", 1) for part in header.split(";"))


def test_the_page_is_public_and_strictly_confined(client: TestClient) -> None:
    r = client.get("/dashboard/")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/html; charset=utf-8"
    assert policy(r.headers["content-security-policy"]) == EXPECTED_POLICY
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["referrer-policy"] == "no-referrer"
    assert "<title>" in r.text


def test_without_the_slash_redirects_relative_to_the_mount(client: TestClient) -> None:
    r = client.get("/dashboard", follow_redirects=False)
    assert r.status_code == 308
    assert r.headers["location"] == "dashboard/"
    assert client.get("/dashboard").url.path == "/dashboard/"


def _references(name: str, text: str) -> set[str]:
    """Files a page or script loads: src/href attributes and ES module imports."""
    if name.endswith(".html"):
        found = set(re.findall(r'(?:src|href)="([^"#:]+)"', text))
    elif name.endswith(".js"):
        found = set(re.findall(r'from\s+"\./([^"]+)"', text))
    else:
        found = set()
    return {f for f in found if not f.startswith("#")}


def test_every_file_the_page_loads_is_served_with_its_type_and_the_policy(
    client: TestClient,
) -> None:
    types = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
    seen: set[str] = set()
    todo = ["index.html"]
    while todo:
        name = todo.pop()
        seen.add(name)
        r = client.get("/dashboard/" if name == "index.html" else f"/dashboard/{name}")
        assert r.status_code == 200, name
        assert r.headers["content-security-policy"] == CONTENT_SECURITY_POLICY, name
        if name != "index.html":
            assert r.headers["content-type"].startswith(types[Path(name).suffix]), name
        todo.extend(_references(name, r.text) - seen - set(todo))
    # every shipped file is used, and every used file is shipped
    assert seen == {p.name for p in STATIC.iterdir()}
    assert {
        "app.js",
        "api.js",
        "filter.js",
        "chart.js",
        "reading.js",
        "labels.js",
        "surveys.js",
        "estimate.js",
        "dashboard.css",
    } <= seen


def test_no_inline_script_style_or_handler_in_the_page() -> None:
    html = (STATIC / "index.html").read_text()
    for tag in re.findall(r"<script\b[^>]*>", html):
        assert 'src="' in tag
    assert re.findall(r"<script\b[^>]*>([^<]+)</script>", html) == []
    assert "<style" not in html
    assert not re.search(r"\sstyle=", html)
    assert not re.search(r"\son[a-z]+=", html)
    # the scripts build the page from data with textContent, never by parsing HTML
    for script in STATIC.glob("*.js"):
        text = script.read_text()
        assert "innerHTML" not in text, script.name
        assert "eval(" not in text, script.name


def test_unknown_and_sneaky_names_are_404(client: TestClient) -> None:
    for path in (
        "/dashboard/nope.js",
        "/dashboard/..%2Fmain.py",
        "/dashboard/%2e%2e%2fmain.py",
        "/dashboard/..%2F..%2Fsettings.py",
        "/dashboard/index.html%00.js",
    ):
        r = client.get(path)
        assert r.status_code == 404, path
        assert r.headers["content-type"].startswith(PROBLEM)


def test_unchanged_files_revalidate_with_their_etag(client: TestClient) -> None:
    first = client.get("/dashboard/app.js")
    assert first.headers["cache-control"] == "no-cache"
    etag = first.headers["etag"]
    again = client.get("/dashboard/app.js", headers={"If-None-Match": etag})
    assert again.status_code == 304
    assert again.content == b""
    assert again.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    other = client.get("/dashboard/api.js", headers={"If-None-Match": etag})
    assert other.status_code == 200


def test_the_served_files_are_the_package_files(client: TestClient) -> None:
    for name, asset in assets().items():
        assert asset.body == (STATIC / name).read_bytes()
        assert client.get(f"/dashboard/{name}").content == asset.body


@pytest.mark.parametrize("role", ["admin", "analyst", "viewer"])
def test_whoami_names_the_key_and_its_role(client: TestClient, role: str) -> None:
    created = client.post("/v1/keys", headers=auth(ADMIN_KEY), json={"role": role}).json()
    r = client.get("/v1/whoami", headers=auth(created["key"]))
    assert r.status_code == 200
    assert r.json() == {"key_id": created["id"], "role": role, "project": None}  # unscoped
    assert created["key"][:10] not in r.text  # not even the stored prefix of the secret


@pytest.mark.parametrize("headers", [{}, auth("gk_no-such-key"), {"Authorization": "Basic eDp5"}])
def test_whoami_without_a_valid_key_is_401(client: TestClient, headers: dict[str, str]) -> None:
    r = client.get("/v1/whoami", headers=headers)
    assert r.status_code == 401
    assert r.headers["content-type"].startswith(PROBLEM)
    assert r.headers["www-authenticate"].lower().startswith("bearer")


def test_whoami_after_revocation_is_401(client: TestClient) -> None:
    created = client.post("/v1/keys", headers=auth(ADMIN_KEY), json={"role": "viewer"}).json()
    assert client.get("/v1/whoami", headers=auth(created["key"])).status_code == 200
    assert client.delete(f"/v1/keys/{created['id']}", headers=auth(ADMIN_KEY)).status_code == 200
    assert client.get("/v1/whoami", headers=auth(created["key"])).status_code == 401


def test_a_package_build_ships_the_dashboard(tmp_path: Path) -> None:
    """A non-editable install gets the files.

    setuptools' ``build_py`` (the step that fills a wheel with the packages and their data) is
    run on a copy of the project, outside any VCS checkout.
    """
    pytest.importorskip("setuptools")
    source = tmp_path / "src"
    shutil.copytree(ROOT / "app", source / "app", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    out = tmp_path / "build"
    done = subprocess.run(  # noqa: S603 - our interpreter, a fixed script
        [
            sys.executable,
            "-c",
            "from setuptools import setup; setup()",
            "-q",
            "build_py",
            "-d",
            str(out),
        ],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    shipped = {p.name for p in (out / "app" / "api" / "static" / "dashboard").iterdir()}
    assert shipped == {p.name for p in STATIC.iterdir()}
