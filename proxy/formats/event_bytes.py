"""Reading a stream event from its bytes, for the few common kinds whose parse would tell nothing more.

A streamed answer is mostly text deltas (and, in some formats, events the proxy does not read at all); parsing each
one's JSON only to append a string costs as much as relaying it. A format recognizes those events with a regular
expression over compact JSON (no whitespace, the members in the order its servers write them) that accepts only
bytes a JSON parser would read to the same object: every string other than the text is free of escapes, every
number a plain integer, every key not one the format reads. Anything else (whitespace, another order, an escaped
key, a float, a nested value) is simply not recognized and is parsed as before, so the byte reading is a shortcut
for what parsing decides, never a second opinion (`tests/formats/test_event_bytes.py` checks it against the parse).
"""

from __future__ import annotations

import re
from typing import Final

import orjson

from proxy.pipeline.wire import StreamReport

STRING: Final = rb'"[^"\\\x00-\x1f]*+"'
"""A JSON string without escapes (any character but a quote, a backslash or a control character)."""

TEXT_BODY: Final = rb'(?:[^"\\\x00-\x1f]++|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*+'
"""What a JSON string holds between its quotes, escapes allowed (possessive: one linear scan, however long)."""

TEXT: Final = rb'"(' + TEXT_BODY + rb')"'
"""A JSON string: its group is its body as written (`text_of` reads it)."""

LONGEST: Final = 16 * 1024
"""Events longer than this are left to the parse, linear and fast at any length: a token's event is far shorter,
and a pattern stepping through a long text full of escapes costs many times what parsing it does."""

_PLAIN: Final = re.compile(rb'[^"\\\x00-\x1f]*')
_BODY: Final = re.compile(TEXT_BODY)

SCALAR: Final = rb"(?:" + STRING + rb"|-?(?:0|[1-9][0-9]{0,17})|null|true|false)"
"""A member's value the reader skips: a string without escapes, an integer that fits 64 bits, null, a boolean."""


def members_but(*keys: str) -> bytes:
    """A pattern for one `"key":value` member with a `SCALAR` value and any unescaped key but `keys`."""
    excluded = b"|".join(re.escape(key.encode()) for key in keys)
    return rb'"(?!(?:' + excluded + rb')")[^"\\\x00-\x1f]*":' + SCALAR


def text_of(body: bytes) -> str | None:
    """The string that `body` between quotes stands for; None when it is not a `TEXT_BODY` a parser would read.

    Bytes that are not UTF-8, and escapes that name no character (a lone surrogate), make the whole event fail to
    parse: the caller then leaves it to the parse, which finds the same.
    """
    try:
        if _PLAIN.fullmatch(body) is not None:
            return body.decode()
        return orjson.loads(b'"' + body + b'"') if _BODY.fullmatch(body) is not None else None
    except (UnicodeDecodeError, orjson.JSONDecodeError):
        return None


def utf8(data: bytes) -> bool:
    """Whether the bytes are UTF-8 (a JSON parser rejects a document that is not, whatever it holds)."""
    if data.isascii():
        return True
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


class TextEvents:
    """The text events of one stream, told from their bytes: by a pattern, then by the bytes around their text.

    A server writes a stream's text events alike but for their text (same id, model, index, members in the same
    order), so once `pattern` matched one, an event with the same bytes before and after a valid text is the same
    event with that text: two comparisons instead of the pattern's scan.

    :param pattern: A compiled pattern of the whole event's data, as loose as its format's parse (see the module).
    :param group: The pattern's group holding the text's body (`TEXT`); the other groups lie before or after it.
    """

    def __init__(self, pattern: re.Pattern[bytes], group: int) -> None:
        self.pattern = pattern
        self.group = group
        self._found: re.Match[bytes] | None = None
        self._head = self._tail = b""
        self._edges = LONGEST + 1  # no event is this long: nothing is compared before a first match
        self._after = 0

    def read(self, data: bytes) -> tuple[str, re.Match[bytes]] | None:
        """The text of an event the pattern matches, and the match (its other groups); None for any other event.

        Always None past `LONGEST` bytes.
        """
        size = len(data)
        if size > LONGEST:
            return None
        if size >= self._edges and data.startswith(self._head) and data.endswith(self._tail):
            text = text_of(data[len(self._head) : size - self._after])
            return None if text is None or self._found is None else (text, self._found)
        found = self.pattern.fullmatch(data)
        if found is None or not utf8(data):
            return None
        text = text_of(found.group(self.group))
        if text is None:
            return None
        self._found, self._head, self._tail = found, data[: found.start(self.group)], data[found.end(self.group) :]
        self._edges, self._after = len(self._head) + len(self._tail), len(self._tail)
        return text, found


def read_text(
    report: StreamReport, pattern: re.Pattern[bytes], group: int, data: bytes
) -> tuple[str, re.Match[bytes]] | None:
    """`TextEvents.read` of `data` with the stream's own `TextEvents`, kept on its report from its first event."""
    if report.skim is None:
        report.skim = TextEvents(pattern, group)
    read: tuple[str, re.Match[bytes]] | None = report.skim.read(data)
    return read
