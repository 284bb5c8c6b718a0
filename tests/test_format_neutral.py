"""Outside `proxy/formats/`, nothing branches on a request's wire format: it asks the format's `WireFormat`.

The import contracts keep the pipeline from importing a format at all; the server may import the registry, so this
looks for the branches themselves: an `isinstance` on a format's request class, or a format told by an enum.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NEUTRAL = ("proxy/pipeline", "proxy/server", "proxy/cli.py", "proxy/request_commands.py")
BRANCH = re.compile(r"isinstance\(.*(ChatRequest|ResponsesRequest|MessagesRequest)\)|Api\.|api is")


def test_nothing_outside_the_formats_branches_on_the_wire_format() -> None:
    files = [path for place in NEUTRAL for path in sorted((ROOT / place).glob("**/*.py")) or [ROOT / place]]
    assert len(files) > 20, "the places looked at moved: update NEUTRAL"
    branches = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if BRANCH.search(line)
    ]
    assert branches == []
