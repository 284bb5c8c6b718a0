"""Answering the model's reads: the offloaded text, found under the caller's tenant only, within the request's bounds.

A reference is a content hash: it names a text but grants nothing. The store is asked under the tenant of the
request the model is answering, so a reference from another tenant's conversation (or a guess) finds nothing, and the
model is told so in the tool's result, the same way as for an expired one.

Every round re-sends everything read before it, so what one request's rounds cost is bounded here, whatever the
model asks: each text is sent at most once per request (a later read of the same reference is told it was read
above), and a read whose text would take the next round's request past `max_body_bytes`, or past the window's room
counting what is read, is answered with a short "too large" result instead. When even the model's calls with short
results do not fit, the round asks for an answer without tools (`tool_choice: none`) and reads nothing.

A result the store no longer holds (evicted, expired, lost with a Redis) is not lost while its conversation goes on:
the client re-sends the original in full every turn, and the rewrite replayed on it still points at it. A read of a
reference the forwarded request holds that the store misses is answered from the request's own tool results (the
one whose text, as sent or losslessly rewritten as it was offloaded, has that reference) and stored again, so the rest
of the conversation reads it from the store. Only the request's own references are looked for, in its own messages:
nothing of another tenant's can be found this way, and a guessed reference costs no search.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Final

import orjson

from proxy.engine.counting import TokenCounter
from proxy.engine.json_bytes import json_bytes
from proxy.engine.messages import Message, content_text, is_tool_result, role_of
from proxy.engine.strategies.json_minify import minified
from proxy.engine.strategies.offload import content_reference
from proxy.engine.strategies.repeated_lines import collapsed
from proxy.failures import log_failure
from proxy.pipeline.metrics import CompactionMetrics
from proxy.pipeline.offload.rounds import asked_again, without_tools
from proxy.pipeline.wire import Reads, WireFormat
from proxy.state import StateStore

logger = logging.getLogger("compaction_proxy.compaction")

NOT_HELD: Final = (
    "No offloaded result is held under this reference (it may have expired). Continue without it, or run the original "
    "tool again if you need its output."
)
"""The read tool's result when the reference names nothing this caller offloaded."""

REPEATED: Final = "This result was already read above: the earlier read call with the same reference holds its text."
"""The read tool's result for a reference whose text an earlier round of the same request holds."""

TOO_LARGE: Final = (
    "This offloaded result is too large to read back now: with it the request would not fit the model's window. "
    "Continue with its digest, or run the original tool again for the part you need."
)
"""The read tool's result when its text would take the next round's request past its bounds."""

_RESERVED: Final = max(NOT_HELD, REPEATED, TOO_LARGE, key=len)
"""What every read call is counted as before its text is known: the longest short result."""

RESULT_FRAMING_BYTES: Final = 96
"""Bytes a result costs in the request besides its text and call id (the message or item around it), at most."""

RESULT_FRAMING_TOKENS: Final = 16
"""Tokens a result costs besides its text and call id (a message's framing is 3 to 4), at most."""

READS_HEADER: Final = "X-Compaction-Reads"
"""Response header: how many reads the proxy answered with the held text for this request."""

NOT_HELD_HEADER: Final = "X-Compaction-Reads-Not-Held"
"""Response header: how many reads the proxy answered "not held" (expired, another tenant's, or a guess)."""


@dataclass(frozen=True)
class ReadLimits:
    """What the read rounds of one request may use.

    :param rounds: Most read rounds answered (`offload_read_rounds`).
    :param per_answer: Most distinct reads answered from one model answer (`offload_reads_per_answer`).
    :param max_bytes: The most bytes a round's request may have (`max_body_bytes`).
    :param room: The most prompt tokens a round's request may have (the window less the reply's reservation), None
        when the window is not known.
    """

    rounds: int
    per_answer: int
    max_bytes: int
    room: int | None = None


@dataclass(frozen=True)
class Round:
    """The request asking again after one answer's reads.

    :param body: What to send upstream.
    :param served: Reads answered with their held text.
    :param not_held: Reads answered `NOT_HELD`.
    :param final: It asks for an answer without tools: nothing could be read back (it would not fit).
    """

    body: bytes
    served: int = 0
    not_held: int = 0
    final: bool = False


