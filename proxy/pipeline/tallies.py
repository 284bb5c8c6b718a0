"""Counters, gauges and histograms counted in plain numbers, and rendered for Prometheus only when it scrapes.

A prometheus_client counter's `inc` checks the metric, takes a lock and adds; a histogram's `observe` takes two. The
proxy counts some fifteen series per request (its status and duration, the decision, the usage, the bill), all on
the event loop's one thread. A tally adds to a dictionary instead: lock-free on the thread that made it (the app is
made on the loop's thread), under a lock from any other (a worker thread's work), so every count is kept. Its
`collect`, which the registry calls for `/metrics` and the dashboard, gives the samples the library's metric would
have given: the same names, labels, HELP and TYPE, buckets, `_created` stamps (the moment a series was first
counted) and order of series (first counted, first shown).

Under several workers, prometheus_client's multiprocess mode, each worker's values must reach the files the pod's
`/metrics` sums (`proxy.server.pod_metrics`), which only the library's values write: `counter`, `gauge` and
`histogram` then make the library's own metric behind the same interface.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from threading import Lock, get_ident
from typing import Final, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, values
from prometheus_client import metrics as library
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import INF, floatToGoString

from proxy.pipeline.labelled import labelled

Labels = tuple[str, ...]
"""A series' label values, in the order the metric names its labels."""

SUFFIXES: Final = {"counter": "_total", "gauge": ""}
"""The sample name's suffix of a counter's value and of a gauge's."""


class Counting(Protocol):
    """A counter or gauge: `add` counts `amount` (a counter's never negative) in the series of `labels`."""

    def add(self, labels: Labels, amount: float = 1.0) -> None:
        """Add `amount` to the series of `labels`."""
        ...


class Observing(Protocol):
    """A histogram: `observe` counts `value` in the series of `labels`."""

    def observe(self, labels: Labels, value: float) -> None:
        """Count `value` in its bucket and in the sum of the series of `labels`."""
        ...


def counter(name: str, documentation: str, labelnames: Sequence[str] = (), *, registry: CollectorRegistry) -> Counting:
    """A counter on `registry`: a `Tally`, or the library's `Counter` when the values go through files."""
    if _shared_through_files():
        return _LibraryCounting(Counter(name, documentation, labelnames, registry=registry))
    return Tally("counter", name, documentation, labelnames, registry)


def gauge(name: str, documentation: str, *, registry: CollectorRegistry) -> Counting:
    """A gauge without labels on `registry`: a `Tally`, or the library's `Gauge`, summed over the workers alive."""
    if _shared_through_files():
        return _LibraryCounting(Gauge(name, documentation, multiprocess_mode="livesum", registry=registry))
    return Tally("gauge", name, documentation, (), registry)


def histogram(
    name: str,
    documentation: str,
    labelnames: Sequence[str] = (),
    *,
    buckets: Sequence[float],
    registry: CollectorRegistry,
) -> Observing:
    """A histogram on `registry`: a `TallyHistogram`, or the library's `Histogram` when the values go through files."""
    if _shared_through_files():
        return _LibraryObserving(Histogram(name, documentation, labelnames, buckets=buckets, registry=registry))
    return TallyHistogram(name, documentation, labelnames, buckets, registry)


def _created_shown() -> bool:
    """Whether the library renders `_created` samples (see `prometheus_client.disable_created_metrics`)."""
    return bool(getattr(library, "_use_created", True))


def _shared_through_files() -> bool:
    """Whether a library metric made now keeps its values in the pod's files (`PodMetrics` switched the class)."""
    return bool(getattr(values.ValueClass, "_multiprocess", False))


class _Series(Collector):
    """What tallies share: their name and labels, their registration, and where each thread's counts go.

    `_own` is written by the thread that made the tally, without a lock; `_others` by every other thread, under
    `_lock`. `_created` holds each series' first count time, in the order series were first counted.
    """

    kind = "counter"
    """The metric's TYPE."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._owner = get_ident()
        self._lock = Lock()
        self._created: dict[Labels, float] = {}
        if not self.labelnames:
            self._created[()] = time.time()  # an unlabelled metric has its one series from the start, as the library's
        registry.register(self)

    def _new(self, labels: Labels) -> None:
        """Note a series counted for the first time (checked here, once: it is never checked again)."""
        if len(labels) != len(self.labelnames) or not all(isinstance(value, str) for value in labels):
            raise ValueError(f"{self.name} takes {len(self.labelnames)} label values (strings), not {labels!r}")
        self._created.setdefault(labels, time.time())

    def describe(self) -> Iterable[Metric]:
        """The metric's name and type, without samples: what the registry checks for duplicate names."""
        return [Metric(self.name, self.documentation, self.kind)]

    def _labelled(self, labels: Labels) -> dict[str, str]:
        return dict(zip(self.labelnames, labels, strict=True))


