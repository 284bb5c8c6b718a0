"""Serving a simulated upstream in the foreground until SIGINT or SIGTERM, as `compaction-proxy simulate` does."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from proxy.simulator.scripted import ScriptedServer

__all__ = ["serve_until_signalled"]


async def serve_until_signalled(server: ScriptedServer, announce: Callable[[str], None]) -> None:
    """Start `server`, call `announce` with its base URL once it listens, and stop it on SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with server:
        announce(server.base_url)
        await stop.wait()
