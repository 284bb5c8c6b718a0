"""Where a chat request's messages sit in its raw bytes, found without parsing the whole body again.

A client re-sends its conversation every turn: the new body is the previous one with messages inserted before the
`]` that closes `messages`. To recognize that from bytes alone, the proxy needs the offset where the last message
of a body it has parsed ends (`messages_end`), the end of the first messages to look the conversation up by
(`opening_ends`), and the messages in an inserted piece of bytes (`appended_messages`).

The scans step over JSON tokens with C-speed regular expressions (a string of any length is one step) and give up
after `MAX_SCAN_TOKENS`, so a body with huge fields before its messages costs a bounded amount and is simply not
spliced. Every answer is exact: `messages_end` proves what it returns with a parse of the messages array.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import orjson

from proxy.engine.messages import Message

MAX_SCAN_TOKENS: Final = 1024
"""JSON tokens a scan reads at most (about 0.3 ms): the fields before `messages` and its first two messages must
fit in it."""

_WHITESPACE: Final = b" \t\n\r"
_TOKEN: Final = re.compile(rb'[ \t\n\r]*(?:(")|([\[\]{},:])|([^ \t\n\r\[\]{},:"]+))')
_ESCAPED_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_STRING, _PUNCTUATION, _SCALAR = 1, 2, 3
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_PUNCTUATION_BYTES: Final = b"[]{},:"
_SCALAR_STOPS: Final = _WHITESPACE + _PUNCTUATION_BYTES + b'"'
_LONGEST_SCALAR: Final = 64
"""Bytes a number or literal read backwards may have; a longer one ends the scan (numbers that long are not sent)."""


class _Tokens:
    """A forward reader of JSON tokens in `raw` from `position`, at most `MAX_SCAN_TOKENS` of them."""

    def __init__(self, raw: bytes, position: int = 0) -> None:
        self.raw = raw
        self.position = position
        self.budget = MAX_SCAN_TOKENS

    def next(self) -> tuple[int, bytes | memoryview] | None:
        """The next token's kind and bytes, or None at the end, on bytes that are not JSON, or out of budget.

        A string is found with a memory search for its closing quote (a regular expression only when it holds an
        escaped quote), and given as a view, not a copy: the first messages can be megabytes long.
        """
        self.budget -= 1
        found = _TOKEN.match(self.raw, self.position) if self.budget >= 0 else None
        if found is None or found.lastindex is None:
            return None
        if found.lastindex != _STRING:
            self.position = found.end()
            return found.lastindex, found.group(found.lastindex)
        start = found.start(_STRING)
        end = self.raw.find(b'"', start + 1) + 1
        if end > 0 and self.raw[end - 2] == _BACKSLASH:
            string = _ESCAPED_STRING.match(self.raw, start)
            end = string.end() if string else 0
        if end <= 0:
            return None
        self.position = end
        return _STRING, memoryview(self.raw)[start:end]

    def skip_value(self) -> bool:
        """Step over one value (a scalar, string, object or array); False when that is not what follows."""
        depth = 0
        while (token := self.next()) is not None:
            kind, text = token
            if kind == _PUNCTUATION and text in b"[{":
                depth += 1
            elif kind == _PUNCTUATION and text in b"]}":
                depth -= 1
                if depth < 0:
                    return False
            elif kind == _PUNCTUATION and depth == 0:
                return False
            if depth == 0:
                return True
        return False

    def expect(self, punctuation: bytes) -> bool:
        """Read one token; whether it is `punctuation`."""
        return self.next() == (_PUNCTUATION, punctuation)


def _messages_array(raw: bytes) -> int | None:
    """The offset just after the `[` opening the first `messages` member of the body's object, if the scan finds it."""
    tokens = _Tokens(raw)
    if not tokens.expect(b"{"):
        return None
    while (key := tokens.next()) is not None and key[0] == _STRING:
        if not tokens.expect(b":"):
            return None
        if _text(key[1]) == "messages":
            return tokens.position if tokens.expect(b"[") else None
        if not tokens.skip_value() or not tokens.expect(b","):
            return None
    return None


def _text(string: bytes | memoryview) -> str | None:
    """A JSON string token's text, or None when it is not valid JSON (the scan reads bodies not yet parsed)."""
    try:
        text = orjson.loads(string)
    except orjson.JSONDecodeError:
        return None
    return text if isinstance(text, str) else None


def opening_ends(raw: bytes) -> tuple[int, ...]:
    """Where the body's first and second messages end (fewer when it has fewer or the scan gives up).

    Only the bytes up to each returned offset are read to find it, so a body that starts with the same bytes up to
    there gives the same offset.
    """
    start = _messages_array(raw)
    if start is None:
        return ()
    tokens = _Tokens(raw, start)
    ends: list[int] = []
    while len(ends) < 2 and tokens.skip_value():
        ends.append(tokens.position)
        if not tokens.expect(b","):
            break
    return tuple(ends)


