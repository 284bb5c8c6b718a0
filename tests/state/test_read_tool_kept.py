"""The read tool stays once sent with the rewrites kept in Redis, where the fact travels in the stored plan."""

from __future__ import annotations

from bench.recall_wire import Wire
from tests.support.kept_tool import assert_the_tool_stays, by_wire, run


@by_wire()
async def test_the_read_tool_stays_with_rewrites_in_redis(wire: Wire, redis_url: str) -> None:
    assert_the_tool_stays(wire, await run(wire, state_url=redis_url))
