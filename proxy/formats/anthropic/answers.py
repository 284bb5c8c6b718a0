"""What a Messages API answer reports, in the terms the rest of the proxy uses for chat completions.

The usage of a message is renamed to a completion's: the prompt is everything the model read,
`input_tokens + cache_creation_input_tokens + cache_read_input_tokens` (the API reports the three apart), the
completion is `output_tokens`, the cache reads are `prompt_tokens_details.cached_tokens` and the cache writes
`prompt_tokens_details.cache_write_tokens` (a name of the proxy's own: chat completions report no writes). Its
content becomes the one assistant message the engine sees it as on the next turn (`model_message`), so anchoring
and calibration work unchanged. A stream reports usage twice: `message_start` carries the input side, and each
`message_delta` the cumulative counts so far (`StreamAnswer`, which also assembles the content from the block
events).

An answer that says the prompt did not fit (`overflow`) states the window: "prompt is too long: N tokens > M maximum"
(the input alone) or "input length and `max_tokens` exceed context limit: A + B > C" (input and reply together).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from proxy.engine.messages import Message
from proxy.formats.anthropic.blocks import model_message
from proxy.formats.event_bytes import TEXT, read_text
from proxy.pipeline.wire import StreamReport

USAGE_FIELDS: Final = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")

_PROMPT_TOO_LONG: Final = re.compile(r"prompt is too long: (\d{1,9}) tokens > (\d{1,9}) maximum")
_CONTEXT_LIMIT: Final = re.compile(
    r"input length and `?max_tokens`? exceed context limit: (\d{1,9}) \+ (\d{1,9}) > (\d{1,9})"
)


@dataclass(frozen=True)
class Answer:
    """What one message reported.

    :param usage: Its usage, renamed to a chat completion's fields; None when it reported none.
    :param reply: Its content as one assistant message; None when it had none.
    """

    usage: dict[str, Any] | None
    reply: Message | None


def answer_of(message: Mapping[str, Any]) -> Answer:
    """Read a message object (a non-streamed answer's body)."""
    usage = message.get("usage")
    content = message.get("content")
    return Answer(
        usage=chat_usage(usage) if isinstance(usage, Mapping) else None,
        reply=model_message(content) if isinstance(content, list) and content else None,
    )


def _count(usage: Mapping[str, Any], name: str) -> int:
    value = usage.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def chat_usage(usage: Mapping[str, Any]) -> dict[str, Any]:
    """A Messages usage object with a chat completion's field names: the prompt as all the input the model read."""
    prompt = sum(_count(usage, name) for name in USAGE_FIELDS[:3])
    completion = _count(usage, "output_tokens")
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {
            "cached_tokens": _count(usage, "cache_read_input_tokens"),
            "cache_write_tokens": _count(usage, "cache_creation_input_tokens"),
        },
    }


_TEXT_DELTA: Final = re.compile(
    rb'\{"type":"content_block_delta","index":(0|[1-9][0-9]{0,8}),"delta":\{"type":"(text|thinking)_delta",'
    rb'"\2":' + TEXT + rb"\}\}"
)
"""A `content_block_delta` of text or thinking, in the compact form the API writes it (`proxy.formats.event_bytes`)."""


def skim_event(data: bytes, report: StreamReport) -> bool:
    """Fold in a text or thinking delta (`_TEXT_DELTA`) from its bytes, as `StreamAnswer.feed` would; else False."""
    read = read_text(report, _TEXT_DELTA, 3, data)
    if read is None:
        return False
    text, found = read
    if not isinstance(report.reply, StreamAnswer):
        report.reply = StreamAnswer()
    report.reply.add_text(int(found.group(1)), found.group(2).decode(), text)
    return True


