"""Digests: what a tool result held, in a few lines, for the stand-in that replaces it.

A pruned or offloaded result leaves a short text in its place. A placeholder that only names the tool, or a preview
of the first characters (for a pretty-printed listing or a test log: the opening brackets and the command line),
rarely tells the model which result it was or whether it is worth reading back. A digest says what tells one result
from another:

- the call: the tool's name and its arguments (cut to `ARGUMENTS_CHARS`);
- the size: lines and characters (and how many parts are not text: images, files);
- a JSON object's top-level keys, or a JSON array's length and its first item's keys;
- the first informative lines (lines with a letter or digit: not the opening `[` or `{`);
- the error lines (error, fail, exception, traceback, warning, denied, not found ...), each once, the first ones and
  the last (a traceback's last line names the exception);
- the last informative line (a test run's summary, a command's outcome).

Every quoted line is stripped and cut to `LINE_CHARS`, and the digest stops adding lines at `MAX_CHARS`, so its size
is bounded whatever the result. It is a pure function of the result and its call: compacting the same conversation
again, on any replica, writes the same bytes, so a replayed prefix stays byte-identical and the prompt cache hits.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

import orjson

from proxy.engine.messages import Message, content_parts, content_text
from proxy.engine.tool_results import result_tool_name

ARGUMENTS_CHARS: Final = 120
"""Most characters of the call's arguments a digest quotes."""

LINE_CHARS: Final = 160
"""Most characters of any one line a digest quotes."""

FIRST_LINES: Final = 2
"""How many of the first informative lines a digest quotes."""

ERROR_LINES: Final = 4
"""How many distinct error lines a digest quotes at most: the first ones and the last."""

KEYS: Final = 12
"""How many JSON keys a digest names at most."""

MAX_CHARS: Final = 900
"""Most characters of a digest: lines past this are left out (the header always stays)."""

_ERROR: Final = re.compile(r"error|fail|exception|traceback|warn|denied|not found|fatal|panic", re.IGNORECASE)
"""A line that reports something going wrong."""

_INFORMATIVE: Final = re.compile(r"\w")
"""A line worth quoting: it has a letter or a digit (not only brackets, rules or blank space)."""

_CUT: Final = "…"


def digest(message: Message, call: Mapping[str, Any] | None) -> str:
    """The digest of the tool result `message`, answering `call` (None when the call is not known).

    See the module docstring for what it holds; the same result and call always give the same text.
    """
    text = content_text(message)
    parsed = _json(text)
    lines = [line.strip() for line in (text if parsed is None else _one_line(parsed)).splitlines()]
    informative = [line for line in lines if _INFORMATIVE.search(line)]
    first = informative[:FIRST_LINES]
    last = informative[-1:] if len(informative) > FIRST_LINES else []
    shown = {*first, *last}
    errors = list(dict.fromkeys(line for line in informative if _ERROR.search(line) and line not in shown))
    entries = [
        *_structure(parsed),
        *(f"first: {_cut(line, LINE_CHARS)}" for line in first),
        *(f"error: {_cut(line, LINE_CHARS)}" for line in _spread(errors)),
        *([f"error: (+{len(errors) - ERROR_LINES} more distinct error lines)"] if len(errors) > ERROR_LINES else []),
        *(f"last: {_cut(line, LINE_CHARS)}" for line in last),
    ]
    line_count = text.count("\n") + (0 if text.endswith("\n") else 1) if text else 0
    others = sum(1 for part in content_parts(message) if part.get("type") != "text")
    header = (
        f"Digest of {_call_text(message, call)}: {line_count} line{'' if line_count == 1 else 's'}, "
        f"{len(text)} characters" + (f", {others} non-text part{'' if others == 1 else 's'}." if others else ".")
    )
    return _bounded(header, entries)


def _call_text(message: Message, call: Mapping[str, Any] | None) -> str:
    """`tool(arguments)`, the arguments on one line and cut to `ARGUMENTS_CHARS`."""
    function = call.get("function") if call is not None else None
    arguments = function.get("arguments") if isinstance(function, Mapping) else None
    if not isinstance(arguments, str):
        arguments = ""
    return f"{result_tool_name(message, call)}({_cut(' '.join(arguments.split()), ARGUMENTS_CHARS)})"


def _json(text: str) -> Any:
    """The parsed JSON object or array `text` is, or None when it is not one."""
    stripped = text.strip()
    if not stripped.startswith(("{", "[")):
        return None
    try:
        return orjson.loads(stripped)
    except orjson.JSONDecodeError:
        return None


def _one_line(parsed: Any) -> str:
    """A JSON value on one line: its first characters are a sample of the data, not of its indentation."""
    return orjson.dumps(parsed).decode()


def _structure(parsed: Any) -> list[str]:
    """A JSON object's top-level keys, or a JSON array's length and its first item's keys; nothing for other text."""
    if isinstance(parsed, dict):
        return [f"json: object with {len(parsed)} keys: {_keys(parsed)}"]
    if isinstance(parsed, list):
        first = parsed[0] if parsed else None
        items = f"json: array of {len(parsed)} items"
        return [f"{items}, the first with keys: {_keys(first)}" if isinstance(first, dict) else items]
    return []


def _keys(mapping: Mapping[str, Any]) -> str:
    names = [_cut(str(key), 40) for key in list(mapping)[:KEYS]]
    return ", ".join(names) + (f", … ({len(mapping) - KEYS} more)" if len(mapping) > KEYS else "")


def _spread(errors: list[str]) -> list[str]:
    """At most `ERROR_LINES` error lines: the first ones and the last, which often names what finally went wrong."""
    return errors if len(errors) <= ERROR_LINES else [*errors[: ERROR_LINES - 1], errors[-1]]


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + _CUT


def _bounded(header: str, entries: Iterable[str]) -> str:
    """The header and as many entries, in order, as fit `MAX_CHARS` (an entry that does not fit ends the digest)."""
    lines = [_cut(header, MAX_CHARS)]
    size = len(lines[0])
    for entry in entries:
        size += 1 + len(entry)
        if size > MAX_CHARS:
            break
        lines.append(entry)
    return "\n".join(lines)
