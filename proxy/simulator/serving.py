"""Serving a simulated upstream in the foreground until SIGINT or SIGTERM, as `compaction-proxy simulate` does."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable

from proxy.simulator.scripted import ScriptedServer

__all__ = ["cannot_listen", "serve_until_signalled", "until_signalled"]


async def until_signalled() -> None:
    """Return on the first SIGINT (Ctrl-C) or SIGTERM, which then no longer stop the process by themselves."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


async def serve_until_signalled(server: ScriptedServer, announce: Callable[[str], None]) -> None:
    """Start `server`, call `announce` with its base URL once it listens, and stop it on SIGINT or SIGTERM."""
    async with server:
        announce(server.base_url)
        await until_signalled()


def cannot_listen(host: str, port: int, error: OSError) -> str:
    """The one line saying an address could not be bound, and what to do."""
    reason = os.strerror(error.errno).lower() if error.errno else str(error)
    return f"cannot listen on {host}:{port}: {reason}; pick another port with --port (0: a free one)"