@dataclass
class StreamAnswer:
    """A streamed message read event by event (`feed` each parsed `data:` object): its usage and its content."""

    usage: dict[str, Any] = field(default_factory=dict)
    blocks: dict[int, dict[str, Any]] = field(default_factory=dict)
    _json: dict[int, list[str]] = field(default_factory=dict)

    def feed(self, event: Mapping[str, Any]) -> None:
        """Take one event; events of kinds the proxy does not read (`ping`, `error`, new ones) change nothing."""
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), Mapping):
            self.usage.update(_usage_fields(event["message"].get("usage")))
        elif kind == "message_delta":
            self.usage.update(_usage_fields(event.get("usage")))
        elif kind == "content_block_start" and isinstance(event.get("content_block"), Mapping):
            self.blocks[_index(event)] = dict(event["content_block"])
        elif kind == "content_block_delta" and isinstance(event.get("delta"), Mapping):
            self._apply(_index(event), event["delta"])
        elif kind == "content_block_stop":
            self._finish(_index(event))

    def add_text(self, index: int, name: str, text: str) -> None:
        """Fold in a `text_delta` (`name` "text") or `thinking_delta` (`name` "thinking"): what `feed` does, faster."""
        block = self.blocks.setdefault(index, {})
        block[name] = str(block.get(name, "")) + text

    def _apply(self, index: int, delta: Mapping[str, Any]) -> None:
        self.blocks.setdefault(index, {})
        kind = delta.get("type")
        for delta_kind, name in (
            ("text_delta", "text"),
            ("thinking_delta", "thinking"),
            ("signature_delta", "signature"),
        ):
            if kind == delta_kind and isinstance(delta.get(name), str):
                self.add_text(index, name, delta[name])
        if kind == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            self._json.setdefault(index, []).append(delta["partial_json"])

    def _finish(self, index: int) -> None:
        pieces = self._json.pop(index, None)
        if pieces is None or index not in self.blocks:
            return
        try:
            self.blocks[index]["input"] = orjson.loads("".join(pieces) or "{}")
        except orjson.JSONDecodeError:
            return

    def answer(self) -> Answer:
        """What the stream reported so far."""
        content = [self.blocks[index] for index in sorted(self.blocks)]
        return Answer(
            usage=chat_usage(self.usage) if self.usage else None,
            reply=model_message(content) if content else None,
        )


def _usage_fields(usage: Any) -> dict[str, Any]:
    if not isinstance(usage, Mapping):
        return {}
    return {name: usage[name] for name in USAGE_FIELDS if isinstance(usage.get(name), int)}


def _index(event: Mapping[str, Any]) -> int:
    index = event.get("index")
    return index if isinstance(index, int) and not isinstance(index, bool) else -1


@dataclass(frozen=True)
class Overflow:
    """A context overflow the API reported.

    :param window: The window it stated: the maximum prompt, or the context limit of input and reply together.
    :param prompt: The prompt's tokens it counted.
    """

    window: int
    prompt: int


def overflow(status: int, error_body: Any) -> Overflow | None:
    """The overflow an error answer (`{"type": "error", "error": {...}}`, or a stream's `error` event) reports.

    Read only from the API's own error shape (an `invalid_request_error` whose message *opens* with one of the two
    texts), never from text a caller could have placed elsewhere in it.
    """
    if status != 400 or not isinstance(error_body, Mapping) or error_body.get("type") != "error":
        return None
    error = error_body.get("error")
    if not isinstance(error, Mapping) or error.get("type") != "invalid_request_error":
        return None
    message = error.get("message")
    if not isinstance(message, str):
        return None
    if (found := _PROMPT_TOO_LONG.match(message)) is not None:
        return Overflow(window=int(found.group(2)), prompt=int(found.group(1)))
    if (found := _CONTEXT_LIMIT.match(message)) is not None:
        return Overflow(window=int(found.group(3)), prompt=int(found.group(1)))
    return None


ERROR_TYPES: Final = frozenset(
    {
        "invalid_request_error",
        "authentication_error",
        "billing_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "rate_limit_error",
        "api_error",
        "timeout_error",
        "overloaded_error",
    }
)
"""The error types the API documents (its errors page): what its SDKs and Claude Code tell apart."""

TYPE_OF_CODE: Final = {
    "request_too_large": "request_too_large",
    "upstream_timeout": "timeout_error",
    "upstream_unreachable": "api_error",
    "internal_error": "api_error",
}
"""The API's error type for the proxy's own errors, by their stable code: a body over the size limit is the API's
413 `request_too_large`, an upstream that timed out its 504 `timeout_error`, an upstream out of reach or a failure
of the proxy itself its 5xx `api_error`."""


def error_body(message: str, kind: str = "invalid_request_error", code: str | None = None) -> bytes:
    """An error body in the API's shape, for what the proxy itself answers in a Messages request's place.

    :param kind: The error family, the API's own type or the proxy's (`upstream_error`, `proxy_error`: `api_error`).
    :param code: The proxy's stable code, which picks the API's type where one fits better (`TYPE_OF_CODE`).
    """
    found = TYPE_OF_CODE.get(code or "") or (kind if kind in ERROR_TYPES else None)
    error_type = found or ("invalid_request_error" if kind.endswith("request_error") else "api_error")
    return orjson.dumps({"type": "error", "error": {"type": error_type, "message": message}})
