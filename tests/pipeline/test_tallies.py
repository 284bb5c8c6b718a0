"""A tally renders what prometheus_client's own metric renders for the same counts, to the byte.

`/metrics`, the dashboard and every alert read these series: moving a metric from the library's counter to a tally
must change nothing they see. Each test counts the same operations into both, on two registries, and compares the
exposition text; only the `_created` stamps (the moment a series was first counted) differ by the time between
the two, so their values are compared to the moment of the count instead.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import metrics as library

from proxy.pipeline.tallies import Tally, TallyHistogram, counter
from tests.support.examples import examples

CREATED = re.compile(rb"^(\S+_created(?:\{[^}]*\})?) (\S+)$", re.MULTILINE)

label_sets = st.tuples(st.sampled_from(["chat", "responses", 'weird "\\ label\n']), st.sampled_from(["200", "499"]))
amounts = st.integers(0, 10**12) | st.floats(0, 1e9, allow_nan=False)
values = st.floats(allow_nan=True) | st.sampled_from([0.0, 0.005, 0.01, 1.0, 600.0, float("inf"), float("-inf")])
routes = st.sampled_from([("chat",), ("embeddings",)])
bucket_sets = st.sampled_from([(0.005, 0.01, 1.0, 600.0), (-0.5, -0.1, 0, 0.1, 0.5), (1_000, 4_000, float("inf"))])


def rendered(registry: CollectorRegistry, counted_from: float) -> bytes:
    """The exposition text with each `_created` value checked (a moment of this test) and blanked."""
    text = generate_latest(registry)
    for _, stamp in CREATED.findall(text):
        assert counted_from <= float(stamp) <= time.time()
    return CREATED.sub(rb"\1 <created>", text)


@contextmanager
def both() -> Iterator[tuple[CollectorRegistry, CollectorRegistry, float]]:
    """A registry for the library's metric, one for the tally, and the moment before either was made."""
    yield CollectorRegistry(), CollectorRegistry(), time.time()


@settings(max_examples=examples(100))
@given(counts=st.lists(st.tuples(label_sets, amounts), max_size=30), created=st.booleans())
def test_a_counter_renders_as_the_librarys(counts: list[tuple[tuple[str, str], float]], created: bool) -> None:
    if not created:
        library.disable_created_metrics()  # type: ignore[no-untyped-call]
    try:
        with both() as (theirs, ours, start):
            counted = Counter("requests", "Requests, by route and status.", ["route", "status"], registry=theirs)
            tally = counter("requests", "Requests, by route and status.", ["route", "status"], registry=ours)
            for labels, amount in counts:
                counted.labels(*labels).inc(amount)
                tally.add(labels, amount)
            assert rendered(ours, start) == rendered(theirs, start)
    finally:
        library.enable_created_metrics()  # type: ignore[no-untyped-call]


@settings(max_examples=examples(100))
@given(amounts=st.lists(st.integers(-5, 5), max_size=20), counted=st.lists(amounts, max_size=5))
def test_an_unlabelled_gauge_and_counter_render_as_the_librarys(amounts: list[int], counted: list[float]) -> None:
    with both() as (theirs, ours, start):
        gauge = Gauge("in_flight", "Requests being handled.", multiprocess_mode="livesum", registry=theirs)
        tally = Tally("gauge", "in_flight", "Requests being handled.", (), ours)
        tokens = Counter("tokens", "Tokens.", registry=theirs)
        tokens_tally = counter("tokens", "Tokens.", registry=ours)
        for amount in amounts:
            gauge.inc(amount)
            tally.add((), amount)
        for tokens_counted in counted:
            tokens.inc(tokens_counted)
            tokens_tally.add((), tokens_counted)
        assert rendered(ours, start) == rendered(theirs, start)


@settings(max_examples=examples(100))
@given(
    observed=st.lists(st.tuples(st.sampled_from([("chat",), ("embeddings",)]), values), max_size=30),
    buckets=bucket_sets,
)
def test_a_histogram_renders_as_the_librarys(
    observed: list[tuple[tuple[str], float]], buckets: tuple[float, ...]
) -> None:
    with both() as (theirs, ours, start):
        histogram = Histogram("duration", "Seconds.", ["route"], buckets=buckets, registry=theirs)
        tally = TallyHistogram("duration", "Seconds.", ["route"], buckets, ours)
        for labels, value in observed:
            histogram.labels(*labels).observe(value)
            tally.observe(labels, value)
        assert rendered(ours, start) == rendered(theirs, start)


@settings(max_examples=examples(30))
@given(counts=st.lists(st.tuples(label_sets, st.integers(0, 10**6)), min_size=1, max_size=30))
def test_counts_from_another_thread_are_kept(counts: list[tuple[tuple[str, str], int]]) -> None:
    with both() as (theirs, ours, start):
        counted = Counter("requests", "Requests.", ["route", "status"], registry=theirs)
        tally = counter("requests", "Requests.", ["route", "status"], registry=ours)
        histogram = Histogram("size", "Sizes.", ["route", "status"], buckets=(10, 1000), registry=theirs)
        sizes = TallyHistogram("size", "Sizes.", ["route", "status"], (10, 1000), ours)
        for labels, amount in counts:
            counted.labels(*labels).inc(amount)
            histogram.labels(*labels).observe(amount)
        half = len(counts) // 2

        def count(part: list[tuple[tuple[str, str], int]]) -> None:
            for labels, amount in part:
                tally.add(labels, amount)
                sizes.observe(labels, amount)

        count(counts[:half])
        worker = threading.Thread(target=count, args=(counts[half:],))
        worker.start()
        worker.join()
        # The series a thread counted first is listed where that thread's first count put it: compare as sets.
        assert sorted(rendered(ours, start).splitlines()) == sorted(rendered(theirs, start).splitlines())


def test_a_series_with_the_wrong_labels_is_refused() -> None:
    tally = counter("requests", "Requests.", ["route", "status"], registry=CollectorRegistry())
    for wrong in (("chat",), ("chat", "200", "x"), ("chat", 200)):
        try:
            tally.add(wrong)  # type: ignore[arg-type]
        except ValueError as refused:
            assert "requests takes 2 label values" in str(refused)
        else:
            raise AssertionError(f"{wrong!r} was counted")


def test_a_counter_refuses_to_go_down_and_a_gauge_does() -> None:
    registry = CollectorRegistry()
    tally = counter("tokens", "Tokens.", registry=registry)
    in_flight = Tally("gauge", "in_flight", "Requests being handled.", (), registry)
    in_flight.add((), -1)
    try:
        tally.add((), -1)
    except ValueError as refused:
        assert "cannot go down" in str(refused)
    else:
        raise AssertionError("a counter went down")
    assert registry.get_sample_value("tokens_total") == 0
    assert registry.get_sample_value("in_flight") == -1