def messages_end(raw: bytes, body: Mapping[str, Any]) -> int | None:
    """Where the last message of the body's `messages` ends: the offset just after its closing `}`.

    Exact or None. `body` is `raw` parsed (a JSON object). The array is the one after the first `messages` key, and
    its `]` is looked for behind the members that follow it in `body`; parsing the bytes between proves they are
    one array, and what follows must hold no other `messages` member, so it is the array the parse of the whole
    body took. None when the array is empty, its last element is not an object, or a scan gives up.
    """
    start = _messages_array(raw)
    names = list(body)
    close = _closing_bracket(raw, len(names) - names.index("messages") - 1) if "messages" in body else None
    if start is None or close is None or close < start:
        return None
    try:
        orjson.loads(memoryview(raw)[start - 1 : close + 1])
    except orjson.JSONDecodeError:
        return None
    end = close
    while end > start and raw[end - 1] in _WHITESPACE:
        end -= 1
    if raw[end - 1 : end] != b"}" or not _only_other_fields(raw[close + 1 :]):
        return None
    return end


def _closing_bracket(raw: bytes, members_after: int) -> int | None:
    """The offset of the `]` found behind the last `members_after` members of the body's object, scanning back."""
    tokens = _BackwardTokens(raw)
    if tokens.previous() != b"}":
        return None
    for _member in range(members_after):
        if not tokens.skip_value() or tokens.previous() != b":":
            return None
        key = tokens.previous()
        if key is None or key[:1] != b'"' or tokens.previous() != b",":
            return None
    return tokens.position if tokens.previous() == b"]" else None


class _BackwardTokens:
    """A reader of JSON tokens from the end of `raw` towards its start, at most `MAX_SCAN_TOKENS` of them.

    A quote delimits a string exactly when an even number of backslashes precedes it (outside strings there are
    none), so strings are found from their end too.
    """

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.position = len(raw)
        self.budget = MAX_SCAN_TOKENS

    def previous(self) -> bytes | None:
        """The token before `position`, now at `position`; None at the start or out of budget."""
        raw, end = self.raw, self.position
        while end > 0 and raw[end - 1] in _WHITESPACE:
            end -= 1
        self.budget -= 1
        if end == 0 or self.budget < 0:
            return None
        start = end - 1
        if raw[start] == _QUOTE:
            start = self._string_start(start)
            if start < 0:
                return None
        elif raw[start] not in _PUNCTUATION_BYTES:
            shortest = max(end - _LONGEST_SCALAR, 0)
            while start > shortest and raw[start - 1] not in _SCALAR_STOPS:
                start -= 1
            if start == shortest and start > 0 and raw[start - 1] not in _SCALAR_STOPS:
                return None
        self.position = start
        return raw[start:end]

    def _string_start(self, closing: int) -> int:
        quote = self.raw.rfind(b'"', 0, closing)
        while quote > 0:
            self.budget -= 1
            if self.budget < 0:
                return -1
            backslashes = quote
            while backslashes > 0 and self.raw[backslashes - 1] == _BACKSLASH:
                backslashes -= 1
            if (quote - backslashes) % 2 == 0:
                return quote
            quote = self.raw.rfind(b'"', 0, quote)
        return quote

    def skip_value(self) -> bool:
        """Step back over one value; False when that is not what precedes."""
        depth = 0
        while (token := self.previous()) is not None:
            if token in (b"]", b"}"):
                depth += 1
            elif token in (b"[", b"{"):
                depth -= 1
                if depth < 0:
                    return False
            elif token in (b",", b":") and depth == 0:
                return False
            if depth == 0:
                return True
        return False


def _only_other_fields(rest: bytes) -> bool:
    """Whether what follows the messages array is the rest of the object with no second `messages` member."""
    rest = rest.lstrip(_WHITESPACE)
    if rest[:1] == b"}":
        return True
    if rest[:1] != b",":
        return False
    try:
        fields = orjson.loads(b"{" + rest[1:])
    except orjson.JSONDecodeError:
        return False
    return isinstance(fields, dict) and "messages" not in fields


def appended_messages(inserted: bytes) -> list[Message] | None:
    """The messages in `inserted`, the bytes a new request holds between the previous last message and its tail.

    They must read `,` followed by one or more objects, separated by commas, as in a JSON array. The objects are
    parsed nested as deep as they are in a body (an object in an array in an array), so the parser's depth limit
    treats them exactly as it would in a whole parse; the outer array holding a single element proves the bytes
    did not close the inner one early. None when the bytes are anything else.
    """
    stripped = inserted.lstrip(_WHITESPACE)
    if stripped[:1] != b",":
        return None
    try:
        wrapped = orjson.loads(b"[[" + stripped[1:] + b"]]")
    except orjson.JSONDecodeError:
        return None
    if len(wrapped) != 1:
        return None
    added: list[Message] = wrapped[0]
    if not added or not all(isinstance(message, dict) for message in added):
        return None
    return added
