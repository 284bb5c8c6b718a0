"""The last hour of the app's Prometheus registry, one cumulative snapshot a minute, for the dashboard.

Nothing is counted here: the proxy's counters already count everything once. A snapshot copies each counter's total,
each histogram's buckets, sum and count and each gauge's value, of the metric families asked for; the difference
between two snapshots is what happened in between. The ring keeps `points` minutes (each minute's difference is
taken once, when it ends) and the snapshot they start from; the minute in progress is the difference between now and
the newest snapshot, so a figure is never older than the request that reads it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Final

from prometheus_client import CollectorRegistry

Labels = tuple[tuple[str, str], ...]
"""A sample's labels, sorted by name."""

Series = dict[Labels, float]
"""One sample name's series: labels -> value."""

Snapshot = Mapping[str, Series]
"""Kept samples at one moment (or what they gained over a span), by sample name (`compaction_proxy_requests_total`)."""

_KEPT_SUFFIXES: Final = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
"""Which samples of each metric type a snapshot keeps: totals; buckets, sums and counts; values (never `_created`).
A histogram with negative buckets (the estimate error) has no `_sum`: its buckets are all there is."""

STEP_SECONDS: Final = 60.0
POINTS: Final = 60
"""One point a minute over the last hour."""


def snapshot(registry: CollectorRegistry, families: Collection[str] | None = None) -> dict[str, Series]:
    """Copy the registry's counters, histograms and gauges: those of `families` (family names), or all when None."""
    taken: dict[str, Series] = {}
    for family in registry.collect():
        suffixes = _KEPT_SUFFIXES.get(family.type)
        if suffixes is None or (families is not None and family.name not in families):
            continue
        for sample in family.samples:
            if sample.name.removeprefix(family.name) in suffixes:
                taken.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return taken


def difference(later: Snapshot, earlier: Snapshot) -> dict[str, Series]:
    """What each series gained from `earlier` to `later` (a series new since then counts from zero)."""
    gained: dict[str, Series] = {}
    for name, series in later.items():
        before = earlier.get(name, {})
        gained[name] = {labels: value - before.get(labels, 0.0) for labels, value in series.items()}
    return gained


@dataclass(frozen=True)
class Window:
    """The ring read at one moment: what each minute added, and the whole window's total.

    :param ends: When each minute ended (Unix seconds), oldest first; the last is now (the minute in progress).
    :param minutes: What each series gained in each minute, aligned with `ends`.
    :param total: What each series gained over the whole window.
    """

    ends: list[float]
    minutes: list[Snapshot]
    total: Snapshot


class MetricRing:
    """`points` minutes of one registry's metrics at most, and the snapshot the oldest kept minute starts from.

    :param registry: The registry to read.
    :param families: The metric families to keep (family names, as `# TYPE` names them); all when None.
    :param points: Whole minutes kept (the window is `points` minutes, plus the minute in progress).
    :param clock: Wall-clock seconds, for the times the page shows.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        families: Collection[str] | None = None,
        *,
        points: int = POINTS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self.families = None if families is None else frozenset(families)
        self.clock = clock
        self._minutes: deque[tuple[float, Snapshot]] = deque(maxlen=points)
        self._start: Snapshot | None = None
        self._latest: Snapshot = {}

    def __len__(self) -> int:
        """Whole minutes kept."""
        return len(self._minutes)

    def sample(self) -> None:
        """End a minute at now (the first call only starts one); the oldest minute goes when the ring is full."""
        taken = snapshot(self.registry, self.families)
        if self._start is None:
            self._start = taken
        else:
            if len(self._minutes) == self._minutes.maxlen:
                self._start = _added(self._start, self._minutes[0][1])
            self._minutes.append((self.clock(), difference(taken, self._latest)))
        self._latest = taken

    def read(self) -> Window:
        """The kept minutes and the minute in progress, against a snapshot taken now."""
        if self._start is None:
            self.sample()
        assert self._start is not None
        now = snapshot(self.registry, self.families)
        kept = list(self._minutes)
        return Window(
            ends=[*(end for end, _ in kept), self.clock()],
            minutes=[*(minute for _, minute in kept), difference(now, self._latest)],
            total=difference(now, self._start),
        )

    async def run(self, step: float = STEP_SECONDS) -> None:
        """Sample every `step` seconds until cancelled (the app's cleanup cancels it)."""
        while True:
            await asyncio.sleep(step)
            self.sample()


def _added(start: Snapshot, gained: Snapshot) -> dict[str, Series]:
    """`start` moved forward by what was `gained`: the snapshot at the end of the minute that gained it."""
    moved = {name: dict(series) for name, series in start.items()}
    for name, series in gained.items():
        target = moved.setdefault(name, {})
        for labels, value in series.items():
            target[labels] = target.get(labels, 0.0) + value
    return moved
