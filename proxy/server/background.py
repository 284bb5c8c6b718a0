"""Work an app runs beside its requests for as long as it serves: started at startup, cancelled at cleanup."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import Any


@contextlib.asynccontextmanager
async def running(work: Awaitable[Any]) -> AsyncIterator[None]:
    """Run `work` as a task while the block runs, then cancel it and wait for it to end.

    Work handed to a thread (`asyncio.to_thread`) cannot be stopped: the thread finishes on its own, unwaited for.
    """
    task = asyncio.ensure_future(work)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