class ReadBack:
    """What the server needs to answer the read tool for one request, and what its rounds have used so far.

    :param tenant: The caller's tenant: the only scope reads look in.
    :param store: Where offloaded results live.
    :param wire: The request's wire format.
    :param limits: The bounds of its rounds.
    :param metrics: Where reads are counted.
    :param counter: Counts the tokens of what is read.
    :param tokens: The estimated prompt tokens of the forwarded request, None when unknown (no token bound then).
    :param held: The references of the offloaded results the forwarded request holds.
    :param originals: The request's messages as the client sent them, where a result the store misses is found.
    """

    def __init__(
        self,
        tenant: bytes,
        store: StateStore,
        wire: WireFormat,
        limits: ReadLimits,
        metrics: CompactionMetrics,
        *,
        counter: TokenCounter,
        tokens: int | None,
        held: frozenset[str] = frozenset(),
        originals: Callable[[], Awaitable[Sequence[Message]]] | None = None,
    ) -> None:
        self.tenant = tenant
        self.store = store
        self.wire = wire
        self.limits = limits
        self.metrics = metrics
        self.counter = counter
        self.tokens = tokens if limits.room is not None else None
        self.held = held
        self.originals = originals
        self.read: set[str] = set()
        self.served = 0
        self.not_held = 0

    @property
    def rounds(self) -> int:
        """Most read rounds answered."""
        return self.limits.rounds

    def report(self) -> dict[str, str]:
        """The response headers saying what was read for the request."""
        return {READS_HEADER: str(self.served), NOT_HELD_HEADER: str(self.not_held)}

    def took(self, round_: Round) -> None:
        """The upstream accepted this round's request: its reads count as answered."""
        self.served += round_.served
        self.not_held += round_.not_held

    async def next_round(self, body: bytes, reads: Reads, *, last: bool) -> Round:
        """The request after `body` answering `reads` within the limits (see the module docstring).

        :param last: No more reads will be answered: the request asks for an answer without tools.
        """
        self._count("left_out", reads.left_out)
        appended = json_bytes(reads.appended)
        size = len(body) + len(appended) + sum(self._bytes(call_id, _RESERVED) for call_id, _ in reads.calls)
        tokens = self._with_calls(self.tokens, appended.decode(), reads)
        if not self._fits(size, tokens):
            self._count("too_large", len(reads.calls))
            return Round(without_tools(body, self.wire), final=True)
        results: list[str] = []
        outcomes: list[str] = []
        for call_id, reference in reads.calls:
            text, outcome = await self._answer(reference)
            if outcome == "served":
                admitted = self._admitted(
                    size + self._bytes(call_id, text) - self._bytes(call_id, _RESERVED), tokens, text
                )
                if admitted is None:
                    text, outcome = TOO_LARGE, "too_large"
                else:
                    size, tokens = admitted
                    self.read.add(str(reference))
            self._count(outcome)
            outcomes.append(outcome)
            results.append(text)
        asked = asked_again(body, self.wire, reads, results, last=last)
        if len(asked) > self.limits.max_bytes:  # what the accounting above cannot miss by much, checked anyway
            return Round(without_tools(body, self.wire), final=True)
        if tokens is not None:
            self.tokens = tokens
        return Round(asked, outcomes.count("served"), outcomes.count("not_held"))

    def _admitted(self, size: int, tokens: int | None, text: str) -> tuple[int, int | None] | None:
        """The request's bytes and tokens with `text` read (`size` counts it already), or None when it would not fit.

        Its bytes are compared first, so a text too large by bytes is never tokenized.
        """
        if size > self.limits.max_bytes:
            return None
        more = None if tokens is None else tokens + self.counter.text_tokens(text)
        return (size, more) if self._fits(size, more) else None

    async def _answer(self, reference: str | None) -> tuple[str, str]:
        """The text answering a read of `reference` before any bound is applied, and what it is."""
        if reference is not None and reference in self.read:
            return REPEATED, "repeated"
        text = await self._text(reference) if reference else None
        if text is None and reference in self.held:
            text = (await self._restore({reference})).get(reference)
        return (NOT_HELD, "not_held") if text is None else (text, "served")

    async def _restore(self, references: set[str]) -> dict[str, str]:
        """The texts of these held references found in the re-sent originals, stored again under the tenant.

        When storing them fails (logged, counted), they still answer this request's reads.
        """
        if self.originals is None:
            return {}
        restored = await asyncio.to_thread(resent_originals, await self.originals(), references)
        if not restored:
            return restored
        try:
            await self.store.save_offloaded(self.tenant, restored)
        except Exception as error:
            log_failure(logger, "Storing re-sent offloaded results again failed; they answer this request only.", error)
            self.metrics.errors.inc()
        else:
            self.metrics.offload_restored.inc(len(restored))
        return restored

    async def _text(self, reference: str) -> str | None:
        """The text under `reference`; None also when the store fails (logged, counted): the model is told so."""
        try:
            return await self.store.offloaded(self.tenant, reference)
        except Exception as error:
            log_failure(logger, "Reading an offloaded result failed; the model is told it is not held.", error)
            self.metrics.errors.inc()
            return None

    def _fits(self, size: int, tokens: int | None) -> bool:
        room = self.limits.room
        return size <= self.limits.max_bytes and (tokens is None or room is None or tokens <= room)

    @staticmethod
    def _bytes(call_id: str, text: str) -> int:
        """The bytes a result of `text` for `call_id` adds to a request, at most."""
        return len(orjson.dumps(text)) + len(call_id.encode()) + RESULT_FRAMING_BYTES

    def _with_calls(self, tokens: int | None, appended: str, reads: Reads) -> int | None:
        """`tokens` with the model's appended output and a short result for every read call, at most."""
        if tokens is None:
            return None
        each = self.counter.text_tokens(_RESERVED) + RESULT_FRAMING_TOKENS
        ids = sum(len(call_id.encode()) for call_id, _ in reads.calls)  # a token is at least one byte
        return tokens + self.counter.text_tokens(appended) + each * len(reads.calls) + ids

    def _count(self, outcome: str, times: int = 1) -> None:
        if times:
            self.metrics.offload_reads.labels(outcome).inc(times)


def resent_originals(messages: Sequence[Message], references: Collection[str]) -> dict[str, str]:
    """The texts, among the tool results and user messages of `messages`, that were offloaded under these references.

    A result is offloaded as sent, JSON-minified when `json_minify` rewrote it first, or with its repeated lines
    collapsed when `repeated_lines` did: all are tried (a user message, which the user message window offloads, too).
    One pass, hashing each message at most three times; it stops once every reference is found.
    """
    found: dict[str, str] = {}
    for message in messages:
        if len(found) == len(references):
            break
        if not (is_tool_result(message) or role_of(message) == "user"):
            continue
        text = content_text(message)
        for candidate in (text, minified(text), collapsed(text)):
            if candidate and (reference := content_reference(candidate)) in references:
                found[reference] = candidate
                break
    return found
