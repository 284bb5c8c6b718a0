"""How a bench that prints a table ends: the table on stdout, and its results as JSON where `--output` asks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def published(table: list[str], results: Any, output: Path | None) -> int:
    """Print `table`, write `results` to `output` when given (indented JSON), and return the exit status 0."""
    print("\n".join(table))
    if output:
        output.write_text(json.dumps(results, indent=2) + "\n")
    return 0
