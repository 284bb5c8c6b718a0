"""What goes upstream for a chat completion: the body to send, and the headers telling the client what was done.

The client's own bytes are forwarded whenever nothing changed. A stream is asked for its usage (the proxy needs it
to anchor the next request) by splicing `stream_options.include_usage` into those bytes when possible; the server
then strips the usage chunk the client did not ask for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from proxy.chat.request import ChatRequest
from proxy.engine import Outcome, Thresholds
from proxy.engine.json_bytes import json_bytes
from proxy.engine.messages import Message

_USAGE_OPTION: Final = b',"stream_options":{"include_usage":true}}'

WINDOW_SOURCE_HEADER: Final = "X-Compaction-Window-Source"
"""Response header saying where the request's window came from (`proxy.windows.WindowSource`)."""

INSTRUCTIONS_HEADER: Final = "X-Compaction-Instructions"
"""Response header saying that the leading instructions and the tools alone reach the target (`over-target`: the
rest was compacted as far as the rules allow) or exceed the window (`over-window`: forwarded as it came)."""


def asks_for_usage(body: Mapping[str, Any]) -> bool:
    """Whether the request already asks a stream for its usage chunk."""
    options = body.get("stream_options")
    return isinstance(options, Mapping) and options.get("include_usage") is True


def forwarded_body(raw: bytes, request: ChatRequest, messages: list[Message] | None, *, ask_usage: bool) -> bytes:
    """The body to send: `raw` when `messages` is None (unchanged), else the request with those messages.

    :param ask_usage: Also set `stream_options.include_usage` (keeping the client's other stream options).
    """
    if keeps_client_bytes(request, messages, ask_usage=ask_usage):
        if not ask_usage:
            return raw
        stripped = raw.rstrip()
        if stripped.endswith(b"}"):
            return stripped[:-1] + _USAGE_OPTION
    return json_bytes(forwarded_fields(request, messages, ask_usage=ask_usage))


def keeps_client_bytes(request: ChatRequest, messages: list[Message] | None, *, ask_usage: bool) -> bool:
    """Whether the body sent is the client's own bytes (with `include_usage` spliced in at their end at most)."""
    return messages is None and not (ask_usage and "stream_options" in request.body)


def forwarded_fields(request: ChatRequest, messages: list[Message] | None, *, ask_usage: bool) -> dict[str, Any]:
    """The fields of a body the proxy serializes itself: the request's, with `messages` (its own when None)."""
    fields = dict(request.body)
    if ask_usage:
        options = request.body.get("stream_options")
        fields["stream_options"] = {**(options if isinstance(options, Mapping) else {}), "include_usage": True}
    fields["messages"] = request.messages if messages is None else messages
    return fields


INVALID_WINDOW_WARNING: Final = "X-Context-Window ignored: not a positive integer"
"""`X-Compaction-Warning` when a request's `X-Context-Window` is not a window: the request is served as without it."""


def requested_window(value: str | None) -> tuple[int | None, str | None]:
    """The window an `X-Context-Window` header asks for, and the warning to answer when it asks for none.

    :returns: `(tokens, None)` for a positive integer, `(None, None)` when absent, `(None, warning)` otherwise.
    """
    if value is None:
        return None, None
    text = value.strip()
    if len(text) <= 12 and text.isascii() and text.isdigit() and int(text) > 0:
        return int(text), None
    return None, INVALID_WINDOW_WARNING


def report_headers(outcome: Outcome, thresholds: Thresholds, *, observed: bool = False) -> dict[str, str]:
    """Response headers telling the client what was decided.

    `X-Compaction-Tokens-Before` is always an integer; `X-Compaction-Tokens-Before-Bound: true` says it is an upper
    bound (a request clearly under the trigger is sized by its bytes, not tokenized). `X-Compaction-Reserved` gives the
    reply's reservation when it, not `compact_at`, set the trigger of a compaction. `X-Compaction-Instructions` says
    when the leading instructions and the tools alone leave no room (see `proxy.engine.Room`).

    A request of a client that compacts itself, forwarded without compacting, is `deferred`.

    :param observed: Observe mode: what compaction would have done is reported as `would-compact`, never `compacted`.
    """
    decision = outcome.decision
    compacted = "would-compact" if observed else "compacted"
    headers = {
        "X-Compaction": compacted if outcome.result else left_as_sent(thresholds),
        "X-Compaction-Context-Window": str(thresholds.context_window),
        "X-Compaction-Tokens-Before": str(decision.estimated_tokens),
    }
    if decision.bounded:
        headers["X-Compaction-Tokens-Before-Bound"] = "true"
    if outcome.room is not None:
        headers[INSTRUCTIONS_HEADER] = outcome.room.value
    if outcome.result:
        headers["X-Compaction-Tokens-After"] = str(outcome.tokens_after)
        headers["X-Compaction-Strategies"] = ",".join(outcome.result.strategies)
        if thresholds.reservation_decides:
            headers["X-Compaction-Reserved"] = str(thresholds.reserved_tokens)
    return headers


def left_as_sent(thresholds: Thresholds) -> str:
    """What a request forwarded without compacting is reported as: `deferred` to a client that compacts itself."""
    return "deferred" if thresholds.client_compacts else "unchanged"
