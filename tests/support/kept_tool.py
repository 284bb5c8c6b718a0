"""The research conversation of `bench.recall` through the proxy, for the tests that the read tool, once sent, stays.

Every provider's prompt cache orders the tools first: a request whose tools changed misses everything before its
first changed message too. The research conversation (seed 1, 2.5 times a 32768-token window), sent turn by turn
through the proxy at its defaults in each format, offloads tool results, and a later compaction leaves none of them
behind (`X-Compaction-Offloaded: 0`).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from bench import recall
from bench.misses import Request, breakdown, ceiling_of, forwarded
from bench.recall_conversations import SHAPES, conversation
from bench.recall_runs import KEY
from bench.recall_wire import WIRES, Wire, script
from proxy.pipeline.offload.tool import READ_TOOL
from tests.support.proxies import LoopbackProxies

WINDOW = 32768
SHAPE = next(shape for shape in SHAPES if shape.name == "research")
"""The conversation whose later compactions leave no offloaded result behind, in every format."""


def by_wire() -> pytest.MarkDecorator:
    """Parametrizes a test by the benchmark's wire formats."""
    return pytest.mark.parametrize("wire", WIRES, ids=[wire.name for wire in WIRES])


async def run(wire: Wire, **settings: Any) -> tuple[list[Request], list[str], int]:
    """The conversation through a fresh proxy: the forwarded requests, each turn's offloaded count, the ceiling."""
    generated = conversation(SHAPE, 1, int(recall.FILL * WINDOW))
    decisions, offloaded = [], []
    async with wire.upstream(WINDOW) as upstream:
        wire.install(upstream, script(generated))
        proxies = LoopbackProxies(upstream=upstream.base_url, context_windows={wire.case.model: WINDOW})
        try:
            proxy = await proxies.start(**settings)
            for n in generated.calls():
                status, headers, answer = await wire.case.post(proxy, wire.body(generated, n), key=KEY)
                assert status == 200, answer
                decisions.append(headers.get("X-Compaction", ""))
                offloaded.append(headers.get("X-Compaction-Offloaded", ""))
        finally:
            await proxies.close()
        return forwarded(wire.case, upstream, decisions), offloaded, ceiling_of(proxy.settings, WINDOW)


def tool_names(tools: Any) -> list[str]:
    """The names of a request's tools, at their top or in their function, as formats put them."""
    return [str(tool.get("name") or tool.get("function", {}).get("name")) for tool in tools or ()]


def since_the_tool(requests: list[Request]) -> range:
    """The positions of the forwarded requests from the first holding the read tool on."""
    first = next(at for at, request in enumerate(requests) if READ_TOOL in tool_names(request.body.get("tools")))
    return range(first, len(requests))


def assert_the_tool_stays(wire: Wire, requests: list[Request], offloaded: list[str], ceiling: int) -> None:
    held = [int(count or 0) for count in offloaded]
    assert max(held) > 0 and held[-1] == 0, "a later compaction must leave no offloaded result behind"
    positions = list(since_the_tool(requests))
    tools = {orjson.dumps(requests[at].body["tools"]) for at in positions}
    assert len(tools) == 1, "the tools changed after the read tool came"
    causes = breakdown(wire.case, requests, ceiling)
    changed = [causes[at].tokens["tools changed"] for at in positions[1:]]
    assert changed == [0] * len(changed)
    # Only the request that brought the tool may have missed for it.
    assert all(row.tokens["tools changed"] == 0 for row in causes[: positions[0]])
