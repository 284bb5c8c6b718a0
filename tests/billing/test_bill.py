"""The bill as properties over generated conversations: through the proxy it adds up the provider's usage; the
estimate of going direct applies the provider's cache rules to the client's own requests, stops where the window
could not have held one, and never prices a model it does not know."""

from __future__ import annotations

from dataclasses import dataclass, replace
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.billing import Record
from proxy.billing import bill as billing
from proxy.billing.bill import Bill, Charge, conversation_bill, refused_at, total
from proxy.billing.caching import RULES, rules_for
from proxy.billing.prices import PriceBook
from proxy.config.prices import ModelPrices
from proxy.simulator.anthropic_rules import Segment
from proxy.simulator.anthropic_upstream import PromptCache
from tests.support.examples import examples

BOOK = PriceBook({"priced": ModelPrices(input=2.5, cached=0.25, cache_write=3.125, output=10)})


@dataclass(frozen=True)
class Step:
    """One request of a generated conversation whose client only appends: `new` tokens after `gap` seconds."""

    new: int
    gap: float
    output: int
    own: bool  # a call the proxy made on its own (a summary), not the client's


steps = st.lists(
    st.builds(
        Step,
        new=st.integers(1, 3_000),
        gap=st.sampled_from([0.5, 30.0, 299.0, 301.0, 3_600.0]),
        output=st.integers(0, 800),
        own=st.sampled_from([False, False, False, True]),
    ),
    min_size=1,
    max_size=25,
)
apis = st.sampled_from(["chat_completions", "responses", "messages"])


def unchanged(steps: list[Step], api: str, model: str | None = "priced", window: int = 0) -> list[Record]:
    """The records of a proxy that forwards every client request as sent, the provider applying its cache rules."""
    rules = rules_for(api)
    records: list[Record] = []
    at, client, previous = 0.0, 0, None
    for step in steps:
        at += step.gap
        if step.own:
            records.append(Record(at, api, model, window, 0, 0, 500, 0, 0, step.output))
            continue
        reused, client = client, client + step.new
        served = rules.served(reused) if previous is not None and at - previous <= rules.lifetime else 0
        written = rules.written(client, served)
        records.append(Record(at, api, model, window, client, reused, client, served, written, step.output))
        previous = at
    return records


@settings(max_examples=examples(200))
@given(steps, apis)
def test_a_proxy_that_changes_nothing_bills_as_going_direct(conversation: list[Step], api: str) -> None:
    records = unchanged(conversation, api)
    bill = conversation_bill(records, BOOK)
    client = [record for record in records if record.client_tokens]
    assert bill.direct == conversation_bill(client, BOOK).proxy
    assert bill.covered == bill.proxy and not bill.stopped and bill.client_requests == len(client)


@settings(max_examples=examples(200))
@given(st.lists(st.tuples(steps, apis, st.booleans()), min_size=1, max_size=6))
def test_the_bill_adds_up_the_provider_s_usage(conversations: list[tuple[list[Step], str, bool]]) -> None:
    records = [unchanged(steps, api, "priced" if known else "unknown-model") for steps, api, known in conversations]
    bills = [conversation_bill(conversation, BOOK) for conversation in records]
    whole = total(bills)
    every = [record for conversation in records for record in conversation]
    assert whole.conversations == len(conversations) and whole.proxy.requests == len(every)
    assert whole.proxy.input == sum(record.prompt_tokens for record in every)
    assert whole.proxy.cached == sum(record.cached_tokens for record in every)
    assert whole.proxy.cache_write == sum(record.cache_write_tokens for record in every)
    assert whole.proxy.output == sum(record.output_tokens for record in every)
    assert whole.direct.input == sum(record.client_tokens for record in every)
    unknown = sum(
        len(conversation) for conversation, (_, _, known) in zip(records, conversations, strict=True) if not known
    )
    assert whole.proxy.unpriced == unknown
    # Each priced request at its own prices, added up.
    assert whole.proxy.usd == sum(
        (conversation_bill([record], BOOK).proxy.usd for record in every if record.model == "priced"), Decimal(0)
    )
    assert whole == sum(bills[1:], bills[0])


@settings(max_examples=examples(100))
@given(steps, apis)
def test_an_unknown_model_is_billed_in_tokens_only(conversation: list[Step], api: str) -> None:
    unknown = conversation_bill(unchanged(conversation, api, model="my-own-fine-tune"), PriceBook())
    priced = conversation_bill(unchanged(conversation, api), BOOK)
    for figures, tokens in ((unknown.proxy, priced.proxy), (unknown.direct, priced.direct)):
        assert figures.usd == 0 and figures.unpriced == figures.requests
        if figures.requests:
            assert figures.as_dict()["usd"] is None and figures.as_dict()["price"] == "unknown"
        assert replace(figures, unpriced=0) == replace(tokens, usd=Decimal(0))


