"""A headless Chromium driven through the Chrome DevTools Protocol, for the dashboard tests.

Debian's ``chromium`` package is started with ``--remote-debugging-port=0``; the port it picked is
read from ``DevToolsActivePort`` in its profile directory, and the first page is driven over its
websocket (``websockets``' synchronous client). Events are kept so that tests can check that no
script error or Content-Security-Policy violation happened.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

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


class CdpError(RuntimeError):
    """A DevTools command failed, a script threw, or a wait timed out."""


class Browser:
    """One headless Chromium with one page."""

    def __init__(self, binary: str, profile: Path, width: int = 1280, height: int = 900) -> None:
        profile.mkdir(parents=True, exist_ok=True)
        args = [
            binary,
            "--headless=new",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-gpu",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-dev-shm-usage",
            f"--window-size={width},{height}",
        ]
        if os.geteuid() == 0:  # Chromium refuses to sandbox itself as root (CI containers)
            args.append("--no-sandbox")
        args.append("about:blank")
        self._log = open(profile / "chromium.log", "w")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(  # noqa: S603 - a fixed browser command line
            args, stdout=self._log, stderr=subprocess.STDOUT
        )
        self.events: list[dict[str, Any]] = []
        self._next_id = 0
        self._stack = contextlib.ExitStack()
        try:
            port = self._port(profile / "DevToolsActivePort")
            self.ws: ClientConnection = self._stack.enter_context(
                connect(self._page_socket(port), max_size=None)
            )
            for domain in ("Page", "Runtime", "Log"):
                self.send(f"{domain}.enable")
            # DevTools-injected, so not subject to the page's CSP: records its violations
            self.send("Page.addScriptToEvaluateOnNewDocument", {"source": _RECORD_VIOLATIONS})
            self.send(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            )
        except Exception:
            self.close()
            raise

    def _port(self, active: Path, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise CdpError(f"chromium exited with {self.process.returncode}")
            if active.exists():
                lines = active.read_text().splitlines()
                if lines and lines[0].isdigit():
                    return int(lines[0])
            time.sleep(0.1)
        raise CdpError("chromium did not open its DevTools port")

    @staticmethod
    def _page_socket(port: int) -> str:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=5).json()
            pages = [t for t in targets if t.get("type") == "page"]
            if pages:
                return str(pages[0]["webSocketDebuggerUrl"])
            time.sleep(0.1)
        raise CdpError("chromium has no page")

    def send(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30) -> Any:
        """Run one DevTools command and return its result (events that arrive are kept)."""
        self._next_id += 1
        ident = self._next_id
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CdpError(f"{method}: no answer in {timeout} s")
            message = json.loads(self.ws.recv(timeout=remaining))
            if message.get("id") == ident:
                if "error" in message:
                    raise CdpError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises are awaited)."""
        result = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise CdpError(f"script error: {text}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20.0, interval: float = 0.1) -> Any:
        """Evaluate ``expression`` until it is truthy; returns that value."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = self.evaluate(expression)
            if last:
                return last
            time.sleep(interval)
        raise CdpError(f"timed out after {timeout} s waiting for {expression!r} (last: {last!r})")

    def navigate(self, url: str) -> None:
        """Open ``url`` and wait until its document has loaded."""
        self.send("Page.navigate", {"url": url})
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'")

    def click(self, selector: str) -> None:
        """Click the first element matching a CSS selector."""
        self.evaluate(f"document.querySelector({json.dumps(selector)}).click()")

    def type_into(self, selector: str, text: str) -> None:
        """Focus an input, clear it and type ``text`` as keyboard input."""
        self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " e.focus(); e.select(); })()"
        )
        self.send("Input.insertText", {"text": text})

    def screenshot(self, path: Path) -> Path:
        """Save a PNG of the whole page."""
        data = self.send(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}
        )["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def problems(self) -> list[str]:
        """Uncaught script errors and Content-Security-Policy violations seen so far.

        Violations of the current document come from its ``securitypolicyviolation`` events,
        earlier ones (and script errors) from the DevTools events.
        """
        found = [f"csp: {v}" for v in self.evaluate("window.__cspViolations || []")]
        for event in self.events:
            params = event.get("params", {})
            if event["method"] == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                found.append(
                    "exception: "
                    + str(details.get("exception", {}).get("description") or details.get("text"))
                )
            elif event["method"] == "Log.entryAdded":
                text = str(params.get("entry", {}).get("text", ""))
                if "Content Security Policy" in text or "Content-Security-Policy" in text:
                    found.append("csp: " + text)
        return found

    def close(self) -> None:
        """Stop the browser."""
        self._stack.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()
