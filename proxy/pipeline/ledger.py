"""The per-conversation ledger: each forwarded request's figures and the causes of its cache misses, without content.

A conversation is recognized without keeping anything of what it says: by the conversation header when the client
names one, else by a digest of its opening (its instructions and first message, without cache marks: see
`proxy.pipeline.ledger_entries.opening_digest`), which every later request of it re-sends; either is hashed with the
state scope. A client that edits its opening starts a new conversation; one that edits a later message stays in the
same one.

For each request the provider answered with a usage report, a frozen `LedgerRecord` keeps the figures (the
proxy's estimates before and after compaction, the provider's usage, the client's own prefix reuse, the compaction,
and the misses by cause: see `proxy.pipeline.cache_misses` for the rules). Nothing of a message is kept: the
conversation is found again by hash-chain elements, and compared with its previous request by the ends of two
chains (`Sighting`).

Memory is bounded like `proxy.pipeline.known_prefixes`: at most `conversations` conversations (the least recently
seen go first) and, in each, the last `requests` records (older ones leave the list but stay in its totals). A
record costs about 620 bytes with what its next request is compared with (measured with tracemalloc over 200-turn
conversations), so the defaults hold at most about 20 MB.

What the ledger hands out (`LedgerRecord`, its `Misses`) is frozen. The values it makes for each request and keeps
to itself (`Opening`, `Forwarded`, and `proxy.pipeline.cache_misses`' `Reported`, `ChainEnd`, `Sighting`, `Step`)
are plain slotted dataclasses that nothing changes once made: a frozen dataclass costs about four times as much to
make, and a request makes a dozen of them.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any, Final

from xxhash import xxh3_128_digest

from proxy.pipeline.cache_misses import CAUSES, ChainEnd, Misses, Reported, Sighting, Step, attribute, expected

DEFAULT_CONVERSATIONS: Final = 128
"""Conversations kept; the least recently seen are forgotten first."""

DEFAULT_REQUESTS: Final = 256
"""Records kept per conversation (the most recent); older requests stay in the conversation's totals."""

ID_HEX: Final = 16
"""Hex digits of a conversation's id (a hash of its key): short, and unique among the conversations kept."""

TENANT_HEX: Final = 12
"""Hex digits of a tenant shown (its keyed hash, cut)."""

CONVERSATION_HEADER: Final = "X-Compaction-Conversation"
"""Response header naming the request's conversation by its id (as `/dashboard/conversations/{id}.json` does)."""

Clock = Callable[[], float]
"""Seconds, as `time.time` gives them: the ledger's `at` and the gaps between requests."""


@dataclass(frozen=True, slots=True)
class CompactionNote:
    """A compaction the proxy made of a request: the strategies that changed it and its size before and after."""

    strategies: tuple[str, ...]
    tokens_before: int
    tokens_after: int


@dataclass(frozen=True, slots=True)
class LedgerRecord:
    """One forwarded request the provider answered with usage (field names are the JSON's and the bill's).

    :param at: When it arrived (the ledger's clock, seconds since the epoch by default).
    :param api: Its wire format (`chat_completions`, `responses`, `messages`).
    :param model: The model it asked for.
    :param window: The context window the decision used, when known.
    :param client_tokens: The request as the client sent it, in tokens: carried forward from the provider's counts
        where they tell it (see `client_size`), the proxy's estimate else.
    :param forwarded_tokens: What the proxy sent, by its estimate (after compaction when it compacted).
    :param prompt_tokens: The prompt tokens the provider reported (see `Reported`).
    :param cached_tokens: Of those, the ones it served from its cache.
    :param cache_write_tokens: Of those, the ones it wrote to its cache.
    :param output_tokens: The answer's tokens.
    :param client_reused_tokens: The client's request's tokens that repeat the prefix of its previous request, by
        the proxy's estimate: what a direct run's cache could have served.
    :param compaction: The compaction made of this request, None when none was.
    :param misses: `prompt_tokens - cached_tokens` by cause (`proxy.pipeline.cache_misses`).
    """

    at: float
    api: str
    model: str | None
    window: int | None
    client_tokens: int | None
    forwarded_tokens: int | None
    prompt_tokens: int
    cached_tokens: int
    cache_write_tokens: int
    output_tokens: int
    client_reused_tokens: int
    compaction: CompactionNote | None
    misses: Misses

    def as_json(self) -> dict[str, Any]:
        """The record as JSON: `compaction` null or an object, `misses` every cause with its tokens."""
        shown = {field.name: getattr(self, field.name) for field in fields(self)}
        compaction = self.compaction
        if compaction is not None:
            shown["compaction"] = {
                "strategies": list(compaction.strategies),
                "tokens_before": compaction.tokens_before,
                "tokens_after": compaction.tokens_after,
            }
        shown["misses"] = self.misses.as_dict()
        return shown


