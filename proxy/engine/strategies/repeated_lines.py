"""Repeated lines: a run of identical lines, or of identical blocks of lines, inside one tool result is written once.

Logs and listings repeat themselves: a progress line printed 300 times, the same warning after every test, a retry
loop's stack trace again and again. Only whole repeated results were deduplicated; this removes the repetition inside
one result, and nothing else. A run is written once, followed by a marker line saying how often it repeats:

    Downloading index...
    [the previous line repeats 37 more times]
    Traceback (most recent call last):
      File "fetch.py", line 12, in <module>
    ConnectionError: timed out
    [the previous 3 lines repeat 4 more times]

The marker refers to the lines written just before it, so the original is the text with each marker replaced by that
many more copies of the lines before it: nothing is lost, and the model reads it as it would read `uniq -c`. A run is
collapsed only when its marker is shorter than the copies it replaces. A text that already holds a line reading like
a marker is left as it is, so a marker always means what it says (and a second pass changes nothing), and so is JSON,
which `json_minify` shortens without changing what it parses to.
"""

from __future__ import annotations

import re
from typing import Final

from proxy.engine.strategies.json_minify import minified
from proxy.engine.strategies.text_rewrite import LosslessTextRewrite

MAX_BLOCK_LINES: Final = 64
"""The longest block of lines looked for as a repeated unit (a stack trace, a test's warning with its context)."""

MARKER: Final = re.compile(r"\[the previous (?:line repeats|(\d+) lines repeat) (\d+) more times?\]")
"""A marker line: `[the previous line repeats N more time(s)]` or `[the previous M lines repeat N more time(s)]`."""


def marker(lines: int, times: int) -> str:
    """The marker saying the `lines` lines before it repeat `times` more times."""
    what = "the previous line repeats" if lines == 1 else f"the previous {lines} lines repeat"
    return f"[{what} {times} more time{'' if times == 1 else 's'}]"


def collapsed(text: str) -> str | None:
    """`text` with each run of repeated lines or blocks written once and marked, or None when that does not shorten it.

    None too for JSON and for a text already holding a marker line (see the module docstring).
    """
    lines = text.split("\n")
    ids = _line_ids(lines)
    if len(set(ids)) == len(ids) or any(MARKER.fullmatch(line) for line in lines) or minified(text) is not None:
        return None
    following = _next_same(ids)
    written: list[str] = []
    start = 0
    while start < len(lines):
        size, times = _best_run(lines, ids, following, start)
        written.extend(lines[start : start + size])
        if times > 1:
            written.append(marker(size, times - 1))
        start += size * times
    result = "\n".join(written)
    return result if len(result) < len(text) else None


def _line_ids(lines: list[str]) -> list[int]:
    """A small integer per distinct line, so blocks compare as lists of integers."""
    numbering: dict[str, int] = {}
    return [numbering.setdefault(line, len(numbering)) for line in lines]


def _next_same(ids: list[int]) -> list[int]:
    """For each line, the index of the next identical line, or -1."""
    following = [-1] * len(ids)
    last: dict[int, int] = {}
    for index in range(len(ids) - 1, -1, -1):
        following[index] = last.get(ids[index], -1)
        last[ids[index]] = index
    return following


def _best_run(lines: list[str], ids: list[int], following: list[int], start: int) -> tuple[int, int]:
    """The block size and repetitions of the run at `start` that saves the most characters; `(1, 1)` when none does.

    Only block sizes at which the line at `start` appears again are tried (`following`), so a text with few repeated
    lines costs little; ties go to the smaller block.
    """
    best, best_gain = (1, 1), 0
    again = following[start]
    while again != -1 and again - start <= MAX_BLOCK_LINES:
        size = again - start
        block = ids[start:again]
        times = 1
        while ids[start + times * size : start + (times + 1) * size] == block:
            times += 1
        if times > 1:
            block_chars = sum(len(line) + 1 for line in lines[start:again])
            gain = block_chars * (times - 1) - len(marker(size, times - 1)) - 1
            if gain > best_gain:
                best, best_gain = (size, times), gain
        again = following[again]
    return best


class RepeatedLines(LosslessTextRewrite):
    """Writes each run of repeated lines or blocks of lines in a tool result once, with a marker; nothing is lost.

    Runs on tool results only (never the user's messages or the leading instructions), oldest first, before any
    lossy step, until the target is met; a result is rewritten only when that saves tokens. See the module docstring
    for the marker and what it means.
    """

    name = "repeated_lines"

    def rewrite(self, text: str) -> str | None:
        """`collapsed(text)`."""
        return collapsed(text)
