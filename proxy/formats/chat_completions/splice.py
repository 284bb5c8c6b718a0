"""Work proportional to what is new: a conversation's next request recognized in its bytes and spliced.

An agent re-sends its whole history every turn, so the next request of a conversation is usually the last one with
messages inserted before the `]` that closes `messages`, every other byte unchanged. For each conversation the
proxy remembers the last request's raw body, where its last message ends, what the full path made of it (the
parsed request, the upstream's view, the body it forwarded). A new request that starts with exactly the remembered
bytes up to that offset and ends with exactly the remembered bytes after it is that request plus what lies
between: two memory compares, then only the inserted bytes are parsed.

The proxy then works on the new messages only: the parsed request is the remembered one with them appended, the
view extends the remembered view (`RewriteMemory.extended_view`), token counts already made are reused, and a body
the proxy serializes itself is the remembered one with the new messages serialized into it. Every step checks what
it relies on and does the full work when it does not hold, so the result is always exactly the full path's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from operator import is_
from typing import Any, Final

import orjson
from xxhash import xxh3_128_digest

from proxy.engine.json_bytes import json_bytes
from proxy.engine.messages import Message
from proxy.engine.transcript import Counts
from proxy.failures import log_failure
from proxy.formats.chat_completions.body import forwarded_body, forwarded_fields, keeps_client_bytes
from proxy.formats.chat_completions.raw_messages import appended_messages, messages_end, opening_ends
from proxy.formats.chat_completions.request import ChatRequest
from proxy.pipeline.byte_bound import SIZED_BELOW_BYTES
from proxy.pipeline.known_prefixes import BYTES_PER_MESSAGE, DEFAULT_MAX_CONVERSATIONS, RecentByOpening
from proxy.pipeline.off_loop import OffLoop
from proxy.pipeline.requests import RequestLimits, RequestOverLimit, content_parts, nests_too_deep
from proxy.pipeline.rewrites import Keyed, View
from proxy.pipeline.turn import Turn

logger = logging.getLogger("compaction_proxy.compaction")

MESSAGE_DEPTH: Final = 3
"""The nesting level of a message in a body: in the `messages` array, in the body's object."""

SPLICE_FROM_BYTES: Final = SIZED_BELOW_BYTES
"""Bodies from this size are recognized from their bytes. A smaller one parses faster than its opening messages are
scanned (a 12 KiB body parses in 7 us; finding its first two messages takes 17 us), and the two paths cost the same
at about 30 KiB."""


@dataclass(frozen=True)
class Forwarded:
    """A body the proxy serialized itself (a rewritten view, stream options added): what a splice extends.

    :param body: The bytes sent upstream.
    :param messages: The messages serialized in it, the very objects.
    :param end: Where the last of them ends in `body`.
    :param ask_usage: Whether `include_usage` was added to it.
    :param tools: The `tools` serialized in it: the proxy adds its read tool to a conversation once it holds offloaded
        results, so a request extending this one may need other tools than its bytes show.
    """

    body: bytes
    messages: list[Message]
    end: int
    ask_usage: bool
    tools: Any = None

    def extended_by(self, request: ChatRequest, messages: list[Message], *, ask_usage: bool) -> bool:
        """Whether the body for `messages` (of a request extending this one's) is this body with messages added."""
        return (
            self.ask_usage == ask_usage
            and self.tools == request.body.get("tools")
            and _starts_with(messages, self.messages)
        )


@dataclass(frozen=True)
class LastRequest:
    """A conversation's last request as the proxy handled it.

    :param raw: The client's body.
    :param end: Where its last message ends in `raw`.
    :param request: `raw` parsed.
    :param content_parts: The content parts of its messages (checked against the limits with the new ones).
    :param keyed: Its messages' keys and chain.
    :param view: The upstream's view it was decided on, when no compaction changed it (the next view extends it).
    :param counted: The view's token counts made for the decision (None where not counted).
    :param forwarded: The body sent, when the proxy serialized it.
    :param anchored_at: Where the usage anchor of what was sent was found (the next lookup starts there).
    """

    raw: bytes
    end: int
    request: ChatRequest
    content_parts: int
    keyed: Keyed | None
    view: View | None
    counted: Counts | None
    forwarded: Forwarded | None
    anchored_at: int | None = None

    def inserted(self, raw: bytes) -> bytes | None:
        """The bytes `raw` holds between this request's last message and its tail, if it has both exactly."""
        tail = len(self.raw) - self.end
        if len(raw) < len(self.raw) or not raw.endswith(memoryview(self.raw)[self.end :]):
            return None
        if not raw.startswith(memoryview(self.raw)[: self.end]):
            return None
        return raw[self.end : len(raw) - tail]


