"""How a log line reads: one JSON object (`JsonFormatter`) or `key=value` text (`TextFormatter`), with the request's id.

Exceptions are rendered by type and stack only, never by their message: a parser's or a library's exception text can
quote the data it choked on (a message, a header value), and logs must never carry either.
"""

from __future__ import annotations

import logging
import re
import time
import traceback
from contextvars import ContextVar
from functools import lru_cache
from itertools import filterfalse
from types import TracebackType
from typing import Any, Final

import orjson

_RESERVED: Final = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "fields"}


ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]


def redacted_exception(exc_info: ExcInfo) -> str:
    """Render an exception like a traceback, but with each exception's type only: its message is left out.

    Chained causes and contexts are rendered too, oldest first, as Python does.
    """
    exc = exc_info[1]
    chain: list[tuple[BaseException, str]] = []  # newest first: (exception, how the next-older one led to it)
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if exc.__cause__ is not None:
            chain.append((exc, "The above exception was the direct cause of the following exception:"))
            exc = exc.__cause__
        elif exc.__context__ is not None and not exc.__suppress_context__:
            chain.append((exc, "During handling of the above exception, another exception occurred:"))
            exc = exc.__context__
        else:
            chain.append((exc, ""))
            exc = None
    parts: list[str] = []
    for error, link in reversed(chain):
        kind = type(error)
        name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        stack = "".join(traceback.format_tb(error.__traceback__))
        if link:  # `error` was raised while handling (or from) the one rendered just before
            parts.append(f"\n\n{link}\n\n")
        parts.append(f"Traceback (most recent call last):\n{stack}{name} (message withheld)")
    return "".join(parts)


REQUEST_ID: ContextVar[str | None] = ContextVar("request_id", default=None)
"""The request being handled (set by the access-log middleware): every line logged while handling it names it, so
the access line and, say, "Compacted a conversation." can be matched."""


def line_fields(record: logging.LogRecord, extra: dict[str, Any]) -> dict[str, Any]:
    """`extra` with the line's fields added: the request's id, the record's extra attributes, its `fields`."""
    request_id = REQUEST_ID.get()
    if request_id is not None:
        extra["request_id"] = request_id
    found = record.__dict__
    extra.update((key, found[key]) for key in filterfalse(_RESERVED.__contains__, found))  # the filter runs in C
    fields = found.get("fields")
    if isinstance(fields, dict):
        extra.update(fields)
    return extra


@lru_cache(maxsize=4)
def _utc_second(second: int) -> str:
    """A second since the epoch as UTC `YYYY-MM-DDTHH:MM:SS`; remembered, since a second's lines all ask for it."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))


@lru_cache(maxsize=4)
def _local_second(second: int) -> str:
    """A second since the epoch as local `HH:MM:SS`; remembered, since a second's lines all ask for it."""
    return time.strftime("%H:%M:%S", time.localtime(second))


class _RedactingFormatter(logging.Formatter):
    """A formatter whose tracebacks leave exception messages out."""

    def formatException(self, ei: Any) -> str:
        """Render an exception by type and stack only (see `redacted_exception`)."""
        return redacted_exception(ei)


class JsonFormatter(_RedactingFormatter):
    """`{"time", "level", "logger", "message", **fields, "exception"?}` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        """Render the record as one line of JSON."""
        line = json_head(record.created, record.msecs, record.levelname, record.name, record.getMessage())
        line_fields(record, line)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


def json_head(created: float, msecs: float, level: str, logger: str, message: str) -> dict[str, Any]:
    """The keys every JSON line starts with, in their order: time, level, logger, message."""
    return {
        "time": f"{_utc_second(int(created))}.{int(msecs):03d}Z",
        "level": level.lower(),
        "logger": logger,
        "message": message,
    }


_QUOTED: Final = re.compile(r'[ ="\\]')
_QUOTED_IN_MESSAGE: Final = re.compile(r'[="\\]')
_ESCAPES: Final = {ord("\\"): "\\\\", ord('"'): '\\"', ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"}


def logfmt_value(value: object, *, spaces: bool = False) -> str:
    r"""`value` as logfmt writes it: bare when it is plain, else in double quotes with `"`, `\` and controls escaped.

    A value that could read as more than one field (a space, an `=`, a quote) or as more than one line (a control or
    other unprintable character) is quoted, so what a client sends in a logged header is always one value.

    :param spaces: Spaces alone do not call for quotes (the free-text message, which stands before every field).
    """
    text = str(value)
    if text and text.isprintable() and not (_QUOTED_IN_MESSAGE if spaces else _QUOTED).search(text):
        return text
    return '"' + "".join(_ESCAPES.get(ord(char)) or _escaped(char) for char in text) + '"'


def _escaped(char: str) -> str:
    r"""A printable character as itself, any other as `\uXXXX` (`\UXXXXXXXX` beyond the Basic Multilingual Plane)."""
    if char.isprintable():
        return char
    code = ord(char)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


class TextFormatter(_RedactingFormatter):
    """`time level logger message key=value ...` for a terminal, values quoted by logfmt's rules (`logfmt_value`)."""

    def format(self, record: logging.LogRecord) -> str:
        """Render the record as one human-readable line (plus a traceback when there is one)."""
        stamp = f"{_local_second(int(record.created))}.{int(record.msecs):03d}"
        pairs = " ".join(
            f"{key}={logfmt_value(value)}" for key, value in line_fields(record, {}).items() if value is not None
        )
        message = logfmt_value(record.getMessage(), spaces=True)
        line = f"{stamp} {record.levelname.lower():<7} {record.name} {message}" + (f" {pairs}" if pairs else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line
