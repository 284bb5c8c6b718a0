"""What every wire format's request parser shares: the proxy's limits, JSON read within them, and its errors.

Only what compaction relies on is checked: a JSON object whose messages (or items) are a list of objects, within the
proxy's limits on messages and content parts. Anything else (unknown fields, odd roles, odd content) is the
provider's to judge: the proxy forwards it untouched (`InvalidRequest`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, NoReturn

import orjson

from proxy.engine.messages import Message


class InvalidRequest(ValueError):
    """The body is not a request compaction can work on, of any format; the message says what is wrong.

    Such a body is forwarded untouched, for the provider to judge; `outcome` is how the proxy counts it.
    """

    outcome = "unparsed"


class NestedTooDeep(InvalidRequest):
    """The body nests arrays and objects deeper than `MAX_JSON_DEPTH`: the proxy could read it but not write it."""

    outcome = "too_deep"


class RequestOverLimit(ValueError):
    """The request has more messages or content parts than the proxy handles; answered 400, never forwarded.

    :param code: The OpenAI-style error code (`too_many_messages`, `too_many_content_parts`).
    """

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class RequestLimits:
    """How much one request may hold, so no request can make the proxy's work unbounded.

    :param max_messages: Most messages in `messages`.
    :param max_content_parts: Most content parts over all messages (entries of list contents).
    """

    max_messages: int
    max_content_parts: int

    def check(self, messages: list[Any]) -> None:
        """:raises RequestOverLimit: The messages exceed a limit."""
        self.check_counts(len(messages), content_parts(messages))

    def check_counts(self, messages: int, parts: int) -> None:
        """:raises RequestOverLimit: `messages` messages holding `parts` content parts exceed a limit."""
        if messages > self.max_messages:
            raise RequestOverLimit(
                f"The request has {messages} messages; this proxy accepts at most {self.max_messages} "
                f"(setting max_messages). Compact or split the conversation before sending it.",
                "too_many_messages",
            )
        if parts > self.max_content_parts:
            raise RequestOverLimit(
                f"The request has {parts} content parts; this proxy accepts at most {self.max_content_parts} "
                f"(setting max_content_parts).",
                "too_many_content_parts",
            )


def content_parts(messages: list[Any]) -> int:
    """How many content parts the messages hold: the entries of their list contents."""
    parts = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            parts += len(content)
    return parts


def reserved(body: Mapping[str, Any], *fields: str) -> int:
    """The first of `fields` that is a positive integer (a reply's token reservation), else 0."""
    for name in fields:
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


LEAN_PARSE_FROM_BYTES: Final = 1024 * 1024
"""Bodies from this size are parsed with the standard library's parser: as fast on chat bodies (long strings), and
its working memory stays near the size of what it builds, where orjson's peaks at about 13 times the body (42 MiB
for a 3.1 MiB one) while a large request is read for the first time."""


MAX_JSON_DEPTH: Final = 254
"""Deepest nesting of arrays and objects (the body's own object is level 1) the proxy parses. orjson, which writes
every body the proxy forwards, refuses 255 levels, while both parsers read up to about 1,000: a body between the two
was read, then failed to be written back on every request."""


def json_object(raw: bytes | str) -> dict[str, Any]:
    """The request body parsed.

    :raises InvalidRequest: If it is not JSON or not a JSON object.
    :raises NestedTooDeep: If it nests deeper than `MAX_JSON_DEPTH`.
    """
    lean = len(raw) >= LEAN_PARSE_FROM_BYTES
    try:
        body = _lean_loads(raw) if lean else orjson.loads(raw)
    except (ValueError, RecursionError) as error:  # decode errors, bytes that are not UTF-8, nesting too deep
        raise InvalidRequest(f"The request body is not valid JSON: {error}.") from None
    if not isinstance(body, dict):
        raise InvalidRequest(f"The request body must be a JSON object, got {type(body).__name__}.")
    if _may_nest_too_deep(body, raw, lean=lean) and nests_too_deep([body]):
        raise NestedTooDeep(f"The request body nests JSON more than {MAX_JSON_DEPTH} levels deep.")
    return body


def _may_nest_too_deep(body: dict[str, Any], raw: bytes | str, *, lean: bool) -> bool:
    """Whether `body`, parsed from `raw`, may nest deeper than `MAX_JSON_DEPTH`: a cheap test `nests_too_deep` confirms.

    What orjson read, it writes back unless it nests too deep (it refuses 255 levels, `MAX_JSON_DEPTH`'s reason), and
    writing costs far less than scanning the text (an eighth for a 700 KB chat, a fifth for a small one). What the
    standard library read may hold what orjson cannot write for another reason (an integer past 64 bits): its `{`
    and `[` are counted instead (those in strings count too), a bound on how deep it nests.
    """
    if lean:
        openings = raw.count(b"{") + raw.count(b"[") if isinstance(raw, bytes) else raw.count("{") + raw.count("[")
        return openings > MAX_JSON_DEPTH
    try:
        orjson.dumps(body)
    except orjson.JSONEncodeError:
        return True
    return False


def nests_too_deep(values: list[Any], depth: int = 1) -> bool:
    """Whether `values`, found at nesting level `depth`, nest deeper than `MAX_JSON_DEPTH` with what they hold.

    One level at a time, with no recursion and no copy: cheap beside the parse (a third of it for a body of many
    short messages, nothing for one of long strings).
    """
    level = [value for value in values if type(value) is dict or type(value) is list]
    while level:
        if depth > MAX_JSON_DEPTH:
            return True
        inner = []
        for container in level:
            for value in container.values() if type(container) is dict else container:
                if type(value) is dict or type(value) is list:
                    inner.append(value)
        level, depth = inner, depth + 1
    return False


def _lean_loads(raw: bytes | str) -> Any:
    """`raw` parsed by the standard library.

    It refuses what orjson refuses too: bytes that are not UTF-8, NaN and Infinity, nesting deeper than it recurses.
    """
    return json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw, parse_constant=_not_json)


