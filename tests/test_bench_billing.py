"""The long run's bill: what a provider charges, through the proxy and going direct, from the usage it reported.

The counting is checked as properties over random usages; the comparison end to end, against the real proxy process
and the OpenAI-like upstream: where the proxy never compacts it forwards the agent's own prompts, so its bill is the
direct run's to the token; where the window is small, the direct run ends at the upstream's overflow and the proxy is
billed over as many turns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench import billing, long_run

usages = st.lists(
    st.tuples(st.integers(0, 50_000), st.integers(0, 50_000), st.integers(0, 4_000)).map(
        lambda counts: {
            "prompt_tokens": counts[0] + counts[1],
            "prompt_tokens_details": {"cached_tokens": counts[1]},
            "completion_tokens": counts[2],
        }
    ),
    max_size=30,
)


@given(usages, usages)
def test_a_bill_adds_up_request_by_request(first: list[dict[str, Any]], second: list[dict[str, Any]]) -> None:
    whole, a, b = billing.bill(first + second), billing.bill(first), billing.bill(second)
    assert whole == billing.Bill(
        a.requests + b.requests,
        a.uncached_input + b.uncached_input,
        a.cached_input + b.cached_input,
        a.output + b.output,
    )
    assert whole.uncached_input + whole.cached_input == sum(usage["prompt_tokens"] for usage in first + second)
    for prices in billing.PRICES:
        assert whole.billed(prices) == pytest.approx(a.billed(prices) + b.billed(prices))
        # A cached token never costs more than an uncached one.
        assert whole.billed(prices) <= whole.uncached_input + whole.cached_input + prices.output * whole.output


@given(st.lists(st.booleans(), max_size=40), st.integers(0, 45))
def test_the_first_turns_are_a_prefix_holding_that_many_client_turns(summaries: list[bool], turns: int) -> None:
    records = [{"index": index} for index in range(len(summaries))]
    kept = billing.first_turns(records, summaries, turns)
    assert kept == records[: len(kept)]
    assert sum(not summary for summary in summaries[: len(kept)]) == min(turns, summaries.count(False))
    if len(kept) < len(records):
        assert not summaries[len(kept)], "the run was cut before a summary call that came ahead of the next turn"


async def test_unchanged_prompts_bill_as_going_direct(tmp_path: Path) -> None:
    direct = await long_run.direct_run(1, 8, window=128_000, result_lines=18)
    row = await long_run.one_run(True, 1, 8, tmp_path, window=128_000, result_lines=18, direct=direct)
    figures = row["billing"]
    assert row["compacted_turns"] == 0 and not figures["direct_overflowed"]
    assert figures["direct"]["cached_input"] > 0, "the run is too short for the upstream's cache to serve anything"
    assert figures["proxy"] == figures["proxy_same_turns"] == figures["direct"]


async def test_a_direct_run_ends_at_its_overflow_and_the_proxy_is_billed_over_as_many_turns(tmp_path: Path) -> None:
    direct = await long_run.direct_run(3, 20, window=4096)
    row = await long_run.one_run(True, 3, 20, tmp_path, window=4096, direct=direct)
    figures = row["billing"]
    assert figures["direct_overflowed"] and figures["direct_turns"] == len(direct.usages) < row["turns"]
    assert row["compacted_turns"] > 0
    # The default chain makes no summary calls: as many requests billed as the direct run's turns.
    assert figures["proxy_same_turns"]["requests"] == figures["direct_turns"] < figures["proxy"]["requests"]
    assert any(line.startswith(f"| {row['label']} | {figures['direct_turns']} |") for line in billing.table([row]))
