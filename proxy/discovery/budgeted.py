"""Answers asked of the upstream for a request, awaited within a small budget and remembered for the next ones.

An exact token count helps the request it is asked for only if it comes quickly; when it does not, the request goes
on without it and the answer, once it comes, is kept for the next request that needs the same one. So each answer
is asked at most once at a time, the asking request waits at most `timeout`, no other request waits for it, at most
`MAX_RUNNING` are in flight, and at most `max_entries` answers are kept (the least recently used are forgotten).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Generic, TypeVar

from proxy.discovery.client import cancel
from proxy.discovery.service import MAX_RUNNING
from proxy.engine.bounded import BoundedCache
from proxy.failures import log_failure

logger = logging.getLogger("compaction_proxy.compaction")

V = TypeVar("V")


class Outcome(StrEnum):
    """How asking went, for metrics."""

    CACHED = "cached"
    """Known before: nothing was asked."""
    COUNTED = "counted"
    """Answered within the budget."""
    LATE = "late"
    """Still being asked when the budget ran out (or asked for an earlier request): the answer serves later ones."""
    FAILED = "failed"
    """Asked and not answered, or not asked at all (too many in flight)."""


class BudgetedAnswers(Generic[V]):
    """Remembered answers by key, each asked in the background and awaited within `timeout`.

    :param timeout: Seconds the asking request waits.
    :param max_entries: Answers kept.
    """

    def __init__(self, timeout: float, max_entries: int) -> None:
        self.timeout = timeout
        self._answers: BoundedCache[bytes, V] = BoundedCache(max_entries)
        self._running: dict[bytes, asyncio.Task[None]] = {}

    def known(self, key: bytes) -> V | None:
        """The answer kept for `key`, if any."""
        return self._answers.get(key)

    async def ask(self, key: bytes, asking: Callable[[], Awaitable[V | None]]) -> tuple[V | None, Outcome]:
        """The answer for `key`: kept, or asked with `asking()` and awaited within the budget.

        A request that finds the same answer already being asked does not wait for it.
        """
        answer = self._answers.get(key)
        if answer is not None:
            return answer, Outcome.CACHED
        task = self._running.get(key)
        if task is not None:
            return None, Outcome.LATE
        if len(self._running) >= MAX_RUNNING:
            return None, Outcome.FAILED
        task = asyncio.create_task(self._keep(key, asking))
        self._running[key] = task
        task.add_done_callback(lambda _: self._running.pop(key, None))
        if self.timeout > 0:
            await asyncio.wait({task}, timeout=self.timeout)
        answer = self._answers.get(key)
        if answer is not None:
            return answer, Outcome.COUNTED
        return None, Outcome.FAILED if task.done() else Outcome.LATE

    def running(self) -> list[asyncio.Task[None]]:
        """The answers being asked (for tests and shutdown)."""
        return list(self._running.values())

    async def aclose(self) -> None:
        """Stop asking."""
        await cancel(self.running())

    async def _keep(self, key: bytes, asking: Callable[[], Awaitable[V | None]]) -> None:
        try:
            answer = await asking()
        except Exception as error:
            log_failure(logger, "Asking the upstream for an exact token count failed; counting locally.", error)
            return
        if answer is not None:
            self._answers.put(key, answer)
