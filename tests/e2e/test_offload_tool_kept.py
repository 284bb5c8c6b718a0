"""A conversation once sent the read tool keeps it, byte for byte, after a compaction drops its last reference.

From the first request holding the read tool on, every request's tools are the same bytes, and the fake upstream's
cache misses nothing for a change of tools (`bench.misses`; see `tests.support.kept_tool`). The same with the
rewrites kept in Redis: `tests/state/test_read_tool_kept.py`.
"""

from __future__ import annotations

from bench.recall_wire import Wire
from tests.support.kept_tool import assert_the_tool_stays, by_wire, run


@by_wire()
async def test_the_read_tool_stays_after_the_last_reference_goes(wire: Wire) -> None:
    assert_the_tool_stays(wire, await run(wire))
