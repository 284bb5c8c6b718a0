"""OpenAI Chat Completions messages: the engine's lingua franca.

A message is the plain dict a client sends in `messages`: roles `system`, `developer`, `user`, `assistant`, `tool`
and the legacy `function`; `content` as a string, as a list of parts (`text`, `image_url`, `input_audio`, `file`,
`refusal`) or null; assistant `tool_calls` and legacy `function_call`; tool `tool_call_id`. Fields the engine does not
know are carried through untouched. The helpers here read messages; nothing in the engine ever writes to one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import lru_cache
from typing import Any

import orjson
from xxhash import xxh3_128_digest

from proxy.engine.json_bytes import sized

Message = Mapping[str, Any]
"""One OpenAI Chat Completions message, as the client sent it."""

INSTRUCTION_ROLES = frozenset({"system", "developer"})
TOOL_RESULT_ROLES = frozenset({"tool", "function"})
ROLES = INSTRUCTION_ROLES | TOOL_RESULT_ROLES | {"user", "assistant"}
"""Every role a message may have (the proxy forwards others untouched, for the provider to refuse)."""

OPAQUE_PART = "opaque"
"""A content part a front end adds for something the model reads but the engine cannot see into (an encrypted
reasoning item, a provider's compaction item): `{"type": "opaque", "tokens": n, ...}` costs its `tokens`, is never cut
or rewritten, and its other fields only tell one part from another."""

CHECKPOINT = "checkpoint"
"""An opaque part with `"checkpoint": true` stands for everything before its message (a provider's compaction item):
what lies between the leading instructions and the latest checkpoint can go without losing anything."""

CONTINUES_STEP = "_continues_step"
"""An assistant message with this field set to True continues the Agent step before it (another part of the same
model response, after the results of its first calls), so the two are kept or removed together."""

MessageKey = bytes
"""A stable 16-byte digest of a message's normalized form (see `message_key`).

Digests are xxh3-128: fast enough to hash a 2 MB conversation in a fraction of a millisecond, and stable across
processes and machines (replicas share keys through Redis). It is not a cryptographic hash; that is safe because
every stored key is also scoped by the caller's tenant, a keyed SHA-256 of its credential, so a crafted collision
can only confuse the crafter's own conversations.
"""


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


def is_checkpoint(message: Message) -> bool:
    """Whether the message carries a checkpoint (see `CHECKPOINT`)."""
    return any(part.get("type") == OPAQUE_PART and part.get(CHECKPOINT) is True for part in content_parts(message))


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


_CACHED_ARGUMENTS_MAX_CHARS = 1024
"""Tool-call arguments up to this long have their canonical form cached; longer ones cost more to keep than to redo.

With the cache's 16,384 entries, this bounds what it holds to about 40 MB whatever clients send."""


def canonical_json_text(text: str) -> bytes:
    """`text` re-serialized with sorted keys and no whitespace when it is JSON; as it is otherwise."""
    if len(text) <= _CACHED_ARGUMENTS_MAX_CHARS:
        return _cached_canonical_json_text(text)
    return _canonicalize(text)


def _canonicalize(text: str) -> bytes:
    try:
        return orjson.dumps(orjson.loads(text), option=orjson.OPT_SORT_KEYS)
    except orjson.JSONDecodeError:
        return text.encode("utf-8", "surrogatepass")


@lru_cache(maxsize=16_384)
def _cached_canonical_json_text(text: str) -> bytes:
    """`_canonicalize(text)`, kept in a buffer of its own length (orjson's would hold 4 KiB an entry)."""
    return sized(_canonicalize(text))


def _value_bytes(value: Any) -> bytes:
    """A field's value as bytes: text as UTF-8, absent or empty as nothing, anything else as canonical JSON."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if value is None or value in ("", [], {}):
        return b""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return repr(value).encode("utf-8", "replace")


def _call_bytes(call: Any) -> bytes:
    """One tool call as the model reads it: id, function name, canonical arguments."""
    # A dict is checked first: it is what clients send, and `isinstance(x, Mapping)` costs an ABC's check.
    if not isinstance(call, (dict, Mapping)):
        return b"?" + _value_bytes(call)
    function = call.get("function")
    if not isinstance(function, (dict, Mapping)):
        return b"?" + _value_bytes(call)
    arguments = function.get("arguments")
    canonical = canonical_json_text(arguments) if isinstance(arguments, str) else _value_bytes(arguments)
    return b"\0".join((_value_bytes(call.get("id")), _value_bytes(function.get("name")), canonical))


def _single_text(content: Any) -> Any:
    """The text of a content holding one text part and nothing else; any other content as it is."""
    if isinstance(content, list) and len(content) == 1:
        part = content[0]
        if isinstance(part, Mapping) and part.keys() == {"type", "text"} and part["type"] == "text":
            text = part["text"]
            if isinstance(text, str):
                return text
    return content


def message_key(message: Message) -> MessageKey:
    """A stable digest of what the model reads of a message, equal for messages it reads the same way.

    A client re-sends the assistant reply it received, but rarely byte for byte: SDKs add `refusal: null` and
    `annotations: []`, drop null content, and re-serialize tool-call arguments. The key covers only role, content,
    name, tool calls (id, name, canonical arguments), tool call id and function call, with empty and null alike, so
    the re-sent reply is recognized as the same message. Each field is length-prefixed, so no two different
    messages can run together into the same bytes.

    A content of one text part keys as its text: the model reads the two alike, and a client that marks a cache
    breakpoint on its newest message sends it as a text block on one turn and as a string on the next (Claude Code,
    the Messages API's `cache_control`); keyed apart, the rewrite remembered on the first turn would not be found on
    the second, and the conversation would be compacted again.
    """
    get = message.get
    role = get("role")
    content = get("content")
    if type(content) is not str:
        content = "" if content is None else _single_text(content)
    name = get("name") or ""
    call_id = get("tool_call_id") or ""
    calls = get("tool_calls")
    # Exact types (what parsed JSON holds) are checked for the shortcut; any other goes the general way.
    if (
        type(role) is str
        and type(content) is str
        and type(name) is str
        and type(call_id) is str
        and (not calls or type(calls) is list)
        and not get("function_call")
    ):
        # The common shapes (text, or an assistant's calls), hashed with fewer steps: the general path's bytes.
        text = f"{len(role)}:{role}{len(content)}:{content}{len(name)}:{name}{len(call_id)}:{call_id}"
        if text.isascii():
            # ASCII text has as many bytes as characters: the lengths are the bytes' and one encoding does.
            head = text.encode()
        else:
            r, c = role.encode("utf-8", "surrogatepass"), content.encode("utf-8", "surrogatepass")
            n, t = name.encode("utf-8", "surrogatepass"), call_id.encode("utf-8", "surrogatepass")
            head = b"%d:%b%d:%b%d:%b%d:%b" % (len(r), r, len(c), c, len(n), n, len(t), t)
        if not calls:
            return xxh3_128_digest(head)
        if len(calls) == 1:
            call = _call_bytes(calls[0])
            return xxh3_128_digest(b"%b%d:%b" % (head, len(call), call))
        return xxh3_128_digest(head + b"".join([b"%d:%b" % (len(call), call) for call in map(_call_bytes, calls)]))
    return _general_key(message)


def _general_key(message: Message) -> MessageKey:
    """`message_key` for any message: each field's bytes (`_value_bytes`, `_call_bytes`), length-prefixed."""
    content = _single_text(message.get("content"))
    calls = message.get("tool_calls")
    pieces = [
        _value_bytes(message.get("role")),
        _value_bytes(content),
        _value_bytes(message.get("name")),
        _value_bytes(message.get("tool_call_id")),
    ]
    if isinstance(calls, list):
        pieces.extend(_call_bytes(call) for call in calls)
    elif calls:
        pieces.append(b"?" + _value_bytes(calls))
    function_call = message.get("function_call")
    if function_call:
        pieces.append(b"f" + _call_bytes({"function": function_call}))
    data = b"".join(b"%d:%b" % (len(piece), piece) for piece in pieces)
    return xxh3_128_digest(data)


def chain_keys(keys: list[MessageKey], start: bytes = b"") -> list[bytes]:
    """The hash chain of a conversation: element i identifies messages[0..i] as a whole.

    `h_i = H(h_{i-1} || key_i)`, so two conversations share a chain element exactly when they share the prefix.
    """
    chain: list[bytes] = []
    previous = start
    for key in keys:
        previous = xxh3_128_digest(previous + key)
        chain.append(previous)
    return chain
