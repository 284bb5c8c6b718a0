"""OpenAI Chat Completions messages: the engine's lingua franca.

A message is the plain dict a client sends in `messages`: roles `system`, `developer`, `user`, `assistant`, `tool`
and the legacy `function`; `content` as a string, as a list of parts (`text`, `image_url`, `input_audio`, `file`,
`refusal`) or null; assistant `tool_calls` and legacy `function_call`; tool `tool_call_id`. Fields the engine does not
know are carried through untouched. The helpers here read messages; nothing in the engine ever writes to one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from functools import lru_cache
from typing import Any

import orjson

Message = Mapping[str, Any]
"""One OpenAI Chat Completions message, as the client sent it."""

INSTRUCTION_ROLES = frozenset({"system", "developer"})
TOOL_RESULT_ROLES = frozenset({"tool", "function"})

MessageKey = bytes
"""A stable 16-byte digest of a message's normalized form (see `message_key`)."""


def role_of(message: Message) -> str:
    """The message's role, or an empty string when it has none (the provider will reject it, not us)."""
    role = message.get("role")
    return role if isinstance(role, str) else ""


def is_tool_result(message: Message) -> bool:
    """Whether the message answers a tool call (`tool`) or a legacy function call (`function`)."""
    return role_of(message) in TOOL_RESULT_ROLES


def tool_calls_of(message: Message) -> list[Mapping[str, Any]]:
    """The well-formed entries of an assistant message's `tool_calls`, in order."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [call for call in calls if isinstance(call, Mapping)]


def tool_name_of_call(call: Mapping[str, Any]) -> str:
    """The function name of one `tool_calls` entry, or an empty string."""
    function = call.get("function")
    name = function.get("name") if isinstance(function, Mapping) else None
    return name if isinstance(name, str) else ""


def content_texts(message: Message) -> Iterator[str]:
    """Every piece of text in the message's `content`: the string itself, or each `text` and `refusal` part."""
    content = message.get("content")
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if not isinstance(part, Mapping):
                continue
            for key in ("text", "refusal"):
                value = part.get(key)
                if isinstance(value, str):
                    yield value


def content_text(message: Message) -> str:
    """The message's text content joined into one string (non-text parts are left out)."""
    return "".join(content_texts(message))


def content_parts(message: Message) -> list[Mapping[str, Any]]:
    """The message's content parts when `content` is a list, else an empty list."""
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [part for part in content if isinstance(part, Mapping)]


def _canonical_arguments(arguments: Any) -> Any:
    """Tool-call arguments in a form that survives a client re-serializing them (whitespace, key order)."""
    if isinstance(arguments, str):
        return _canonical_json_text(arguments)
    return arguments


@lru_cache(maxsize=65_536)
def _canonical_json_text(text: str) -> str:
    """`text` re-serialized with sorted keys and no whitespace when it is JSON; as it is otherwise."""
    try:
        return orjson.dumps(orjson.loads(text), option=orjson.OPT_SORT_KEYS).decode()
    except orjson.JSONDecodeError:
        return text


def _normalized_call(call: Any) -> Any:
    if not isinstance(call, Mapping):
        return call
    function = call.get("function")
    if isinstance(function, Mapping):
        function = {
            "name": function.get("name"),
            "arguments": _canonical_arguments(function.get("arguments")),
        }
    return {"id": call.get("id"), "function": function}


def _normalized_content(content: Any) -> Any:
    if content is None or content in ("", []):
        return ""
    return content


_IDENTITY_FIELDS = ("name", "tool_call_id", "tool_calls", "function_call")
"""Fields besides role and content that change what the model reads; empty or null ones count as absent."""


def normalized(message: Message) -> dict[str, Any]:
    """The parts of a message that define it, in a form that survives a client's round trip.

    A client re-sends the assistant reply it received, but rarely byte for byte: SDKs add `refusal: null` and
    `annotations: []`, drop null content, and re-serialize tool-call arguments. Normalization keeps only what the
    model reads (role, content, name, tool calls, tool call id, function call) and canonicalizes the rest, so the
    re-sent reply is recognized as the same message.
    """
    out: dict[str, Any] = {"role": message.get("role"), "content": _normalized_content(message.get("content"))}
    for key in ("name", "tool_call_id"):
        if value := message.get(key):
            out[key] = value
    if calls := message.get("tool_calls"):
        out["tool_calls"] = [_normalized_call(call) for call in calls] if isinstance(calls, list) else calls
    if function_call := message.get("function_call"):
        out["function_call"] = _normalized_call({"function": function_call})
    return out


def message_key(message: Message) -> MessageKey:
    """A stable digest of the normalized message: equal for messages the model reads the same way."""
    role = message.get("role")
    content = message.get("content")
    # The common case, a plain text message, is hashed without building and serializing a normalized copy.
    if (
        isinstance(role, str)
        and isinstance(content, str)
        and content
        and not any(message.get(field) for field in _IDENTITY_FIELDS)
    ):
        data = b"s\0" + role.encode() + b"\0" + content.encode("utf-8", "surrogatepass")
        return hashlib.blake2b(data, digest_size=16).digest()
    try:
        data = b"j\0" + orjson.dumps(normalized(message), option=orjson.OPT_SORT_KEYS)
    except TypeError:
        data = b"r\0" + repr(normalized(message)).encode("utf-8", "replace")
    return hashlib.blake2b(data, digest_size=16).digest()


def chain_keys(keys: list[MessageKey], start: bytes = b"") -> list[bytes]:
    """The hash chain of a conversation: element i identifies messages[0..i] as a whole.

    `h_i = H(h_{i-1} || key_i)`, so two conversations share a chain element exactly when they share the prefix.
    """
    chain: list[bytes] = []
    previous = start
    for key in keys:
        previous = hashlib.blake2b(previous + key, digest_size=16).digest()
        chain.append(previous)
    return chain