@dataclass(slots=True)
class Opening:
    """A request the ledger was told of before it was forwarded, for `Ledger.close` once it is answered.

    :param key: The conversation's key (a hash).
    :param at: When the request arrived.
    :param lifetime: How long its provider keeps a prefix (`proxy.pipeline.cache_misses.lifetime`).
    :param client_chain: The chain of the messages the client sent.
    :param api: Its wire format.
    :param model: Its model.
    :param tenant: Its tenant.
    :param client_end: The end of `client_chain`, made once for the comparisons at `expected` and `close`.
    """

    key: bytes
    at: float
    lifetime: float
    client_chain: Sequence[bytes]
    api: str
    model: str | None
    tenant: bytes
    client_end: ChainEnd

    @property
    def conversation(self) -> str:
        """The conversation's id, as the JSON and the header name it."""
        return self.key.hex()[:ID_HEX]


@dataclass(slots=True)
class Forwarded:
    """What the proxy sent for a request, as far as a prompt cache tells it from the previous one.

    :param chain: The chain of the messages sent (empty: the client's own, unchanged).
    :param tools_added: The proxy offered its read tool, so the tools were not the client's.
    """

    chain: Sequence[bytes]
    tools_added: bool = False


TOTALS: Final = (
    "client_tokens",
    "forwarded_tokens",
    "prompt_tokens",
    "cached_tokens",
    "cache_write_tokens",
    "output_tokens",
    "client_reused_tokens",
)
"""The record fields a conversation's totals sum."""

_totalled: Final = attrgetter(*TOTALS)
"""A record's `TOTALS`, in one call."""

_missed: Final = attrgetter(*CAUSES)
"""A record's misses by cause, in `CAUSES` order, in one call."""


@dataclass
class _Conversation:
    """One conversation's records, totals and what its next request is compared with (and none of its chains)."""

    id: str
    api: str
    model: str | None
    tenant: str
    records: deque[LedgerRecord]
    seen: deque[tuple[ChainEnd, int]]
    """The end of each kept request's client chain and its estimated tokens: what a later request reuses."""
    requests: int = 0
    compactions: int = 0
    first_seen: float = 0.0
    last_seen: float = 0.0
    totals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TOTALS, 0))
    misses: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0))
    previous: Sighting | None = None

    def reused(self, chain: Sequence[bytes]) -> int:
        """The tokens the client's request `chain` shares with its previous one, estimated.

        Those of the latest earlier request it extends, at most the previous one's: the estimate's steps are whole
        requests, so an edit reuses what the request before it sent.
        """
        if not self.seen:
            return 0
        latest = self.seen[-1][1]
        for end, tokens in reversed(self.seen):
            if end.continued_by(chain):
                return min(tokens, latest)
        return 0

    def add(self, record: LedgerRecord, sighting: Sighting) -> None:
        """Keep `record`, count it in the totals, and compare the next request with it (`sighting`)."""
        if not self.requests:
            self.first_seen = record.at
        self.records.append(record)
        self.seen.append((sighting.client, record.client_tokens or 0))
        self.requests += 1
        self.compactions += record.compaction is not None
        self.last_seen = record.at
        totals, misses = self.totals, self.misses
        for name, value in zip(TOTALS, _totalled(record), strict=True):
            if value:
                totals[name] += value
        for cause, tokens in zip(CAUSES, _missed(record.misses), strict=True):
            if tokens:
                misses[cause] += tokens
        self.previous = sighting

    def summary(self) -> dict[str, Any]:
        """The conversation without its records: who, when, how many requests, and its totals."""
        return {
            "id": self.id,
            "api": self.api,
            "model": self.model,
            "tenant": self.tenant,
            "requests": self.requests,
            "compactions": self.compactions,
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
            "totals": {**self.totals, "misses": dict(self.misses)},
        }


