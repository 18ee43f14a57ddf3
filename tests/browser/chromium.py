"""Headless Chromium (Debian's `chromium`, installed by tests/browser/install-chromium.sh,
which `make test` runs), driven over the Chrome DevTools Protocol: a websocket,
through tornado's client (Flower's dependency, already pinned).

A real browser, so a test sees what a person would: the DOM after the browser
parsed and rendered the page, cookies as the browser keeps them (HttpOnly,
SameSite), form posts and redirects as the browser makes them, a screenshot.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import requests
from tornado.websocket import WebSocketClientConnection, websocket_connect

from tests.conftest import stop_process
from tests.support import process_started, wait_until

INSTALL = "tests/browser/install-chromium.sh"
FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions", "--mute-audio",
    "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
    "--remote-allow-origins=*",
)  # fmt: skip


def executable() -> str:
    path = shutil.which("chromium")
    assert path, f"chromium is not installed: run `make test`, or {INSTALL} as root"
    return path


class Browser:
    """One headless Chromium with a fresh profile and one page (tab)."""

    def __init__(self, profile: Path, width: int = 1280, height: int = 900) -> None:
        self.log = (profile.parent / f"{profile.name}.log").open("wb")
        self.proc = subprocess.Popen(
            [executable(), *FLAGS, f"--user-data-dir={profile}",
             f"--window-size={width},{height}", "about:blank"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        process_started()
        self.loop = asyncio.new_event_loop()
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        port = self._devtools_port(profile / "DevToolsActivePort")
        pages = requests.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        url = next(p["webSocketDebuggerUrl"] for p in pages if p["type"] == "page")
        self.ws: WebSocketClientConnection = self.loop.run_until_complete(_connect(url))
        self.send("Page.enable")
        self.send("Network.enable")

    def _devtools_port(self, path: Path, timeout: float = 60) -> int:
        def written() -> bool:
            assert self.proc.poll() is None, f"chromium exited with {self.proc.returncode}"
            return path.exists() and bool(path.read_text().strip())

        wait_until(written, "chromium to open its DevTools port", timeout, interval=0.1)
        return int(path.read_text().split()[0])

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """One command; the events that arrive meanwhile are kept for `wait_for`."""
        return self.loop.run_until_complete(asyncio.wait_for(self._send(method, params), 60))

    async def _send(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        number = next(self.ids)
        await self.ws.write_message(json.dumps({"id": number, "method": method, "params": params}))
        while True:
            message = await self.ws.read_message()
            assert isinstance(message, str), "the DevTools connection closed"
            data: dict[str, Any] = json.loads(message)
            if data.get("id") == number:
                assert "error" not in data, f"{method}: {data['error']}"
                result: dict[str, Any] = data["result"]
                return result
            self.events.append(data)

    def wait_for(self, event: str, timeout: float = 30) -> dict[str, Any]:
        return self.loop.run_until_complete(asyncio.wait_for(self._wait_for(event), timeout))

    async def _wait_for(self, event: str) -> dict[str, Any]:
        while True:
            for i, data in enumerate(self.events):
                if data.get("method") == event:
                    del self.events[: i + 1]
                    return data
            self.events.clear()
            message = await self.ws.read_message()
            assert isinstance(message, str), "the DevTools connection closed"
            self.events.append(json.loads(message))

    def open(self, url: str) -> None:
        """Go to `url` and wait until the page (and whatever it redirected to) loaded."""
        self.events.clear()
        navigated = self.send("Page.navigate", url=url)
        assert "errorText" not in navigated, navigated
        self.wait_for("Page.loadEventFired")

    def run(self, expression: str) -> Any:
        """Evaluate JavaScript in the page; its JSON-able value."""
        answer = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in answer, answer["exceptionDetails"]
        return answer["result"].get("value")

    def click_and_load(self, selector: str) -> None:
        """Click (as a person would: a real submit, then its redirect) and wait for the page."""
        self.events.clear()
        self.run(f"document.querySelector({json.dumps(selector)}).click()")
        self.wait_for("Page.loadEventFired")

    def dom(self) -> str:
        html: str = self.run("document.documentElement.outerHTML")
        return html

    def cookies(self, url: str) -> list[dict[str, Any]]:
        cookies: list[dict[str, Any]] = self.send("Network.getCookies", urls=[url])["cookies"]
        return cookies

    def screenshot(self, path: Path) -> None:
        """The whole page, at the window's width."""
        size = self.send("Page.getLayoutMetrics")["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = self.send("Page.captureScreenshot", format="png", clip=clip,
                         captureBeyondViewport=True)  # fmt: skip
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            stop_process(self.proc, 20)
            self.loop.close()
            self.log.close()


async def _connect(url: str) -> WebSocketClientConnection:
    # Inside the loop's own task, so tornado binds the connection to that loop.
    return await websocket_connect(url, max_message_size=256 * 1024 * 1024)
