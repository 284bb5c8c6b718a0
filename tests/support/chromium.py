"""Debian's Chromium, headless, for tests of the pages the proxy serves: the rendered DOM, and screenshots.

No browser is downloaded: `apt-get install chromium` provides it (`.ci/run` installs it). Without it the tests that
need it skip, and the run's end names the command that enables them; with `CI` set a missing browser is a failure.
Every run gets a fresh, empty profile and talks to nothing but loopback (no sync, no updates, no QUIC).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path
from typing import Final

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


async def screenshot(url: str, path: Path, *, width: int = 1280, height: int = 1600, budget_ms: int = 10_000) -> None:
    """A PNG of `url` once its scripts have run, `width` x `height` pixels, written to `path`."""
    binary = chromium_or_skip()
    await _run(
        binary,
        f"--virtual-time-budget={budget_ms}",
        f"--window-size={width},{height}",
        f"--screenshot={path}",
        url,
    )