@dataclass(frozen=True)
class Extension:
    """A request recognized from its bytes as a remembered one plus new messages (none when re-sent as it was).

    :param previous: The remembered request.
    :param request: The request, exactly as parsing its whole body gives it.
    :param end: Where its last message ends in its body.
    :param content_parts: The content parts of all its messages.
    """

    previous: LastRequest
    request: ChatRequest
    end: int
    content_parts: int

    @property
    def added_bytes(self) -> int:
        """What the request added to the remembered one, in bytes."""
        return self.end - self.previous.end


class Splices:
    """The last request of recent conversations, per scope, and the extensions recognized against them.

    A conversation is found by its opening: its body's bytes up to the end of its second message (its first when it
    has one), which hold the system prompt and the task, so the runs of one agent rarely share one.

    Like the rest of compaction it fails open: an error of its own is logged, counted with `on_failure`, and the
    request takes the full path.

    :param limits: The proxy's limits: an extension over them is left to the full path, which refuses it.
    :param max_bytes: What the remembered requests may cost together, each charged twice its body (the bytes and
        the parsed request), the body the proxy serialized for it, and `BYTES_PER_MESSAGE` per message.
    :param on_failure: Counts an error of the shortcut.
    """

    def __init__(self, limits: RequestLimits, max_bytes: int, on_failure: Callable[[], None]) -> None:
        self.limits = limits
        self.on_failure = on_failure
        self._recent: RecentByOpening[LastRequest] = RecentByOpening(DEFAULT_MAX_CONVERSATIONS, max_bytes)

    async def recognize(
        self, scope: bytes, raw: bytes, off_loop: OffLoop
    ) -> tuple[Extension | None, tuple[int, ...] | None]:
        """The request as a remembered one plus new messages, when its bytes say so (None to parse it in full).

        :returns: That, and where the body's first messages end (`opening_ends`), for `remember` to reuse.
        """
        openings = None
        try:
            openings = opening_ends(raw)
            matched = self.match(scope, raw, openings)
            if matched is None:
                return None, openings
            previous, inserted = matched
            return await off_loop.run(len(inserted), lambda: self.extension(previous, inserted)), openings
        except Exception as error:
            self._failed("Recognizing a re-sent conversation failed; it is parsed in full.", error)
            return None, openings

    def match(self, scope: bytes, raw: bytes, openings: tuple[int, ...]) -> tuple[LastRequest, bytes] | None:
        """The remembered request `raw` extends and the bytes it inserts, comparing bytes only.

        :param openings: Where the body's first messages end (`opening_ends(raw)`).
        """
        for end in reversed(openings):
            for previous in self._recent.candidates(_opening(scope, raw, end)):
                inserted = previous.inserted(raw)
                if inserted is not None:
                    return previous, inserted
        return None

    def extension(self, previous: LastRequest, inserted: bytes) -> Extension | None:
        """The request `previous` plus the messages in `inserted` (CPU work: a parse of `inserted`).

        None when the bytes are not one or more message objects, or when the request would be over the limits or
        nest too deep (see `proxy.pipeline.requests.MAX_JSON_DEPTH`).
        """
        added = appended_messages(inserted) if inserted else []
        if added is None or nests_too_deep(added, MESSAGE_DEPTH):
            return None  # the full path judges it
        known = previous.request.messages
        parts = previous.content_parts + content_parts(added)
        try:
            self.limits.check_counts(len(known) + len(added), parts)
        except RequestOverLimit:
            return None  # the full path refuses it, with its own answer
        request = previous.request
        if added:
            messages = [*known, *added]
            request = ChatRequest({**request.body, "messages": messages}, messages)
        return Extension(previous, request, previous.end + len(inserted), parts)

    async def remember(
        self,
        scope: bytes,
        raw: bytes,
        request: ChatRequest,
        turn: Turn,
        off_loop: OffLoop,
        *,
        openings: tuple[int, ...] | None = None,
    ) -> None:
        """Remember the request for the conversation's next turn.

        A body seen for the first time is proven (`messages_end`) off the event loop when it is large.

        :param openings: `opening_ends(raw)`, when `recognize` found it already.
        """
        try:
            await off_loop.run(turn.new_bytes(len(raw)), lambda: self._remember(scope, raw, request, turn, openings))
        except Exception as error:
            self._failed("Remembering a request failed; the conversation's next one is parsed in full.", error)

    def _failed(self, message: str, error: Exception) -> None:
        log_failure(logger, message, error)
        self.on_failure()

    def _remember(
        self, scope: bytes, raw: bytes, request: ChatRequest, turn: Turn, openings: tuple[int, ...] | None
    ) -> None:
        cost = 2 * len(raw) + BYTES_PER_MESSAGE * len(request.messages)
        if turn.forwarded is not None:
            cost += len(turn.forwarded.body)
        if not self._recent.admits(cost):
            return
        extension = _extension_of(turn)
        end = extension.end if extension else messages_end(raw, request.body)
        openings = opening_ends(raw) if openings is None else openings
        if end is None or not openings:
            return
        parts = extension.content_parts if extension else content_parts(request.messages)
        last = LastRequest(
            raw, end, request, parts, turn.keyed, turn.view, turn.counted, turn.forwarded, turn.anchored_at
        )
        replacing = extension.previous if extension else None
        self._recent.remember(_opening(scope, raw, openings[-1]), last, cost, replacing=replacing)


