"""Which of several ways of asking the upstream to try, and for whom, until one of them has answered.

The proxy may know several ways to ask an upstream something (the exact-count methods of `count_probes`); which one
the upstream serves is found by trying them. Once one answers, it is used for every tenant from then on. Until then,
a method that did not answer waits a back-off (a minute, doubling to an hour) before it is tried again, and the
back-off is the asking tenant's own: a request the upstream refuses for what it holds (a malformed message, a bad
credential) delays only its own tenant's next tries, never another tenant's first count. Since a client can cycle
tenants (credentials), every try before any method answered is a probe run charged to the shared `ProbeBudget`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Final

from proxy.discovery.budget import ProbeBudget, ProbeKind
from proxy.discovery.service import RETRY_SECONDS
from proxy.engine.bounded import BoundedCache
from proxy.windows import MAX_LEARNED

MAX_BACK_OFF: Final = 3600.0
"""The longest wait before a method that never answered is tried again for a tenant."""


def back_off_seconds(failures: int) -> float:
    """How long to wait after `failures` refusals in a row: `RETRY_SECONDS`, doubling, at most `MAX_BACK_OFF`."""
    return min(RETRY_SECONDS * 2.0 ** min(failures - 1, 16), MAX_BACK_OFF)


@dataclass
class _Waiting:
    """A method that has not answered a tenant: when it may be tried again, and how often it failed in a row."""

    due: float
    failures: int


class Trials:
    """The methods to try for a tenant: the one that answered anyone, else those whose back-off has passed.

    :param names: The methods, in the order they are tried.
    :param budget: Charged one run per try while no method has answered; shared with window discovery.
    :param kind: What the tries ask, for the budget's metric.
    """

    def __init__(self, names: list[str], budget: ProbeBudget, kind: ProbeKind) -> None:
        self.names = names
        self.budget = budget
        self.kind = kind
        self.answered: str | None = None
        """The first method that answered: from then on the only one tried, for every tenant."""
        self._waiting: BoundedCache[bytes, dict[str, _Waiting]] = BoundedCache(MAX_LEARNED)

    def usable(self, tenant: bytes) -> list[str]:
        """The method that answered, or else every method whose back-off for this tenant has passed, in order."""
        if self.answered is not None:
            return [self.answered]
        if not self.names:
            return []
        waiting, now = self._waiting.get(tenant) or {}, time.monotonic()
        return [name for name in self.names if name not in waiting or waiting[name].due <= now]

    def admit(self, tenant: bytes) -> bool:
        """Whether a try may go out now: always once a method answered, else within the probe budget."""
        return self.answered is not None or self.budget.admit(tenant, self.kind)

    def succeeded(self, name: str) -> bool:
        """Note that `name` answered; whether it is the first to (so the caller can say so once)."""
        first = self.answered is None
        if first:
            self.answered = name
            self._waiting.clear()
        return first

    def failed(self, name: str, tenant: bytes) -> None:
        """A method that never answered waits a back-off for this tenant; one that did keeps being asked."""
        if self.answered is not None:
            return
        waiting = self._waiting.get(tenant)
        if waiting is None:
            waiting = {}
            self._waiting.put(tenant, waiting)
        failures = waiting[name].failures + 1 if name in waiting else 1
        waiting[name] = _Waiting(time.monotonic() + back_off_seconds(failures), failures)