def _not_json(constant: str) -> NoReturn:
    raise ValueError(f"{constant} is not a JSON value")


def checked_objects(entries: list[Any], field: str, limits: RequestLimits | None) -> None:
    """Check the request's messages (or items) in `field`: within `limits`, and each an object.

    :raises RequestOverLimit: If they exceed a limit.
    :raises InvalidRequest: If one is not an object.
    """
    parts = 0
    for position, entry in enumerate(entries):  # one walk for both checks: a request's every message is read once
        if not isinstance(entry, dict):
            if limits is not None:
                limits.check(entries)  # a request over a limit is refused whatever it holds
            raise InvalidRequest(f"`{field}[{position}]` must be an object, got {type(entry).__name__}.")
        content = entry.get("content")
        if isinstance(content, list):
            parts += len(content)
    if limits is not None:
        limits.check_counts(len(entries), parts)


class BodyFields:
    """What every format's parsed request reads the same way from its JSON body: the model and whether it streams."""

    body: Mapping[str, Any]

    @property
    def model(self) -> str | None:
        """The requested model, if named."""
        model = self.body.get("model")
        return model if isinstance(model, str) else None

    @property
    def stream(self) -> bool:
        """Whether a streamed (SSE) response was asked for."""
        return self.body.get("stream") is True


class MappedMessages:
    """The last message and the text-only test, read from the engine's messages a request is mapped onto whole.

    A format that decides these from its body without mapping it implements them itself.
    """

    if TYPE_CHECKING:

        @property
        def messages(self) -> list[Message]:
            """The request's messages mapped onto the engine's."""

    @property
    def last_message(self) -> Message | None:
        """`messages[-1]`, or None."""
        return self.messages[-1] if self.messages else None

    @property
    def text_only(self) -> bool:
        """See `text_only` (read once per request: not worth caching)."""
        return text_only(self.messages)


TEXT_PARTS: Final = frozenset({"text", "refusal"})
"""Content part types whose tokens their bytes bound; any other (an image, audio, a file) is measured the full way."""


def text_only(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the engine's `messages` hold text only: no content part but text, no audio (`WireRequest.text_only`)."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and not all(
            isinstance(part, dict) and part.get("type") in TEXT_PARTS for part in content
        ):
            return False
        if "audio" in message:
            return False
    return True