def forward(
    extension: Extension | None,
    raw: bytes,
    request: ChatRequest,
    messages: list[Message] | None,
    *,
    ask_usage: bool,
) -> tuple[bytes, Forwarded | None]:
    """`forwarded_body`, splicing a remembered serialized body when this request extends it (CPU work).

    :returns: The body, and what a later splice needs when the proxy serialized it.
    """
    if keeps_client_bytes(request, messages, ask_usage=ask_usage):
        return forwarded_body(raw, request, messages, ask_usage=ask_usage), None
    sent = request.messages if messages is None else messages
    earlier = extension.previous.forwarded if extension else None
    if earlier is not None and earlier.extended_by(request, sent, ask_usage=ask_usage):
        added = sent[len(earlier.messages) :]
        if not added:
            return earlier.body, earlier
        inserted = b"," + orjson.dumps(added)[1:-1]
        body = b"".join((memoryview(earlier.body)[: earlier.end], inserted, memoryview(earlier.body)[earlier.end :]))
        return body, Forwarded(body, sent, earlier.end + len(inserted), ask_usage, earlier.tools)
    fields = forwarded_fields(request, messages, ask_usage=ask_usage)
    body = json_bytes(fields)
    end = len(body) - len(_after_messages(fields))
    spliceable = sent and body[end - 1 : end] == b"}"
    return body, Forwarded(body, sent, end, ask_usage, request.body.get("tools")) if spliceable else None


class ChatSplicing:
    """Chat completions' `ByteSplicing` (see `proxy.pipeline.capabilities` for what each member means)."""

    from_bytes: int = SPLICE_FROM_BYTES

    def memory(self, limits: RequestLimits, max_bytes: int, on_failure: Callable[[], None]) -> Splices:
        """An empty `Splices`."""
        return Splices(limits, max_bytes, on_failure)

    def forward(
        self, turn: Turn, raw: bytes, request: ChatRequest, messages: list[Message] | None, *, ask_usage: bool
    ) -> tuple[bytes, Forwarded | None]:
        """See `forward`."""
        return forward(_extension_of(turn), raw, request, messages, ask_usage=ask_usage)

    def splices(self, turn: Turn, messages: list[Message]) -> bool:
        """Whether the body serialized for `messages` starts with the very messages of the last one serialized."""
        extension = _extension_of(turn)
        earlier = extension.previous.forwarded if extension else None
        return earlier is not None and _starts_with(messages, earlier.messages)


def _extension_of(turn: Turn) -> Extension | None:
    """The turn's continuation as `Splices` recognized it (a chat request's is only ever one of these)."""
    return turn.extension if isinstance(turn.extension, Extension) else None


def _opening(scope: bytes, raw: bytes, end: int) -> bytes:
    return scope + xxh3_128_digest(memoryview(raw)[:end])


def _starts_with(messages: list[Message], known: list[Message]) -> bool:
    """Whether `messages` starts with the very objects of `known`: equal dicts could still serialize differently."""
    return 0 < len(known) <= len(messages) and messages[len(known) - 1] is known[-1] and all(map(is_, messages, known))


def _after_messages(fields: dict[str, object]) -> bytes:
    """What `orjson.dumps(fields)` holds after its last message: `]`, then the fields after `messages`, then `}`."""
    names = list(fields)
    after = {name: fields[name] for name in names[names.index("messages") + 1 :]}
    return b"]" + (b"," + orjson.dumps(after)[1:] if after else b"}")
