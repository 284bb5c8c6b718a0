"""The long run's bill, by the proxy's own bill (`proxy.billing`), against what the upstream reported and against the
agent's real run going direct.

End to end, against the real proxy process and the OpenAI-like upstream: the proxy's bill adds up the usage the
upstream reported, request by request; where the proxy never compacts it forwards the agent's own prompts, so its
bill is the direct run's to the token; where the window is small, the direct run ends at the upstream's overflow,
and the proxy's estimate of going direct, made from the proxy's run alone, is what the direct run did cost.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from bench import billing, long_run


def upstream_sums(usages: list[dict[str, Any]]) -> dict[str, int]:
    """The upstream's own counts, added up."""
    cached = sum(usage["prompt_tokens_details"]["cached_tokens"] for usage in usages)
    return {
        "requests": len(usages),
        "uncached_input": sum(usage["prompt_tokens"] for usage in usages) - cached,
        "cached_input": cached,
        "output": sum(usage["completion_tokens"] for usage in usages),
    }


def tokens(figures: dict[str, Any]) -> dict[str, int]:
    return {key: value for key, value in figures.items() if key != "usd"}


async def test_unchanged_prompts_bill_as_going_direct(tmp_path: Path) -> None:
    direct = await long_run.direct_run(1, 8, window=128_000, result_lines=18)
    row = await long_run.one_run(True, 1, 8, tmp_path, window=128_000, result_lines=18, direct=direct)
    figures = row["billing"]
    assert row["compacted_turns"] == 0 and not figures["direct_overflowed"] and not figures["estimate_stopped"]
    assert figures["direct"]["cached_input"] > 0, "the run is too short for the upstream's cache to serve anything"
    assert tokens(figures["direct"]) == upstream_sums(direct.usages)
    assert figures["proxy"] == figures["proxy_same_turns"] == figures["direct"] == figures["direct_estimate"]


async def test_the_long_run_s_bill_is_the_upstream_s_and_its_estimate_of_going_direct_is_what_direct_cost(
    tmp_path: Path,
) -> None:
    direct = await long_run.direct_run(3, 20, window=4096)
    row = await long_run.one_run(True, 3, 20, tmp_path, window=4096, direct=direct)
    figures = row["billing"]
    assert figures["direct_overflowed"] and figures["direct_turns"] == len(direct.usages) < row["turns"]
    assert row["compacted_turns"] > 0
    # Through the proxy: the upstream's own counts, priced at the library's prices of each model.
    assert figures["proxy"]["requests"] == row["turns"] + row["summary_calls"]
    assert figures["proxy"]["uncached_input"] + figures["proxy"]["cached_input"] == row["prompt_tokens_forwarded"]
    assert figures["proxy"]["cached_input"] == row["cached_prompt_tokens"]
    assert all(
        figures["proxy"]["usd"][model] > figures["proxy_same_turns"]["usd"][model] > 0 for model in billing.MODELS
    )
    # Going direct: the proxy's estimate stops where the upstream refused the direct run, and bills what it billed.
    assert tokens(figures["direct"]) == upstream_sums(direct.usages)
    assert figures["estimate_stopped"] and figures["direct_estimate"] == figures["direct"]
    # The default chain makes no summary calls: as many requests billed as the direct run's turns.
    assert figures["proxy_same_turns"]["requests"] == figures["direct_turns"] < figures["proxy"]["requests"]
    assert any(line.startswith(f"| {row['label']} | {figures['direct_turns']} |") for line in billing.table([row]))


def as_bench_figures(charge: dict[str, Any]) -> dict[str, Any]:
    """A charge of the proxy's conversation JSON in the bench's form, priced as the bench's agent model."""
    kinds = ("requests", "uncached_input", "cached_input", "output")
    return {**{kind: charge[kind] for kind in kinds}, "usd": charge["usd"]}


def bench_figures(figures: dict[str, Any]) -> dict[str, Any]:
    """The bench's figures priced as the agent's model alone."""
    return {**tokens(figures), "usd": figures["usd"][long_run.MODEL]}


async def test_the_proxy_s_own_bill_of_the_long_run_is_the_bench_s(tmp_path: Path) -> None:
    direct = await long_run.direct_run(3, 20, window=4096)
    row = await long_run.one_run(True, 3, 20, tmp_path, window=4096, direct=direct, ledger=True)
    figures = row["billing"]
    assert row["compacted_turns"] > 0 and figures["estimate_stopped"]
    [conversation] = row["conversations"]
    bill = conversation["bill"]
    assert bill["prices"] == "loaded" and bill["stopped"] == 1 and bill["proxy"]["price"] == "known"
    # Through the proxy, whole and over the turns going direct could make: the bench's bill of the upstream's usage.
    assert as_bench_figures(bill["proxy"]) == bench_figures(figures["proxy"])
    assert as_bench_figures(bill["covered"]) == bench_figures(figures["proxy_same_turns"])
    # Going direct: the proxy's estimate is the bench's bill of the agent's real direct run.
    assert (
        as_bench_figures(bill["direct"])
        == bench_figures(figures["direct"])
        == bench_figures(figures["direct_estimate"])
    )
    # The client's request sizes keep growing across compactions: the upstream's counts of the direct run's requests.
    sizes = [record["client_tokens"] for record in conversation["records"]]
    compacted = [record["compaction"] is not None for record in conversation["records"]]
    assert sum(compacted) == row["compacted_turns"] and all(b > a for a, b in itertools.pairwise(sizes))
    assert sizes[: len(direct.client.counts)] == [size for size, _ in direct.client.counts]
