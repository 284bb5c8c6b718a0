"""The probe budget: how often the upstream may be asked things it may not serve, per tenant and over all tenants.

A probe run asks the upstream about something a client named: a window discovery run about a model (five to seven
requests), or an exact count by a method that has never answered. Each is cheap once, but a client sending ever new
model names, or ever new credentials, would start one per request and multiply its request rate to the upstream. So
at most `probe_runs_per_tenant_per_minute` runs start per tenant and `probe_runs_per_minute` over all tenants in each
minute; a request past either is served with what is known (an unknown window, a local count), never made to wait,
and the refusal is counted.

The minute is a fixed window, not a sliding one: at most twice a bound can start across the turn of a minute, which is
still a bound, and keeps the bookkeeping to one counter per tenant that started a run this minute.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import StrEnum
from typing import Final

from proxy.config import Settings

INTERVAL_SECONDS: Final = 60.0
"""The interval the budget is counted over."""


class ProbeKind(StrEnum):
    """What a probe run asks, for metrics."""

    WINDOW = "window"
    """A window discovery run for a model."""
    COUNT = "count"
    """An exact count by a method that has not answered yet."""


class Bound(StrEnum):
    """Which bound refused a run, for metrics."""

    TENANT = "tenant"
    OVERALL = "overall"


def _ignore(kind: ProbeKind, bound: Bound) -> None:
    """No refusal counter: nothing is counted."""


class ProbeBudget:
    """Admits probe runs while the tenant and all tenants together are within their runs for the current minute.

    :param per_tenant: Runs one tenant may start per minute.
    :param overall: Runs all tenants together may start per minute.
    :param refused: Called with what was refused and by which bound (the metric), each time a run is refused.
    :param clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        per_tenant: int,
        overall: int,
        refused: Callable[[ProbeKind, Bound], None] = _ignore,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_tenant = per_tenant
        self.overall = overall
        self.refused = refused
        self._clock = clock
        self._ends = 0.0
        self._total = 0
        self._tenants: dict[bytes, int] = {}
        """Runs started this minute by each tenant that started one: at most `overall` entries."""

    @classmethod
    def of(cls, settings: Settings, refused: Callable[[ProbeKind, Bound], None] = _ignore) -> ProbeBudget:
        """The budget `probe_runs_per_tenant_per_minute` and `probe_runs_per_minute` set."""
        return cls(settings.probe_runs_per_tenant_per_minute, settings.probe_runs_per_minute, refused)

    def admit(self, tenant: bytes, kind: ProbeKind) -> bool:
        """Whether `tenant` may start a run of `kind` now; an admitted run is charged at once."""
        now = self._clock()
        if now >= self._ends:
            self._ends, self._total = now + INTERVAL_SECONDS, 0
            self._tenants.clear()
        started = self._tenants.get(tenant, 0)
        bound = Bound.OVERALL if self._total >= self.overall else Bound.TENANT if started >= self.per_tenant else None
        if bound is not None:
            self.refused(kind, bound)
            return False
        self._total += 1
        self._tenants[tenant] = started + 1
        return True
