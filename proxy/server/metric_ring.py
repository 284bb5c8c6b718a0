"""The last hour of the app's Prometheus registry, one cumulative snapshot a minute, for the dashboard.

Nothing is counted here: the proxy's counters already count everything once. A snapshot copies each counter's total,
each histogram's buckets, sum and count and each gauge's value; the difference between two snapshots is what happened in
between. The ring keeps `points + 1` snapshots (the oldest is the baseline of the first minute) and the minute in
progress is the difference between now and the newest, so a figure is never older than the request that reads it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Final

from prometheus_client import CollectorRegistry

Labels = tuple[tuple[str, str], ...]
"""A sample's labels, sorted by name."""

SeriesKey = tuple[str, Labels]
"""A sample's name (`compaction_proxy_requests_total`) and its labels."""

Snapshot = Mapping[SeriesKey, float]
"""Every kept sample of the registry at one moment."""

_KEPT_SUFFIXES: Final = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
"""Which samples of each metric type a snapshot keeps: totals; buckets, sums and counts; values (never `_created`).
A histogram with negative buckets (the estimate error) has no `_sum`: its buckets are all there is."""

STEP_SECONDS: Final = 60.0
POINTS: Final = 60
"""One point a minute over the last hour."""


def snapshot(registry: CollectorRegistry) -> dict[SeriesKey, float]:
    """Copy the registry's counters, histograms and gauges."""
    taken: dict[SeriesKey, float] = {}
    for family in registry.collect():
        suffixes = _KEPT_SUFFIXES.get(family.type)
        if suffixes is None:
            continue
        for sample in family.samples:
            if sample.name.removeprefix(family.name) in suffixes:
                taken[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return taken


def difference(later: Snapshot, earlier: Snapshot) -> dict[SeriesKey, float]:
    """What each series gained from `earlier` to `later` (a series new since then counts from zero)."""
    return {key: value - earlier.get(key, 0.0) for key, value in later.items()}


@dataclass(frozen=True)
class Window:
    """The ring read at one moment: what each minute added, and the whole window's total.

    :param ends: When each minute ended (Unix seconds), oldest first; the last is now (the minute in progress).
    :param minutes: What each series gained in each minute, aligned with `ends`.
    :param total: What each series gained over the whole window.
    :param latest: Each series' value now (gauges are read from here).
    """

    ends: list[float]
    minutes: list[dict[SeriesKey, float]]
    total: dict[SeriesKey, float]
    latest: dict[SeriesKey, float]


class MetricRing:
    """Bounded snapshots of one registry: `points + 1` of them at most, `step` seconds apart.

    :param registry: The registry to read.
    :param points: Whole minutes kept (the window is `points * step` seconds, plus the minute in progress).
    :param clock: Wall-clock seconds, for the times the page shows.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        points: int = POINTS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self.clock = clock
        self._ring: deque[tuple[float, dict[SeriesKey, float]]] = deque(maxlen=points + 1)

    def __len__(self) -> int:
        return len(self._ring)

    def sample(self) -> None:
        """Keep a snapshot of now; the oldest goes when the ring is full."""
        self._ring.append((self.clock(), snapshot(self.registry)))

    def read(self) -> Window:
        """The kept minutes and the minute in progress, against a snapshot taken now."""
        if not self._ring:
            self.sample()
        now = (self.clock(), snapshot(self.registry))
        taken = [*self._ring, now]
        minutes = [difference(later[1], earlier[1]) for earlier, later in pairwise(taken)]
        return Window(
            ends=[moment for moment, _ in taken[1:]],
            minutes=minutes,
            total=difference(now[1], taken[0][1]),
            latest=now[1],
        )

    async def run(self, step: float = STEP_SECONDS) -> None:
        """Sample every `step` seconds until cancelled (the app's cleanup cancels it)."""
        while True:
            await asyncio.sleep(step)
            self.sample()
