"""The traces' setting and what a span is built from: `otel_endpoint` validated at start-up, usage summed over a
request's upstream calls, cache misses by cause as attributes (the end-to-end export is `tests/e2e/test_traces.py`).
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.config import ConfigError, load_settings
from proxy.pipeline.cache_misses import CAUSES, Misses
from proxy.server.record import RequestRecord
from proxy.server.tracing import proxy_figures
from tests.support.examples import examples

NOT_INSTALLED = """
import sys
sys.modules["opentelemetry.exporter"] = None  # as if the `otel` extra were not installed
from proxy.cli import main
sys.exit(main(["serve", "--otel-endpoint", "http://127.0.0.1:4318"]))
"""


@pytest.mark.parametrize("value", ["env", "http://collector:4318", "https://otel.example.com/v1/traces"])
def test_a_url_or_env_turns_traces_on(value: str) -> None:
    assert load_settings(environ={"COMPACTION_PROXY_OTEL_ENDPOINT": value}).otel_endpoint == value


def test_traces_are_off_by_default_whatever_the_standard_variables_say() -> None:
    assert load_settings(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}).otel_endpoint is None
    assert load_settings(environ={"COMPACTION_PROXY_OTEL_ENDPOINT": ""}).otel_endpoint is None


@pytest.mark.parametrize("value", ["collector:4318", "grpc://collector:4317", "http://", "yes"])
def test_anything_else_is_refused_saying_what_is_expected(value: str) -> None:
    with pytest.raises(ConfigError, match=r"otel_endpoint.*COMPACTION_PROXY_OTEL_ENDPOINT.*collector's OTLP/HTTP URL"):
        load_settings(environ={"COMPACTION_PROXY_OTEL_ENDPOINT": value})


def test_configured_without_the_otel_extra_the_proxy_stops_saying_what_to_install() -> None:
    finished = subprocess.run([sys.executable, "-c", NOT_INSTALLED], capture_output=True, text=True, check=False)
    assert finished.returncode == 2
    (line,) = finished.stderr.strip().splitlines()
    assert "otel_endpoint" in line and "pip install 'compaction-proxy[otel]'" in line


counts = st.integers(min_value=0, max_value=10**7)
not_counts = st.one_of(st.none(), st.booleans(), st.integers(max_value=-1), st.text(max_size=3), st.floats())
reports = st.fixed_dictionaries(
    {},
    optional={
        "prompt_tokens": st.one_of(counts, not_counts),
        "completion_tokens": st.one_of(counts, not_counts),
        "prompt_tokens_details": st.fixed_dictionaries({"cached_tokens": st.one_of(counts, not_counts)}),
    },
)


def _valid(values: list[Any]) -> int | None:
    """The sum of the token counts among `values`, None when there is none."""
    valid = [value for value in values if isinstance(value, int) and not isinstance(value, bool) and value >= 0]
    return sum(valid) if valid else None


@settings(max_examples=examples(200))
@given(st.lists(st.one_of(st.none(), reports), max_size=6))
def test_a_requests_usage_is_the_sum_of_its_calls_reports_ignoring_what_is_not_a_count(
    usages: list[dict[str, Any] | None],
) -> None:
    record = RequestRecord(method="POST", route="chat_completions")
    for usage in usages:
        record.used(usage)
    sent = [usage for usage in usages if usage]
    assert record.prompt_tokens == _valid([usage.get("prompt_tokens") for usage in sent])
    assert record.completion_tokens == _valid([usage.get("completion_tokens") for usage in sent])
    cached = [usage.get("prompt_tokens_details", {}).get("cached_tokens") for usage in sent]
    assert record.cached_tokens == _valid(cached)


@settings(max_examples=examples(100))
@given(st.fixed_dictionaries({cause: counts for cause in CAUSES}))
def test_each_cache_miss_cause_is_one_attribute_of_our_namespace(misses: dict[str, int]) -> None:
    record = RequestRecord(method="POST", route="messages", cache_misses=Misses(**misses))
    figures = proxy_figures(record)
    found = {name.removeprefix("compaction_proxy.cache_miss."): value for name, value in figures.items()}
    assert {cause: found[cause] for cause in misses} == misses
    assert all(name.startswith("compaction_proxy.") for name in figures)
