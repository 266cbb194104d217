"""A headless Chromium for the dashboard tests, driven by Playwright for Python.

Playwright launches Debian's ``chromium`` through ``executable_path`` (never a downloaded
browser: ``playwright install`` is not run). Script errors, console errors and
Content-Security-Policy violations are collected so a test can check none happened.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from playwright.sync_api import BrowserContext, sync_playwright
from playwright.sync_api import Error as PlaywrightError

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
_RECORD_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolations.push(e.violatedDirective + " " + (e.blockedURI || "inline"));
});
"""


def find_chromium() -> str | None:
    """The path of a Chromium binary (``CHROMIUM`` env var first), or None."""
    given = os.environ.get("CHROMIUM")
    if given:
        return given if Path(given).exists() else None
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


class BrowserError(RuntimeError):
    """A script threw in the page, or a wait timed out."""


class Chromium:
    """One headless Chromium process, for the browsers of a test module (:meth:`browser`).

    Each test gets a browser context of its own (storage, cache and cookies of its own, as a
    fresh profile had them) in the one process: starting Chromium took 2-3 s of each test's
    set-up (more under load), which is not what the tests check.
    """

    def __init__(self, binary: str) -> None:
        self._playwright = sync_playwright().start()
        try:
            self._browser = self._playwright.chromium.launch(
                executable_path=binary,
                headless=True,
                args=["--no-first-run", "--no-default-browser-check"],
            )
        except BaseException:
            self._playwright.stop()
            raise

    def browser(self, width: int = 1280, height: int = 900) -> Browser:
        """A new browser context with one page: nothing of another context's is seen."""
        return Browser(self._browser.new_context(viewport={"width": width, "height": height}))

    def close(self) -> None:
        """Stop the browser."""
        self._browser.close()
        self._playwright.stop()


class Browser:
    """One browser context of a headless Chromium with one page (the interface the dashboard
    tests use); made by :meth:`Chromium.browser`."""

    def __init__(self, context: BrowserContext) -> None:
        self._context = context
        self.page = context.new_page()
        self.page.add_init_script(_RECORD_VIOLATIONS)
        self._seen: list[str] = []
        self.page.on("pageerror", lambda error: self._seen.append(f"exception: {error}"))
        self.page.on("console", self._console)

    def _console(self, message: Any) -> None:
        text = str(message.text)
        if "Content Security Policy" in text or "Content-Security-Policy" in text:
            self._seen.append("csp: " + text)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises are awaited)."""
        try:
            return self.page.evaluate(f"async () => ({expression})")
        except PlaywrightError as exc:
            raise BrowserError(f"script error: {exc.message}") from None

    def wait_for(self, expression: str, timeout: float = 20.0, interval: float = 0.1) -> Any:
        """Evaluate ``expression`` until it is truthy; returns that value."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = self.evaluate(expression)
            if last:
                return last
            time.sleep(interval)
        raise BrowserError(
            f"timed out after {timeout} s waiting for {expression!r} (last: {last!r})"
        )

    def navigate(self, url: str) -> None:
        """Open ``url`` and wait until its document has loaded."""
        self.page.goto(url, wait_until="load")

    def click(self, selector: str) -> None:
        """Click the first element matching a CSS selector (as a script click)."""
        self.evaluate(f"document.querySelector({json.dumps(selector)}).click()")

    def type_into(self, selector: str, text: str) -> None:
        """Focus an input, clear it and type ``text`` as keyboard input."""
        self.page.fill(selector, "")
        self.page.focus(selector)
        self.page.keyboard.insert_text(text)

    def screenshot(self, path: Path) -> Path:
        """Save a PNG of the whole page."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def problems(self) -> list[str]:
        """Uncaught script errors and Content-Security-Policy violations seen so far."""
        found = [f"csp: {v}" for v in self.evaluate("window.__cspViolations || []")]
        return found + list(self._seen)

    def close(self) -> None:
        """Close the context (its page and storage)."""
        self._context.close()
