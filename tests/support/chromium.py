"""Debian's Chromium, headless, for tests of the pages the proxy serves: the rendered DOM, and screenshots.

No browser is downloaded: `apt-get install chromium` provides it (`.ci/run` installs it). Without it the tests that
need it skip, and the run's end names the command that enables them; with `CI` set a missing browser is a failure.
Every run gets a fresh, empty profile and talks to nothing but loopback (no sync, no updates, no QUIC).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import tempfile
from functools import partial
from pathlib import Path
from typing import IO, Any, Final

import pytest

ENABLE: Final = "apt-get install chromium"

FLAGS: Final = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--hide-scrollbars",
)


def chromium_or_skip() -> str:
    """The Chromium executable; skips (fails under CI) when it is not installed."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        reason = f"chromium not installed (Debian's package): {ENABLE}"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}. CI is set: .ci/run installs it")
        pytest.skip(reason)
    return found


async def _run(binary: str, *arguments: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        process = await asyncio.create_subprocess_exec(
            binary,
            *FLAGS,
            f"--user-data-dir={profile}",
            *arguments,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await process.communicate()
    if process.returncode != 0:
        raise AssertionError(f"chromium exited with {process.returncode}: {err.decode(errors='replace')[-2000:]}")
    return out


async def dump_dom(url: str, *, budget_ms: int = 10_000) -> str:
    """The DOM of `url` as rendered once its scripts have run (virtual time: ends when the page goes idle)."""
    binary = chromium_or_skip()
    return (await _run(binary, f"--virtual-time-budget={budget_ms}", "--dump-dom", url)).decode()


async def screenshot(
    url: str, path: Path, *, ready: str, width: int = 1280, height: int = 1600, within: float = 60.0
) -> None:
    """A PNG of `url`, `width` x `height` pixels, written to `path` once the JavaScript expression `ready` holds.

    Driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: commands on fd 3, answers on fd 4, each
    a JSON object ended by a NUL byte), so the picture is taken after the page has drawn what `ready` waits for,
    not when a time budget runs out (which could catch a page still loading its data).
    """
    binary = chromium_or_skip()
    commands_read, commands_write = os.pipe()
    answers_read, answers_write = os.pipe()
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        process = await asyncio.create_subprocess_exec(
            binary,
            *FLAGS,
            f"--user-data-dir={profile}",
            "--remote-debugging-pipe",
            f"--window-size={width},{height}",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            pass_fds=(3, 4),
            preexec_fn=partial(_as_fds_3_and_4, commands_read, answers_write),
        )
        os.close(commands_read)
        os.close(answers_write)
        devtools = _DevTools(os.fdopen(commands_write, "wb", buffering=0), os.fdopen(answers_read, "rb", buffering=0))
        try:
            png = await asyncio.wait_for(asyncio.to_thread(devtools.capture, url, ready, width, height), within)
        finally:
            devtools.close()  # Chromium shuts down, its helper processes with it, when its pipe closes
            try:
                await asyncio.wait_for(process.wait(), within)
            except TimeoutError:
                process.kill()
                await process.wait()
    await asyncio.to_thread(path.write_bytes, png)


def _as_fds_3_and_4(commands: int, answers: int) -> None:
    """In the child: the commands pipe as fd 3 and the answers pipe as fd 4, where Chromium looks for them."""
    commands, answers = os.dup(commands), os.dup(answers)  # out of the way of 3 and 4 first
    os.dup2(commands, 3)
    os.dup2(answers, 4)


class _DevTools:
    """A blocking DevTools protocol client over Chromium's debugging pipe (run in a thread)."""

    def __init__(self, commands: IO[bytes], answers: IO[bytes]) -> None:
        self.commands, self.answers = commands, answers
        self.next_id = 0
        self.buffer = b""
        self.events: list[str] = []
        """The methods of the events received so far, in order (`Page.loadEventFired`, ...)."""

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        """Send one command and return its result (events in between are kept in `events`)."""
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        self.commands.write(json.dumps(message).encode() + b"\0")
        while True:
            answer = self._next(method)
            if answer.get("id") == self.next_id:
                if "error" in answer:
                    raise AssertionError(f"{method}: {answer['error']}")
                return dict(answer["result"])

    def wait_for_event(self, method: str) -> None:
        """Return once an event `method` has arrived (at once when one already had)."""
        while method not in self.events:
            self._next(method)

    def _next(self, waiting_for: str) -> dict[str, Any]:
        """The next message on the pipe; an event's method is noted in `events`."""
        while b"\0" not in self.buffer:
            chunk = self.answers.read(65536)
            if not chunk:
                raise AssertionError(f"chromium closed its debugging pipe waiting for {waiting_for}")
            self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\0", 1)
        message: dict[str, Any] = json.loads(raw)
        if "method" in message:
            self.events.append(message["method"])
        return message

    def capture(self, url: str, ready: str, width: int, height: int) -> bytes:
        """Open `url`, wait for its load event, then until `ready` holds (checked each frame), then take the PNG."""
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call(
            "Emulation.setDeviceMetricsOverride", session, width=width, height=height, deviceScaleFactor=1, mobile=False
        )
        self.call("Page.enable", session)
        self.events.clear()
        self.call("Page.navigate", session, url=url)
        self.wait_for_event("Page.loadEventFired")  # the page's own document: not about:blank's, which it replaces
        waited = f"new Promise(done => {{ const check = () => ({ready}) ? done(true) : requestAnimationFrame(check);"
        waited += " check(); })"
        result = self.call("Runtime.evaluate", session, expression=waited, awaitPromise=True, returnByValue=True)
        if result.get("result", {}).get("value") is not True:
            raise AssertionError(f"the page never got ready ({ready}): {result}")
        shot = self.call("Page.captureScreenshot", session, format="png")
        return base64.b64decode(shot["data"])

    def close(self) -> None:
        self.commands.close()
        self.answers.close()
