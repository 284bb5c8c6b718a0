"""What a provider bills for a long run, through the proxy and going direct, by the proxy's own bill (`proxy.billing`).

Compaction keeps a conversation inside its window, but each compaction rewrites the prompt's beginning, so the
provider's prefix cache serves none of the next prompt: that prompt is billed at the full input price. The bench
records each request the way a conversation's ledger does (`Record`: the client's request as the provider counts
it, what it reuses of the client's previous one, and the usage the upstream reported for what the proxy forwarded)
and hands the records to the proxy's bill, which adds up what was billed through the proxy and estimates what the
same requests would have cost going direct. The agent's real run straight at the upstream is billed the same way,
so the estimate is checked against what going direct did cost (`tests/test_bench_billing.py`).

Each run is priced as two OpenAI models, at the price library's prices (USD per million input / cached / output):
gpt-4o-mini (0.15 / 0.075 / 0.60: cached input at half price) and gpt-5 (1.25 / 0.125 / 10: at a tenth, where a
lost cache costs the most).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.billing import Bill, Charge, PriceBook, conversation_bill
from proxy.simulator.openai_tokens import prompt_token_sequence

Usage = Mapping[str, Any]

MODELS = ("gpt-4o-mini", "gpt-5")
"""The models each run is priced as."""

API = "chat_completions"
"""The API the bench's agent speaks."""

BOOK = PriceBook()
"""The price library's prices, no operator's."""


@dataclass(frozen=True)
class Record:
    """One forwarded request as a conversation's ledger records it (`proxy.billing.bill.Request`).

    `at` is the request's index: every request of a bench run is sent well within the cache lifetime.
    """

    at: float
    api: str
    model: str | None
    window: int
    client_tokens: int
    client_reused_tokens: int
    prompt_tokens: int
    cached_tokens: int
    cache_write_tokens: int
    output_tokens: int


class ClientCounts:
    """The client's requests as the provider counts them: each one's tokens, and those it shares with the previous.

    Only the previous request's tokens are kept, so a run of hundreds of long prompts costs one prompt's memory.
    """

    def __init__(self) -> None:
        self.counts: list[tuple[int, int]] = []
        self._previous: list[int] = []

    def add(self, body: Mapping[str, Any]) -> None:
        """Count a request the client sends, as the upstream will."""
        tokens = prompt_token_sequence(body)
        shared = itertools.takewhile(lambda pair: pair[0] == pair[1], zip(tokens, self._previous, strict=False))
        self.counts.append((len(tokens), sum(1 for _ in shared)))
        self._previous = tokens


def records(
    usages: Sequence[Usage], own: Sequence[bool], client: ClientCounts, *, model: str, window: int
) -> list[Record]:
    """The records of a run: each usage the upstream reported, with the client's request it forwarded.

    :param own: For each usage, whether it answered a call the proxy made on its own (a summary call), which
        forwarded no client request.
    :param client: The client's requests, in order: one for each usage that is not an own call's.
    """
    sent = iter(client.counts)
    kept: list[Record] = []
    for index, (usage, proxy_s_own) in enumerate(zip(usages, own, strict=True)):
        tokens, reused = (0, 0) if proxy_s_own else next(sent)
        prompt = int(usage["prompt_tokens"])
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        output = int(usage["completion_tokens"])
        kept.append(Record(float(index), API, model, window, tokens, reused, prompt, cached, 0, output))
    return kept


def priced(charges: Mapping[str, Charge]) -> dict[str, Any]:
    """One charge's tokens (the same at every model's prices) and its price in USD as each of `MODELS`."""
    first = next(iter(charges.values()))
    return {
        "requests": first.requests,
        "uncached_input": first.uncached,
        "cached_input": first.cached,
        "output": first.output,
        "usd": {model: float(charge.usd) for model, charge in charges.items()},
    }


def bills(run: Sequence[Record]) -> dict[str, Bill]:
    """The bill of a run's records priced as each of `MODELS`."""
    return {model: conversation_bill([dataclasses.replace(r, model=model) for r in run], BOOK) for model in MODELS}


def usage_charge(usages: Sequence[Usage]) -> Charge:
    """What the upstream billed for some chat-completion usages, added up (their client requests left out)."""
    forwarded = records(usages, [True] * len(usages), ClientCounts(), model=MODELS[0], window=0)
    return conversation_bill(forwarded, BOOK).proxy


def table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The markdown table of long runs' bills through the proxy against going direct, one line per run.

    Each row is a `bench.long_run.one_run` result carrying `billing` (`bench.long_run.compared`).
    """
    lines = [
        f"Billed in USD at the price library's prices of {' / '.join(MODELS)}.",
        "",
        "| run | direct: turns until it overflowed | direct billed | direct as the proxy estimates it "
        "| proxy billed, same turns | proxy / direct | proxy, whole run: turns, compactions "
        "| uncached / cached / output | billed per 1000 turns |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        billing = row["billing"]
        direct, same, whole = billing["direct"], billing["proxy_same_turns"], billing["proxy"]
        until = f"{billing['direct_turns']}" if billing["direct_overflowed"] else f"{billing['direct_turns']} (never)"
        ratios = " / ".join(f"{same['usd'][model] / direct['usd'][model]:.2f}x" for model in MODELS)
        per_turn = " / ".join(f"{1000 * whole['usd'][model] / row['turns']:.2f}" for model in MODELS)
        lines.append(
            f"| {row['label']} | {until} | {_usd(direct)} | {_usd(billing['direct_estimate'])} | {_usd(same)} "
            f"| {ratios} | {row['turns']}, {row['compacted_turns']} | {whole['uncached_input']} "
            f"/ {whole['cached_input']} / {whole['output']} | {per_turn} |"
        )
    return lines


def _usd(figures: Mapping[str, Any]) -> str:
    return " / ".join(f"{figures['usd'][model]:.4f}" for model in MODELS)