@settings(max_examples=examples(200))
@given(steps, apis, st.data())
def test_with_a_stable_client_prefix_going_direct_caches_no_less_than_the_proxy(
    conversation: list[Step], api: str, data: st.DataObject
) -> None:
    """Whatever the proxy forwards (no more than the client sent), the provider serves at most the prefix of the
    previous forwarded prompt; going direct, it would have served the client's, which holds it."""
    rules = rules_for(api)
    records: list[Record] = []
    previous = None
    for record in unchanged([replace(step, own=False) for step in conversation], api):
        forwarded = data.draw(st.integers(0, record.client_tokens))
        reach = data.draw(st.integers(0, forwarded))
        alive = previous is not None and record.at - previous.at <= rules.lifetime
        cached = rules.served(min(reach, previous.prompt_tokens)) if alive and previous is not None else 0
        written = rules.written(forwarded, cached)
        records.append(replace(record, prompt_tokens=forwarded, cached_tokens=cached, cache_write_tokens=written))
        previous = records[-1]
    bill = conversation_bill(records, BOOK)
    assert bill.direct.cached >= bill.proxy.cached
    assert bill.direct.input >= bill.proxy.input


@settings(max_examples=examples(200))
@given(steps, apis, st.integers(1, 40_000))
def test_going_direct_stops_at_the_first_request_the_window_could_not_hold(
    conversation: list[Step], api: str, window: int
) -> None:
    records = unchanged(conversation, api, window=window)
    bill = conversation_bill(records, BOOK)
    refused = next((index for index, record in enumerate(records) if record.client_tokens > window), None)
    before = records if refused is None else records[:refused]
    assert refused_at(records) == refused
    assert bill.stopped == (refused is not None)
    assert bill.covered == conversation_bill(before, BOOK).proxy
    assert bill.direct == conversation_bill(before, BOOK).direct


def test_a_request_after_the_cache_lifetime_is_served_nothing() -> None:
    for api, rules in (("chat_completions", RULES["openai"]), ("messages", RULES["anthropic"])):
        at_once = [Step(4_000, 1.0, 10, False), Step(100, rules.lifetime, 10, False)]
        late = [Step(4_000, 1.0, 10, False), Step(100, rules.lifetime + 1, 10, False)]
        kept, expired = (conversation_bill(unchanged(steps, api), BOOK).direct for steps in (at_once, late))
        assert kept.cached == rules.served(4_000) > 0 and expired.cached == 0
        # Anthropic bills the write of what was not read; OpenAI bills none.
        assert expired.cache_write == (4_000 + 4_100 if rules.writes else 0)


def test_a_charge_at_known_prices() -> None:
    # 1M uncached at $2.50, 2M cached at $0.25, 1M written at $3.125, 0.5M output at $10.
    records = [Record(0.0, "messages", "priced", 0, 1, 0, 4_000_000, 2_000_000, 1_000_000, 500_000)]
    figures = conversation_bill(records, BOOK).proxy
    assert figures == Charge(1, 1_000_000, 2_000_000, 1_000_000, 500_000, usd=Decimal("11.125"))
    assert Bill().as_dict()["proxy"]["usd"] == 0.0


@settings(max_examples=examples(200))
@given(st.lists(st.lists(st.integers(1, 400), min_size=1, max_size=19), min_size=1, max_size=20))
def test_the_estimate_follows_the_simulated_anthropic_cache(turns: list[list[int]]) -> None:
    """A client that marks its last block: going direct to the simulated Messages API (whose cache follows
    Anthropic's prefix rule) bills what the estimate says, writes included, while each turn adds fewer blocks than
    the 20 the cache looks back over (the estimate's stated limit)."""
    cache, segments, records = PromptCache(), [], []
    for index, blocks in enumerate(turns):
        reused = sum(segment.tokens for segment in segments)
        segments = [replace(segment, breakpoint=False) for segment in segments]
        segments += [Segment(f"{index}.{block}".encode(), tokens, False) for block, tokens in enumerate(blocks)]
        segments[-1] = replace(segments[-1], breakpoint=True)
        usage = cache.usage("claude-sonnet-4-5", segments)
        prompt = sum(usage.values())
        read, written = usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]
        records.append(Record(float(index), "messages", "priced", 0, prompt, reused, prompt, read, written, 10))
    bill = conversation_bill(records, BOOK)
    assert bill.direct == bill.proxy


@settings(max_examples=examples(200))
@given(steps, apis, st.sampled_from([0, 2_000, 20_000]))
def test_the_metrics_tokens_add_up_to_the_bill_s(conversation: list[Step], api: str, window: int) -> None:
    """Counted request by request (the metrics), tokens by kind add up to the bill's, each way; going direct, the
    requests larger than the window are left out (a client's requests only grow, so those are the bill's last)."""
    records = unchanged(conversation, api, window=window)
    bill = conversation_bill(records, BOOK)
    proxy, direct, direct_requests, previous = [0] * 4, [0] * 4, 0, None
    for record in records:
        through, going = billing.tokens(record, previous)
        proxy = [counted + tokens for counted, tokens in zip(proxy, through, strict=True)]
        if going is not None:
            direct = [counted + tokens for counted, tokens in zip(direct, going, strict=True)]
            direct_requests += 1
        previous = record.at if record.client_tokens else previous
    kinds = ("uncached", "cached", "cache_write", "output")
    assert (len(records), proxy) == (bill.proxy.requests, [getattr(bill.proxy, kind) for kind in kinds])
    assert (direct_requests, direct) == (bill.direct.requests, [getattr(bill.direct, kind) for kind in kinds])


def test_a_book_without_the_library_prices_only_the_operator_s_models() -> None:
    loading = PriceBook(BOOK.overrides, library=False)
    assert loading.rates("gpt-4o-mini", "chat_completions") is None
    assert PriceBook().rates("gpt-4o-mini", "chat_completions") is not None
    assert loading.rates("priced", "chat_completions") == BOOK.rates("priced", "chat_completions")
