"""The research conversation of `bench.recall` through the proxy, for the tests that the read tool, once sent, stays.

Every provider's prompt cache orders the tools first: a request whose tools changed misses everything before its
first changed message too. The research conversation (seed 1, 2.5 times a 32768-token window), sent turn by turn
through the proxy at its defaults in each format, offloads tool results, and a later compaction leaves none of them
behind (`X-Compaction-Offloaded: 0`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson
import pytest

from bench import recall
from bench.misses import Request, breakdown, ceiling_of, forwarded
from bench.recall_conversations import SHAPES, conversation
from bench.recall_runs import KEY
from bench.recall_wire import REPORT, WIRES, Script, Wire, script
from proxy.engine.strategies.offload import content_reference
from proxy.pipeline.offload.reads import NOT_HELD
from proxy.pipeline.offload.tool import READ_TOOL
from tests.e2e.test_offload_reads import mentions
from tests.support.proxies import LoopbackProxies

WINDOW = 32768
SHAPE = next(shape for shape in SHAPES if shape.name == "research")
"""The conversation whose later compactions leave no offloaded result behind, in every format."""


def by_wire() -> pytest.MarkDecorator:
    """Parametrizes a test by the benchmark's wire formats."""
    return pytest.mark.parametrize("wire", WIRES, ids=[wire.name for wire in WIRES])


STALE: Final = content_reference("A tool result this conversation never offloaded, or one the store let go.")
"""A reference the proxy holds nothing under: what the model reads, asked to, on the last turn."""

FINAL: Final = "Done reading."
"""The model's answer after its read of `STALE`."""


@dataclass(frozen=True)
class KeptRun:
    """What one run of the conversation showed.

    :param requests: What the upstream was sent, in order (the read round included).
    :param offloaded: Each turn's `X-Compaction-Offloaded` ("" when it had none).
    :param ceiling: The prompt a compaction leaves at most without having removed too little (`bench.misses`).
    :param last: The last turn's headers and its answer, as the client got it.
    """

    requests: list[Request]
    offloaded: list[str]
    ceiling: int
    last: tuple[Mapping[str, str], Any]


def reading_stale(answers: Script) -> Script:
    """The scripted model, calling the read tool for `STALE` where it would write its report, then answering."""
    last = next(key for key, message in answers.items() if message.get("content") == REPORT)
    call = {"id": "call_stale", "type": "function", "function": {"name": READ_TOOL, "arguments": ""}}
    call["function"]["arguments"] = json.dumps({"reference": STALE})
    read = {"role": "assistant", "content": None, "tool_calls": [call]}
    return {**answers, last: read, ("tool", "call_stale"): {"role": "assistant", "content": FINAL}}


async def run(wire: Wire, **settings: Any) -> KeptRun:
    """The conversation through a fresh proxy (`reading_stale` on its last turn) with these settings."""
    generated = conversation(SHAPE, 1, int(recall.FILL * WINDOW))
    decisions, offloaded = [], []
    async with wire.upstream(WINDOW) as upstream:
        wire.install(upstream, reading_stale(script(generated)))
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
        # The last turn's read round went upstream as that turn's second request.
        requests = forwarded(wire.case, upstream, [*decisions, decisions[-1]])
    return KeptRun(requests, offloaded, ceiling_of(proxy.settings, WINDOW), (headers, answer))


def tool_names(tools: Any) -> list[str]:
    """The names of a request's tools, at their top or in their function, as formats put them."""
    return [str(tool.get("name") or tool.get("function", {}).get("name")) for tool in tools or ()]


def since_the_tool(requests: list[Request]) -> range:
    """The positions of the forwarded requests from the first holding the read tool on."""
    first = next(at for at, request in enumerate(requests) if READ_TOOL in tool_names(request.body.get("tools")))
    return range(first, len(requests))


def assert_the_tool_stays(wire: Wire, kept: KeptRun) -> None:
    """The tools are the same bytes from the read tool's first request on, and no request misses for them.

    The last turn holds no reference, yet the model's read of `STALE` is the proxy's to answer: told it is not held,
    the model answers, and the client gets only that.
    """
    requests, held = kept.requests, [int(count or 0) for count in kept.offloaded]
    assert max(held) > 0 and held[-1] == 0, "a later compaction must leave no offloaded result behind"
    positions = list(since_the_tool(requests))
    tools = {orjson.dumps(requests[at].body["tools"]) for at in positions}
    assert len(tools) == 1, "the tools changed after the read tool came"
    causes = breakdown(wire.case, requests, kept.ceiling)
    changed = [causes[at].tokens["tools changed"] for at in positions[1:]]
    assert changed == [0] * len(changed)
    # Only the request that brought the tool may have missed for it.
    assert all(row.tokens["tools changed"] == 0 for row in causes[: positions[0]])
    headers, answer = kept.last
    assert headers["X-Compaction-Reads-Not-Held"] == "1"
    assert wire.case.read(answer).text == FINAL
    assert mentions(requests[-1].body, NOT_HELD)