def client_size(
    previous: Sighting | None,
    opening: Opening,
    forwarded: Forwarded,
    reported: Reported,
    estimates: tuple[int | None, int | None],
) -> int | None:
    """The size of the request as the client sent it, in the provider's tokens where they tell it exactly.

    The decision's "tokens before" is measured after earlier compactions are replayed, so it drops after each one
    while the client's own history keeps growing; the client's size is carried forward instead:

    - forwarded as the client sent it (its messages and tools): the prompt tokens the provider reported;
    - else, continuing the client's previous request: that request's size plus this one's growth, which is the
      growth of the provider's count when the forwarded messages continue the previous forwarded ones too (a
      replayed compaction), else the growth of the proxy's estimate over what it forwarded before (a new
      compaction: the replayed prefix is the previous request's forwarded messages);
    - else (a first request the proxy rewrote, an edit of the client's history): the proxy's estimate.

    :param estimates: The decision's tokens before for this request, and the previous request's forwarded tokens.
    """
    before, previous_sent = estimates
    client = opening.client_chain
    sent = forwarded.chain or client
    if not forwarded.tools_added and len(sent) == len(client) and (not sent or sent[-1] == client[-1]):
        return reported.prompt_tokens
    if previous is None or previous.client_tokens is None or not _extends(previous.client, client):
        return before
    if _extends(previous.forwarded, sent) and previous.tools_added == forwarded.tools_added:
        return previous.client_tokens + reported.prompt_tokens - previous.prompt_tokens
    if before is None or previous_sent is None:
        return before
    return previous.client_tokens + before - previous_sent


def _extends(end: ChainEnd, chain: Sequence[bytes]) -> bool:
    """Whether `chain` holds the whole chain `end` ends, unchanged, and more after it."""
    return 0 < end.length < len(chain) and chain[end.length - 1] == end.last


