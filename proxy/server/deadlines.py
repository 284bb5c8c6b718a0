"""Time limits of the same length for many concurrent waits, kept on one timer instead of one per wait.

Every request waits for its upstream's answer within `first_byte_timeout`. `asyncio.timeout` around each wait costs
a timeout object and a timer of its own, scheduled and cancelled, per request. All those limits have the same
length, so their deadlines expire in the order the waits began: kept in a dict in that order, the first is always
the next to expire, and one timer, set for it, serves them all. When it fires, every wait past its deadline has its
task cancelled, as `asyncio.timeout` would, and the timer is set for the next deadline. A wait ending removes its
entry: nothing is scheduled or cancelled for it.
"""

from __future__ import annotations

import asyncio


class Deadlines:
    """Waits that may each last `seconds` at most (see the module docstring).

    A wait calls `begin`, then `end` however it ends; a task cancelled by the limit gets `CancelledError`, which
    `end` tells from any other cancellation.

    :param seconds: How long a wait may last.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._waiting: dict[asyncio.Task[object], tuple[float, int]] = {}
        """The tasks waiting, in the order they began: their deadline and how often they had been cancelled then."""
        self._expired: dict[asyncio.Task[object], int] = {}
        """Tasks cancelled by their limit, not yet ended: how often they had been cancelled when they began."""
        self._timer: asyncio.TimerHandle | None = None

    def begin(self) -> asyncio.Task[object]:
        """Start the current task's wait; the task, to pass to `end`."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Deadlines.begin() must be called from within a task")
        loop = task.get_loop()
        deadline = loop.time() + self.seconds
        self._waiting[task] = (deadline, task.cancelling())
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._expire)
        return task

    def end(self, task: asyncio.Task[object], cancelled: bool) -> bool:
        """End `task`'s wait; whether it is over because the limit cancelled it.

        :param cancelled: The wait ended with `CancelledError`. When the limit cancelled it (and nothing else did),
            the cancellation is withdrawn (`Task.uncancel`) and True returned: the caller raises its timeout instead.
        """
        if self._waiting.pop(task, None) is not None:
            return False
        before = self._expired.pop(task, None)
        if before is None:
            return False
        return task.uncancel() <= before and cancelled

    def _expire(self) -> None:
        """Cancel every task waiting past its deadline; set the timer for the next deadline."""
        self._timer = None
        if not self._waiting:
            return
        loop = next(iter(self._waiting)).get_loop()
        now = loop.time()
        for task, (deadline, before) in list(self._waiting.items()):
            if deadline > now:
                self._timer = loop.call_at(deadline, self._expire)
                return
            del self._waiting[task]
            self._expired[task] = before
            task.cancel()
