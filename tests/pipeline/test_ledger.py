"""The ledger: misses that always add up, bounds that hold, records whose fields the bill and the page rely on."""

from __future__ import annotations

from dataclasses import fields, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.engine.messages import chain_keys, message_key
from proxy.formats.anthropic.answers import chat_usage as anthropic_usage
from proxy.formats.responses.answers import chat_usage as responses_usage
from proxy.pipeline.cache_misses import CAUSES, DEFAULT_LIFETIME, Reported, lifetime
from proxy.pipeline.ledger import CompactionNote, Forwarded, Ledger, LedgerRecord
from proxy.pipeline.ledger_entries import opening_digest
from tests.support.examples import examples
from tests.support.fake_clock import FakeClock

RECORD_FIELDS = (
    "at",
    "api",
    "model",
    "window",
    "client_tokens",
    "forwarded_tokens",
    "prompt_tokens",
    "cached_tokens",
    "cache_write_tokens",
    "output_tokens",
    "client_reused_tokens",
    "compaction",
    "misses",
)


def chain(texts: list[str]) -> list[bytes]:
    return chain_keys([message_key({"role": "user", "content": text}) for text in texts])


def reported(prompt: int, cached: int, written: int = 0, output: int = 5) -> Reported:
    return Reported(prompt, cached, written, output)


class Conversation:
    """A client's conversation as the ledger sees it: what it sent and what was forwarded, by chain."""

    def __init__(self, ledger: Ledger, scope: bytes = b"tenant") -> None:
        self.ledger = ledger
        self.scope = scope
        self.texts = ["instructions", "first question"]

    def send(
        self,
        usage: Reported,
        *,
        forwarded: list[str] | None = None,
        client_tokens: int | None = None,
        tools_added: bool = False,
    ) -> LedgerRecord:
        opening = self.ledger.open(
            scope=self.scope,
            named=None,
            opening=opening_digest([{"role": "system", "content": text} for text in self.texts[:2]], {}),
            client_chain=chain(self.texts),
            api="chat_completions",
            model="m",
            tenant=self.scope,
            lifetime=DEFAULT_LIFETIME,
        )
        assert opening is not None
        sent = chain(forwarded) if forwarded is not None else chain(self.texts)
        return self.ledger.close(
            opening,
            Forwarded(sent, tools_added),
            usage,
            window=8192,
            client_tokens=client_tokens,
            forwarded_tokens=client_tokens,
            compaction=None,
        )


steps = st.lists(
    st.tuples(
        st.sampled_from(["extend", "edit", "compact", "replay", "wait", "offer"]),
        st.integers(min_value=0, max_value=50_000),
        st.integers(min_value=0, max_value=50_000),
        st.one_of(st.none(), st.integers(min_value=0, max_value=60_000)),
        st.floats(min_value=0, max_value=3 * DEFAULT_LIFETIME),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=examples(200))
@given(steps)
def test_causes_are_never_negative_and_add_up_to_the_uncached_tokens(
    sequence: list[tuple[str, int, int, int | None, float]],
) -> None:
    clock = FakeClock()
    conversation = Conversation(Ledger(clock))
    forwarded: list[str] | None = None
    offered = False
    for number, (action, prompt, cached, client_tokens, gap) in enumerate(sequence):
        offered = offered != (action == "offer")
        clock.advance(gap if action == "wait" else 1)
        conversation.texts.append(f"message {number}")
        if action == "edit" and len(conversation.texts) > 3:
            conversation.texts[3] = f"edited {number}"
        if action == "compact":
            forwarded = ["instructions", f"summary {number}", *conversation.texts[-2:]]
        elif action == "replay" and forwarded is not None:
            forwarded = [*forwarded, conversation.texts[-1]]
        else:
            forwarded = None
        usage = reported(prompt, min(cached, prompt))
        record = conversation.send(usage, forwarded=forwarded, client_tokens=client_tokens, tools_added=offered)
        misses = record.misses.as_dict()
        assert all(tokens >= 0 for tokens in misses.values()), misses
        assert sum(misses.values()) == usage.prompt_tokens - usage.cached_tokens
        assert (misses["first"] > 0) <= (number == 0)


def test_a_conversation_that_grows_and_stays_cached_misses_only_its_new_messages() -> None:
    conversation = Conversation(Ledger(FakeClock()))
    first = conversation.send(reported(2000, 0), client_tokens=2000)
    assert first.misses.as_dict() == {**dict.fromkeys(CAUSES, 0), "first": 2000}
    conversation.texts.append("answer and a question")
    second = conversation.send(reported(2300, 1920), client_tokens=2300)
    assert second.misses.new == 300 and second.misses.provider == 80  # the 128-token steps of the cache
    assert second.client_reused_tokens == 2000


def test_offering_the_read_tool_breaks_the_prefix_once_and_it_is_the_proxys() -> None:
    conversation = Conversation(Ledger(FakeClock()))
    conversation.send(reported(2000, 0), client_tokens=2000)
    conversation.texts.append("answer and a question")
    offered = conversation.send(reported(2300, 0), client_tokens=2300, tools_added=True)
    assert (offered.misses.new, offered.misses.compaction) == (300, 2000)
    conversation.texts.append("another question")
    again = conversation.send(reported(2500, 2176), client_tokens=2500, tools_added=True)
    assert (again.misses.new, again.misses.provider, again.misses.compaction) == (200, 124, 0)


def test_the_ledger_is_bounded_in_conversations_and_in_records_but_totals_count_everything() -> None:
    ledger = Ledger(FakeClock(), conversations=3, requests=4)
    for number in range(5):
        conversation = Conversation(ledger, scope=b"tenant %d" % number)
        for turn in range(6):
            conversation.texts.append(f"turn {turn}")
            conversation.send(reported(1000 + turn, 0), client_tokens=1000)
    recent = ledger.recent()
    assert len(recent) == 3
    assert [summary["tenant"] for summary in recent] == [(b"tenant %d" % number).hex()[:12] for number in (4, 3, 2)]
    kept = ledger.conversation(recent[0]["id"])
    assert kept is not None
    assert kept["requests"] == 6 and len(kept["records"]) == 4 and kept["dropped"] == 2
    assert kept["totals"]["prompt_tokens"] == sum(1000 + turn for turn in range(6))


def test_a_record_has_the_fields_the_bill_prices_and_its_json_names_every_cause() -> None:
    assert tuple(field.name for field in fields(LedgerRecord)) == RECORD_FIELDS
    conversation = Conversation(Ledger(FakeClock()))
    record = conversation.send(reported(1500, 0, written=1024), client_tokens=1400)
    shown = record.as_json()
    assert tuple(shown) == RECORD_FIELDS
    assert shown["misses"] == {**dict.fromkeys(CAUSES, 0), "first": 1500}
    assert shown["compaction"] is None and shown["cache_write_tokens"] == 1024
    compacted = replace(record, compaction=CompactionNote(("drop_oldest",), 9000, 3000))
    assert compacted.as_json()["compaction"] == {
        "strategies": ["drop_oldest"],
        "tokens_before": 9000,
        "tokens_after": 3000,
    }


def test_usage_reads_the_same_from_the_three_formats() -> None:
    chat = {"prompt_tokens": 3210, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 3000}}
    responses = responses_usage(
        {
            "input_tokens": 3210,
            "output_tokens": 7,
            "total_tokens": 3217,
            "input_tokens_details": {"cached_tokens": 3000},
        }
    )
    messages = anthropic_usage(
        {"input_tokens": 10, "cache_creation_input_tokens": 200, "cache_read_input_tokens": 3000, "output_tokens": 7}
    )
    assert Reported.of(chat) == Reported.of(responses) == Reported(3210, 3000, 0, 7)
    assert Reported.of(messages) == Reported(3210, 3000, 200, 7)
    assert Reported.of(None) is None and Reported.of({"completion_tokens": 3}) is None


