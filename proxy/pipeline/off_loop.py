"""Running a large request's CPU work (parsing, hashing, counting, compacting) off the event loop.

A small request's work takes less time than a hop to a thread, so it runs inline. A large one would hold the loop
for as long as it takes, stalling every other request and the health checks; it runs on a small pool of worker
threads instead, so the loop keeps serving while it is parsed, hashed and counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Final, TypeVar

T = TypeVar("T")

OFF_LOOP_BYTES: Final = 256 * 1024
"""Bodies at least this large have their work done on a worker thread (a 256 KiB body parses in about 1 ms)."""

WORKER_THREADS: Final = 2
"""Threads for large requests' work: Python work holds the GIL, so more threads would not go faster."""


class OffLoop:
    """Runs functions inline for small requests and on worker threads for large ones.

    :param threshold: The body size from which work leaves the event loop.
    """

    def __init__(self, threshold: int = OFF_LOOP_BYTES) -> None:
        self.threshold = threshold
        self._pool: ThreadPoolExecutor | None = None

    def inline(self, size: int) -> bool:
        """Whether the work of a request of `size` bytes runs on the event loop (`run` calls it right there)."""
        return size < self.threshold

    async def run(self, size: int, work: Callable[[], T]) -> T:
        """`work()`, on a worker thread when `size` (the request body's bytes) reaches the threshold."""
        if self.inline(size):
            return work()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=WORKER_THREADS, thread_name_prefix="compaction-work")
        return await asyncio.get_running_loop().run_in_executor(self._pool, work)

    def close(self) -> None:
        """Let running work finish and release the threads."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
