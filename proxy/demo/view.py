"""The demo's terminal view: one line per turn, then what the run came to. Plain lines, so a pipe reads them too.

Each turn's line says the tokens the model was sent against its window (as a bar and as numbers), the share of them
read from the provider's prompt cache, and what the proxy did (`X-Compaction`); a compaction adds its tokens before
and after and the strategies that changed the conversation. The turn at which the client's own history, sent
direct, would no longer fit the window is marked once. On a terminal, compactions and that mark are coloured.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, TextIO

BAR_WIDTH: Final = 20
COLOURS: Final = {"compaction": "\033[32m", "overflow": "\033[33m"}
RESET: Final = "\033[0m"


@dataclass(frozen=True)
class Turn:
    """One turn as the demo saw it."""

    number: int
    sent: int
    """Prompt tokens the model counted for what the proxy forwarded."""
    cached: int
    """Of those, tokens read from the prompt cache."""
    direct: int
    """Prompt tokens of the client's whole history: what going direct would send."""
    decision: str
    """The answer's `X-Compaction` header."""
    before: int | None = None
    after: int | None = None
    strategies: str = ""

    @classmethod
    def read(cls, number: int, sent: int, cached: int, direct: int, headers: Mapping[str, str]) -> Turn:
        """A turn from its counts and the `X-Compaction*` headers of its answer."""

        def integer(name: str) -> int | None:
            value = headers.get(name, "")
            return int(value) if value.isdigit() else None

        return cls(
            number,
            sent,
            cached,
            direct,
            headers.get("X-Compaction", "none"),
            integer("X-Compaction-Tokens-Before"),
            integer("X-Compaction-Tokens-After"),
            headers.get("X-Compaction-Strategies", ""),
        )

    @property
    def compacted(self) -> bool:
        """Whether the proxy compacted this turn's request."""
        return self.decision.startswith("compacted")


class View:
    """Prints turns as they come and the closing summary to `out` (see the module docstring)."""

    def __init__(self, out: TextIO, window: int) -> None:
        self.out = out
        self.window = window
        self.turns: list[Turn] = []
        self._colour = out.isatty()

    def header(self, wire_format: str, model: str) -> None:
        """The line that opens the run."""
        self._print(f"A tool-using agent ({wire_format}, {model}) through the proxy, window {self.window:,} tokens")
        self._print(f"{'turn':>4}  {'sent to the model':<{BAR_WIDTH + 17}}  {'cached':>6}  proxy")

    def turn(self, turn: Turn) -> None:
        """One turn's line, and the overflow mark on the first turn going direct would not fit."""
        self.turns.append(turn)
        filled = min(BAR_WIDTH, round(BAR_WIDTH * turn.sent / self.window))
        bar = "[" + "#" * filled + "." * (BAR_WIDTH - filled) + "]"
        cached = f"{turn.cached / turn.sent:.0%}" if turn.sent else "-"
        action = turn.decision
        if turn.compacted and turn.before is not None and turn.after is not None:
            action = f"{turn.decision} {turn.before:,} -> {turn.after:,} tokens ({turn.strategies or 'no strategy'})"
        line = f"{turn.number:>4}  {bar} {turn.sent:>6,}/{self.window:,}  {cached:>6}  {action}"
        self._print(line, "compaction" if turn.compacted else None)
        if turn.direct > self.window and self.overflow_turn() == turn.number:
            self._print(
                f"      going direct, this turn would send {turn.direct:,} tokens: over the window, the provider"
                " would refuse it",
                "overflow",
            )

    def overflow_turn(self) -> int | None:
        """The first turn whose request, sent direct, would not fit the window."""
        return next((turn.number for turn in self.turns if turn.direct > self.window), None)

    def summary(self) -> None:
        """What the run came to: turns, compactions, the cached share, and going direct's overflow."""
        sent = sum(turn.sent for turn in self.turns)
        cached = sum(turn.cached for turn in self.turns) / sent if sent else 0.0
        compactions = sum(turn.compacted for turn in self.turns)
        largest = max((turn.sent for turn in self.turns), default=0)
        self._print(
            f"{len(self.turns)} turns, {compactions} compacted; the largest request {largest:,} tokens of"
            f" {self.window:,}; {cached:.0%} of prompt tokens read from the cache."
        )
        overflow = self.overflow_turn()
        if overflow is None:
            self._print("Going direct, every turn would have fit: run more turns (--turns) to outgrow the window.")
        else:
            last = self.turns[-1]
            self._print(
                f"Going direct, turn {overflow} would have overflowed the window (by turn {last.number} the"
                f" client's history is {last.direct:,} tokens)."
            )

    def _print(self, line: str, colour: str | None = None) -> None:
        if colour is not None and self._colour:
            line = COLOURS[colour] + line + RESET
        print(line, file=self.out, flush=True)