def test_the_cache_lifetime_is_the_providers_and_longer_when_the_request_asks() -> None:
    hour = {"type": "ephemeral", "ttl": "1h"}
    assert lifetime("chat_completions", {"model": "m"}) == DEFAULT_LIFETIME == 300
    assert lifetime("responses", {"prompt_cache_retention": "24h"}) == 24 * 3600
    assert lifetime("messages", {"system": [{"type": "text", "text": "Rules.", "cache_control": hour}]}) == 3600
    assert lifetime("messages", {"tools": [{"name": "search", "cache_control": hour}]}) == 3600
    assert lifetime("messages", {"system": "the 1h plan", "messages": [{"role": "user", "content": "ttl 1h"}]}) == 300


@settings(max_examples=examples(200))
@given(
    st.lists(st.tuples(st.integers(1, 3_000), st.sampled_from(["send", "send", "compact"])), min_size=1, max_size=30),
    st.integers(0, 500),
    st.integers(-200, 200),
)
def test_the_client_s_size_keeps_growing_across_compactions_as_the_provider_counts_it(
    turns: list[tuple[int, str]], overhead: int, bias: int
) -> None:
    """A client that only appends; a proxy that compacts, replaying its compactions after (it measures each request
    on the replayed prefix, off by a fixed `bias`); a provider counting each message's tokens plus a fixed overhead:
    `client_tokens` is the client's request as the provider would count it sent directly."""
    ledger = Ledger(FakeClock())
    texts, sizes = ["instructions"], {"instructions": 100}
    sent: list[str] = []
    for number, (size, action) in enumerate(turns):
        texts.append(f"message {number}")
        sizes[texts[-1]] = sizes[f"summary {number}"] = size
        replayed = [*sent, texts[-1]] if sent else list(texts)
        # A first request the proxy compacts has no size the provider told: the estimate stands (the docstring's).
        sent = ["instructions", f"summary {number}", texts[-1]] if action == "compact" and number else replayed
        opening = ledger.open(
            scope=b"t",
            named="c",
            opening=None,
            client_chain=chain(texts),
            api="chat_completions",
            model="m",
            tenant=b"t",
            lifetime=DEFAULT_LIFETIME,
        )
        assert opening is not None
        record = ledger.close(
            opening,
            Forwarded([] if sent == texts else chain(sent)),
            reported(overhead + sum(sizes[text] for text in sent), 0),
            window=None,
            client_tokens=bias + overhead + sum(sizes[text] for text in replayed),
            forwarded_tokens=bias + overhead + sum(sizes[text] for text in sent),
            compaction=None,
        )
        assert record.client_tokens == overhead + sum(sizes[text] for text in texts)
