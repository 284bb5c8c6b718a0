"""Running a benchmark's own loopback server process: listen, announce the URL, serve until signalled."""

from __future__ import annotations

import asyncio
import signal

from aiohttp import web


async def serve_until_signalled(app: web.Application, host: str, port: int) -> None:
    """Serve `app` on `host:port` (0 picks a free port), print its base URL on stdout, stop on SIGTERM/SIGINT."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        site = web.TCPSite(runner, host, port, backlog=1024)
        await site.start()
        print(f"http://{host}:{runner.addresses[0][1]}", flush=True)
        await stop.wait()
    finally:
        await runner.cleanup()
