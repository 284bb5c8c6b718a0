"""The proxy's request metrics, counted into tallies, expose exactly what prometheus_client's own metrics exposed.

The series counted on every request (`ProxyMetrics.answered`, `count_usage`, `in_flight`; `CompactionMetrics.decided`,
`count_misses`, `count_bill`) are tallies in a single process and the library's metrics in a pod of workers (whose
values go through files). The same requests counted both ways must give the same `/metrics` text: every family in
its place, its HELP and TYPE, every series, bucket and value; only the `_created` stamps differ, by the moment each
was made.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest, values

from proxy.billing.bill import Tokens
from proxy.pipeline.cache_misses import Misses
from proxy.pipeline.metrics import CompactionMetrics
from proxy.pipeline.tallies import Tally
from proxy.server.metrics import ProxyMetrics
from proxy.server.record import RequestRecord
from tests.support.examples import examples

DIRECTORY = "PROMETHEUS_MULTIPROC_DIR"
CREATED = re.compile(rb"^(\S+_created(?:\{[^}]*\})?) \S+$", re.MULTILINE)

counts = st.none() | st.integers(0, 10**6)
records = st.builds(
    RequestRecord,
    method=st.sampled_from(["POST", "GET"]),
    route=st.sampled_from(["chat_completions", "messages", "internal", "other"]),
    upstream=st.none() | st.sampled_from(["default", "anthropic"]),
    status=st.sampled_from([200, 400, 499, 502]),
    upstream_status=st.none() | st.sampled_from([200, 429]),
    upstream_latency=st.none() | st.floats(0, 700),
    compaction=st.none() | st.sampled_from(["unchanged", "compacted", "skipped"]),
    window_source=st.none() | st.sampled_from(["default", "table", "learned"]),
    error=st.none() | st.sampled_from(["unreachable", "timeout", "internal"]),
)
usages = st.none() | st.fixed_dictionaries(
    {"prompt_tokens": counts, "prompt_tokens_details": st.fixed_dictionaries({"cached_tokens": counts})}
)
misses = st.builds(Misses, new=st.integers(0, 10**5), first=st.integers(0, 10**5), compaction=st.integers(0, 10**5))
tokens = st.tuples(*[st.integers(0, 10**5)] * 4)
requests = st.tuples(records, st.floats(0, 700), usages, misses, tokens, st.none() | tokens)
Served = tuple[RequestRecord, float, dict[str, Any] | None, Misses, Tokens, Tokens | None]
"""A request as counted: its record, seconds taken, usage report, cache misses, bill (proxy, direct)."""


@contextmanager
def value_class(kind: Any) -> Iterator[None]:
    """prometheus_client's metrics made meanwhile keep their values in `kind` (the class `PodMetrics` switches)."""
    before = values.ValueClass
    values.ValueClass = kind
    try:
        yield
    finally:
        values.ValueClass = before


@contextmanager
def library_values() -> Iterator[None]:
    """prometheus_client's multiprocess values (what a pod's workers use) for the metrics made meanwhile.

    Their files go to a directory of their own, removed afterwards, so no count outlives the example.
    """
    named = os.environ.get(DIRECTORY)
    with tempfile.TemporaryDirectory() as directory:
        os.environ[DIRECTORY] = directory
        try:
            with value_class(values.MultiProcessValue()):  # type: ignore[no-untyped-call]
                yield
        finally:
            values.close_all_multiprocess_files()  # type: ignore[no-untyped-call]
            if named is None:
                del os.environ[DIRECTORY]
            else:
                os.environ[DIRECTORY] = named


def counted(proxy: ProxyMetrics, compaction: CompactionMetrics, served: list[Served]) -> bytes:
    """The exposition after counting `served` as the proxy counts a request, `_created` values blanked."""
    for record, elapsed, usage, missed, billed, direct in served:
        proxy.in_flight.add((), 1)
        proxy.count_usage(usage)
        compaction.decided(record.route, record.compaction or "unchanged")
        compaction.count_misses(record.route, missed)
        compaction.count_bill(record.route, billed, direct)
        proxy.answered(record, elapsed)
        proxy.in_flight.add((), -1)
    proxy.in_flight.add((), 1)  # one still in flight
    return CREATED.sub(rb"\1 <created>", generate_latest(proxy.registry))


def metric_sets(registry: CollectorRegistry) -> tuple[ProxyMetrics, CompactionMetrics]:
    """The server's and the compaction side's metrics on one registry, as `create_app` makes them."""
    proxy = ProxyMetrics(registry)
    return proxy, CompactionMetrics(proxy.registry)


@settings(max_examples=examples(50))
@given(served=st.lists(requests, max_size=12))
def test_tallies_expose_what_the_librarys_metrics_exposed(served: list[Served]) -> None:
    with value_class(values.MutexValue):  # a single process's (whatever the environment)
        tallied = metric_sets(CollectorRegistry())
    assert isinstance(tallied[0].requests, Tally)
    with library_values():
        theirs = metric_sets(CollectorRegistry())
        assert not isinstance(theirs[0].requests, Tally)
        expected = counted(*theirs, served)
    assert counted(*tallied, served) == expected
