"""The table of limits and timeouts (docs/reliability.md) says what the settings are: every bound is in it, with
its default.

A bound is a setting that caps what a request, a client, a tenant or the state may cost (sizes, counts, rates,
timeouts). Each must be listed with the default the code has, so an operator reading the reliability section learns
every limit that can refuse their traffic, and a bound added without documenting it fails here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final

from proxy.config import Settings

PAGE: Final = Path(__file__).resolve().parents[1] / "docs" / "reliability.md"
BOUND: Final = re.compile(
    r"^max_|_max_|_timeout$|_seconds$|_bytes$|_rate$|_rounds$|_per_answer$|_per_minute$|_concurrency$"
)
"""How a bound's name reads: a cap (`max_`), a wait, a size, a rate, a count per something."""
NOT_BOUNDS: Final = frozenset({"discovery_refresh_seconds", "summary_max_tokens"})
"""Named like a bound but refusing nothing: how often a known answer is asked again, how long a summary may be."""
UNITS: Final = {"": 1, "s": 1, "bytes": 1, "bytes/s": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
QUANTITY: Final = re.compile(r"^([\d,]+(?:\.\d+)?) ?(s|bytes/s|bytes|KiB|MiB|GiB|)$")


def table() -> dict[str, str]:
    """Each setting the limits table names, and the default the table gives it (as written)."""
    text = PAGE.read_text()
    start = text.index("**Limits and timeouts**")
    rows = [line for line in text[start:].split("\n\n", 2)[1].splitlines() if line.startswith("| `")]
    defaults: dict[str, str] = {}
    for row in rows:
        names_cell, default_cell, *_ = (cell.strip() for cell in row.strip("|").split(" | "))
        names = re.findall(r"`(\w+)`", names_cell)
        written = [value.strip() for value in default_cell.split(", ")]
        for name, value in zip(names, written, strict=False):
            defaults.setdefault(name, value)
    return defaults


def quantity(written: str) -> float | None:
    """The number a default cell writes (`64 MiB`, `100,000`, `0.5 s`), or None for prose."""
    match = QUANTITY.match(written)
    if match is None:
        return None
    return float(match.group(1).replace(",", "")) * UNITS[match.group(2)]


def test_every_bound_is_in_the_table() -> None:
    bounds = {name for name in Settings.model_fields if BOUND.search(name)} - NOT_BOUNDS
    assert "probe_runs_per_minute" in bounds and "max_gzip_members" in bounds
    assert sorted(bounds - set(table())) == []


def test_the_table_names_settings_with_their_defaults() -> None:
    defaults = Settings().model_dump()
    listed = table()
    assert sorted(set(listed) - set(defaults)) == []
    wrong: list[tuple[str, str, Any]] = []
    for name, written in listed.items():
        value = quantity(written)
        if value is not None and value != defaults[name]:
            wrong.append((name, written, defaults[name]))
    assert wrong == []
    assert sum(quantity(written) is not None for written in listed.values()) >= len(listed) - 1  # all but a formula
