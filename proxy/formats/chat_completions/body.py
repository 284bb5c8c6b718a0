"""What goes upstream for a chat completion: the body to send.

The client's own bytes are forwarded whenever nothing changed. A stream is asked for its usage (the proxy needs it
to anchor the next request) by splicing `stream_options.include_usage` into those bytes when possible; the server
then strips the usage chunk the client did not ask for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from proxy.engine.json_bytes import json_bytes
from proxy.engine.messages import Message
from proxy.formats.chat_completions.request import ChatRequest

_USAGE_OPTION: Final = b',"stream_options":{"include_usage":true}}'


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
