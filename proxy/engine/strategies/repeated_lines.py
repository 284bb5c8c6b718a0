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
from array import array
from collections.abc import Iterator
from itertools import accumulate
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


_SHORTEST_MARKER: Final = len("[the previous line repeats 1 more time]")
"""The shortest marker: a stretch of repeated lines no longer than it cannot shorten a text."""

_NONZERO: Final = re.compile(b"[^\\x00]")


def collapsed(text: str) -> str | None:
    """`text` with each run of repeated lines or blocks written once and marked, or None when that does not shorten it.

    None too for JSON and for a text already holding a marker line (see the module docstring).
    """
    lines = text.split("\n")
    ids = _line_ids(lines)
    if len(set(ids)) == len(ids) or any(MARKER.fullmatch(line) for line in lines) or minified(text) is not None:
        return None
    ends = list(accumulate((len(line) + 1 for line in lines), initial=0))
    runs = _Runs(ids, ends)
    written: list[str] = []
    start = 0
    while start < len(lines):
        here = runs.at(start)
        if not here:
            upto = runs.next_start(len(lines))
            written.extend(lines[start:upto])
            start = upto
            continue
        size, times = _best_run(here, ends, start)
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


class _Runs:
    """Where blocks of each size repeat, found for all lines at once so that no start is searched one size at a time.

    A block of `size` lines at `start` repeats `times` times exactly when every line from `start` up to
    `start + size * (times - 1)` equals the line `size` further on, so one stretch of such lines answers for every
    start inside it. The stretches are found in C: the line numbers are packed into one big integer (a byte each when
    there are few distinct lines, the text's costliest case to search), which is XORed with itself shifted by `size`
    lines; its runs of zero bytes are the stretches. A stretch too short to pay for a marker is dropped.
    """

    def __init__(self, ids: list[int], ends: list[int]) -> None:
        most = max(ids) + 1
        code = "B" if most < 2**8 else "H" if most < 2**16 else "I"
        packed = array(code, [number + 1 for number in ids]).tobytes()  # no zero: the lines shifted in match none
        width = array(code).itemsize
        whole = int.from_bytes(packed, "little")
        stretches: list[tuple[int, int, int]] = []
        for size in range(1, min(MAX_BLOCK_LINES, len(ids) // 2) + 1):
            differences = (whole ^ (whole >> (8 * width * size))).to_bytes(len(packed), "little")
            for first, end in _zero_runs(differences, width, size):
                if ends[end] - ends[first] > _SHORTEST_MARKER + 1:
                    stretches.append((first, size, end))
        stretches.sort(reverse=True)
        self._pending = stretches
        self._open: dict[int, int] = {}

    def at(self, start: int) -> list[tuple[int, int]]:
        """`(size, times)` of each block at `start` that repeats, smallest first; `start` must grow between calls."""
        pending, open_ = self._pending, self._open
        while pending and pending[-1][0] <= start:
            _, size, end = pending.pop()
            open_[size] = end
        runs = []
        for size in sorted(open_):
            times = 1 + (open_[size] - start) // size
            if times > 1:
                runs.append((size, times))
            else:
                del open_[size]
        return runs

    def next_start(self, limit: int) -> int:
        """Where the next stretch begins (`limit` when none is left), once `at` found nothing repeating."""
        return self._pending[-1][0] if self._pending else limit


def _zero_runs(data: bytes, width: int, size: int) -> Iterator[tuple[int, int]]:
    """The item ranges `[first, end)` of `data` (items of `width` bytes) that are zero, at least `size` items long."""
    needed = b"\x00" * (width * size)
    at = data.find(needed)
    while at != -1:
        stop = _NONZERO.search(data, at)
        end_byte = stop.start() if stop else len(data)
        first, end = -(-at // width), end_byte // width
        if end - first >= size:
            yield first, end
        at = data.find(needed, end_byte)


def _best_run(runs: list[tuple[int, int]], ends: list[int], start: int) -> tuple[int, int]:
    """Of the `runs` at `start`, the one that saves the most characters; `(1, 1)` when none does (ties: smaller)."""
    best, best_gain = (1, 1), 0
    for size, times in runs:
        gain = (ends[start + size] - ends[start]) * (times - 1) - len(marker(size, times - 1)) - 1
        if gain > best_gain:
            best, best_gain = (size, times), gain
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