class Tally(_Series):
    """A counter (or a gauge) kept as plain numbers; see the module's docstring.

    :param kind: `counter` or `gauge` (no `_created` sample, may go down).
    """

    def __init__(
        self, kind: str, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self.kind = kind
        self._least = 0.0 if kind == "counter" else -INF
        """The least amount `add` takes: a counter never goes down."""
        self._own: dict[Labels, float] = {}
        self._others: dict[Labels, float] = {}
        super().__init__(name, documentation, labelnames, registry)

    def add(self, labels: Labels, amount: float = 1.0) -> None:
        """Add `amount` to the series of `labels`; a ValueError for a negative one to a counter, as the library's."""
        if amount < self._least:
            raise ValueError(f"{self.name} is a counter: it cannot go down by {amount}")
        if get_ident() == self._owner:
            try:
                self._own[labels] += amount
            except KeyError:
                self._new(labels)
                self._own[labels] = 0.0 + amount
            return
        with self._lock:
            if labels not in self._others:
                self._new(labels)
            self._others[labels] = self._others.get(labels, 0.0) + amount

    def collect(self) -> Iterable[Metric]:
        """The metric with one sample per series (and its `_created`, for a counter), as the library renders it."""
        metric = Metric(self.name, self.documentation, self.kind)
        own = self._own.copy()
        with self._lock:
            others = self._others.copy()
        stamped = self.kind == "counter" and _created_shown()
        for labels, created in self._created.copy().items():
            named = self._labelled(labels)
            metric.add_sample(self.name + SUFFIXES[self.kind], named, own.get(labels, 0.0) + others.get(labels, 0.0))
            if stamped:
                metric.add_sample(self.name + "_created", named, created)
        return [metric]


class TallyHistogram(_Series):
    """A histogram kept as plain numbers; see the module's docstring.

    A series is a list: the sum of the values counted, then the count in each bucket (not cumulative).
    """

    kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        bounds = [float(bound) for bound in buckets]
        self.bounds = bounds if bounds[-1] == INF else [*bounds, INF]
        self.le = [floatToGoString(bound) for bound in self.bounds]  # type: ignore[no-untyped-call]
        """The buckets' `le` labels, as the library writes them."""
        self._own: dict[Labels, list[float]] = {}
        self._others: dict[Labels, list[float]] = {}
        super().__init__(name, documentation, labelnames, registry)

    def observe(self, labels: Labels, value: float) -> None:
        """Count `value` in the first bucket whose bound is at least `value`, and in the sum."""
        if get_ident() == self._owner:
            self._counted(self._own, labels, value)
            return
        with self._lock:
            self._counted(self._others, labels, value)

    def _counted(self, series: dict[Labels, list[float]], labels: Labels, value: float) -> None:
        try:
            counts = series[labels]
        except KeyError:
            self._new(labels)
            counts = series[labels] = [0.0] * (len(self.bounds) + 1)
        counts[0] += value
        if value <= INF:  # NaN falls in no bucket, as the library's
            counts[bisect_left(self.bounds, value) + 1] += 1

    def collect(self) -> Iterable[Metric]:
        """The metric with its buckets (cumulative), count, sum and `_created` per series, as the library renders it."""
        metric = Metric(self.name, self.documentation, self.kind)
        own = {labels: counts.copy() for labels, counts in self._own.copy().items()}
        with self._lock:
            others = {labels: counts.copy() for labels, counts in self._others.items()}
        for labels, created in self._created.copy().items():
            named = self._labelled(labels)
            counts = _summed(own.get(labels), others.get(labels), len(self.bounds) + 1)
            total = 0.0
            for le, count in zip(self.le, counts[1:], strict=True):
                total += count
                metric.add_sample(self.name + "_bucket", {**named, "le": le}, total)
            metric.add_sample(self.name + "_count", named, total)
            if self.bounds[0] >= 0:
                metric.add_sample(self.name + "_sum", named, counts[0])
            if _created_shown():
                metric.add_sample(self.name + "_created", named, created)
        return [metric]


def _summed(first: list[float] | None, second: list[float] | None, size: int) -> list[float]:
    """Two threads' counts of one series, added up (either may have none)."""
    if first is None or second is None:
        return first or second or [0.0] * size
    return [one + other for one, other in zip(first, second, strict=True)]


class _LibraryCounting:
    """A library counter or gauge behind `Counting` (multiprocess mode)."""

    def __init__(self, metric: Counter | Gauge) -> None:
        self.metric = metric

    def add(self, labels: Labels, amount: float = 1.0) -> None:
        """`metric.labels(*labels).inc(amount)` (the metric itself when it has no labels)."""
        (labelled(self.metric, *labels) if labels else self.metric).inc(amount)


class _LibraryObserving:
    """A library histogram behind `Observing` (multiprocess mode)."""

    def __init__(self, metric: Histogram) -> None:
        self.metric = metric

    def observe(self, labels: Labels, value: float) -> None:
        """`metric.labels(*labels).observe(value)` (the metric itself when it has no labels)."""
        (labelled(self.metric, *labels) if labels else self.metric).observe(value)