class Ledger:
    """The recent conversations' records (see the module docstring).

    :param clock: Gives `at` and the gaps between requests; a test passes a fake one (shared with the fake upstream's
        prompt cache) and advances it instead of waiting.
    :param conversations: How many conversations are kept.
    :param requests: How many records each keeps.
    """

    def __init__(
        self, clock: Clock = time.time, *, conversations: int = DEFAULT_CONVERSATIONS, requests: int = DEFAULT_REQUESTS
    ) -> None:
        self.clock = clock
        self.max_conversations = conversations
        self.max_requests = requests
        self._conversations: OrderedDict[bytes, _Conversation] = OrderedDict()

    def open(
        self,
        *,
        scope: bytes,
        named: str | None,
        opening: bytes | None,
        client_chain: Sequence[bytes],
        api: str,
        model: str | None,
        tenant: bytes,
        lifetime: float,
    ) -> Opening | None:
        """Note a request about to be forwarded; None when nothing identifies its conversation.

        :param named: The conversation the client names in a header, if it names one.
        :param opening: What identifies it otherwise: a digest of its opening (see `proxy.pipeline.ledger_entries`).
        :param client_chain: The chain of the messages the client sent (empty when not known).
        """
        if named:
            key = xxh3_128_digest(scope + b"\0named\0" + named.encode("utf-8", "surrogatepass"))
        elif opening:
            key = xxh3_128_digest(scope + b"\0opening\0" + opening)
        else:
            return None
        return Opening(key, self.clock(), lifetime, client_chain, api, model, tenant, ChainEnd.of(client_chain))

    def expected(self, opening: Opening, forwarded: Forwarded) -> tuple[str, ...]:
        """The causes that apply to the request before its answer says how much missed (for its response header)."""
        conversation = self._conversations.get(opening.key)
        previous = conversation.previous if conversation is not None else None
        if previous is None:
            return expected(None, opening.lifetime)
        now = self._sighting(opening, forwarded, None, 0)
        step = Step.between(previous, now, (opening.client_chain, forwarded.chain), 0)
        return expected(step, opening.lifetime)

    def previous_at(self, opening: Opening) -> float | None:
        """When the previous request of `opening`'s conversation arrived (None: it is the first kept)."""
        conversation = self._conversations.get(opening.key)
        previous = conversation.previous if conversation is not None else None
        return previous.at if previous is not None else None

    def close(
        self,
        opening: Opening,
        forwarded: Forwarded,
        reported: Reported,
        *,
        window: int | None,
        client_tokens: int | None,
        forwarded_tokens: int | None,
        compaction: CompactionNote | None,
    ) -> LedgerRecord:
        """Record the answered request and attribute its misses (see `proxy.pipeline.cache_misses`)."""
        conversation = self._conversation(opening)
        previous_sent = conversation.records[-1].forwarded_tokens if conversation.records else None
        client_tokens = client_size(conversation.previous, opening, forwarded, reported, (client_tokens, previous_sent))
        now = self._sighting(opening, forwarded, client_tokens, reported.prompt_tokens)
        reused = conversation.reused(opening.client_chain)
        previous = conversation.previous
        step = None
        if previous is not None:
            step = Step.between(previous, now, (opening.client_chain, forwarded.chain), reused)
        record = LedgerRecord(
            at=opening.at,
            api=opening.api,
            model=opening.model,
            window=window,
            client_tokens=client_tokens,
            forwarded_tokens=forwarded_tokens,
            prompt_tokens=reported.prompt_tokens,
            cached_tokens=reported.cached_tokens,
            cache_write_tokens=reported.cache_write_tokens,
            output_tokens=reported.output_tokens,
            client_reused_tokens=reused,
            compaction=compaction,
            misses=attribute(reported, step, opening.lifetime),
        )
        conversation.add(record, now)
        return record

    def recent(self) -> list[dict[str, Any]]:
        """Every conversation kept, the most recently seen first, without records (`/dashboard/conversations.json`)."""
        kept = sorted(self._conversations.values(), key=lambda conversation: conversation.last_seen, reverse=True)
        return [conversation.summary() for conversation in kept if conversation.requests]

    def conversation(self, conversation_id: str) -> dict[str, Any] | None:
        """One conversation with its records, oldest first; None when none kept has that id."""
        for conversation in self._conversations.values():
            if conversation.id == conversation_id and conversation.requests:
                records = [record.as_json() for record in conversation.records]
                return {**conversation.summary(), "records": records, "dropped": conversation.requests - len(records)}
        return None

    def records(self, conversation_id: str | None = None) -> dict[str, tuple[LedgerRecord, ...]]:
        """The kept records of every conversation kept, or of the one with that id, by id (what its bill reads).

        A snapshot, so a bill can be made of it in another thread while requests add records.
        """
        return {
            conversation.id: tuple(conversation.records)
            for conversation in self._conversations.values()
            if conversation.requests and conversation_id in {None, conversation.id}
        }

    def _conversation(self, opening: Opening) -> _Conversation:
        """The conversation of `opening`, made the most recently seen (created, and the oldest forgotten, if new)."""
        conversation = self._conversations.get(opening.key)
        if conversation is not None:
            self._conversations.move_to_end(opening.key)
            return conversation
        tenant = opening.tenant.hex()[:TENANT_HEX]
        records: deque[LedgerRecord] = deque(maxlen=self.max_requests)
        seen: deque[tuple[ChainEnd, int]] = deque(maxlen=self.max_requests)
        conversation = _Conversation(opening.conversation, opening.api, opening.model, tenant, records, seen)
        self._conversations[opening.key] = conversation
        while len(self._conversations) > self.max_conversations:
            self._conversations.popitem(last=False)
        return conversation

    @staticmethod
    def _sighting(opening: Opening, forwarded: Forwarded, client_tokens: int | None, prompt_tokens: int) -> Sighting:
        client = opening.client_end
        sent = ChainEnd.of(forwarded.chain) if forwarded.chain else client
        return Sighting(opening.at, client, sent, client_tokens, prompt_tokens, forwarded.tools_added)
