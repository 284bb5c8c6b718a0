"""Offloaded tool results read back through the proxy on the Messages API, with the official `anthropic` SDK.

The conversation's older large tool result is offloaded when it is compacted; the fake model calls the proxy's read
tool with the reference it sees; the proxy answers the call itself and asks again; the client receives only the final
answer, which quotes the secret marker the full text holds (and the preview does not), streamed and not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pytest

from proxy.pipeline.offload.tool import READ_TOOL
from tests.e2e.messages.conftest import NON_BINDING, sdk
from tests.support.anthropic_upstream import AnthropicUpstream
from tests.support.proxies import LoopbackProxies

SECRET = "SECRET-7731"
LOG = "".join(f"step {i:03d}: compiled module m{i} in {i * 7 % 97} ms\n" for i in range(230)) + f"{SECRET} failed.\n"
TOOLS: list[Any] = [
    {"name": name, "description": name, "input_schema": {"type": "object", "properties": {}}}
    for name in ("fetch_log", "check_status")
]
_REFERENCE = re.compile(r"offloaded-[0-9a-f]{32}")


def _texts(value: Any) -> list[str]:
    """Every string inside a message's content, at any depth."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [text for item in value.values() for text in _texts(item)]
    if isinstance(value, list):
        return [text for item in value for text in _texts(item)]
    return []


def reading_responder(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Reads every offloaded reference it sees when offered the read tool, then answers with the markers found."""
    last = body["messages"][-1]
    results = [block for block in last["content"] if isinstance(last["content"], list)]
    read = [block for block in results if str(block.get("tool_use_id", "")).startswith("toolu_read")]
    if read:
        return [{"type": "text", "text": "found " + ",".join(re.findall(r"SECRET-\d+", " ".join(_texts(read))))}]
    offered = any(tool.get("name") == READ_TOOL for tool in body.get("tools") or ())
    references = list(dict.fromkeys(_REFERENCE.findall(" ".join(_texts(body["messages"])))))
    if offered and references:
        return [
            {"type": "tool_use", "id": f"toolu_read{i}", "name": READ_TOOL, "input": {"reference": reference}}
            for i, reference in enumerate(references)
        ]
    return [{"type": "text", "text": "plain answer"}]


def conversation() -> list[dict[str, Any]]:
    """A tool-using conversation whose first (older) result is large: the one compaction offloads."""
    return [
        {"role": "user", "content": "Investigate the failed build."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "fetch_log", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": LOG}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_2", "name": "check_status", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "status: red"}]},
        {"role": "assistant", "content": "The status is red."},
        {"role": "user", "content": "Which marker does the log end with?"},
    ]


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
async def test_an_offloaded_result_is_read_back_by_the_proxy(
    upstream: AnthropicUpstream, proxies: LoopbackProxies, streamed: bool
) -> None:
    upstream.responder = reading_responder
    proxy = await proxies.start()
    body: dict[str, Any] = {"model": NON_BINDING, "max_tokens": 500, "tools": TOOLS, "messages": conversation()}
    small = {"X-Context-Window": "4800"}
    async with sdk(proxy) as client:
        if streamed:
            async with client.messages.stream(**body, extra_headers=small) as stream:
                kinds = [event.type async for event in stream]
                message = await stream.get_final_message()
                headers = stream.response.headers
            assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
        else:
            raw = await client.messages.with_raw_response.create(**body, extra_headers=small)
            message, headers = await raw.parse(), raw.headers
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == f"found {SECRET}"  # type: ignore[union-attr]
    assert headers["x-compaction-offloaded"] == "1"
    if not streamed:  # a stream's headers went out before its reads were answered
        assert headers["x-compaction-reads"] == "1"
    assert upstream.rejections == []
    assert len(upstream.requests) == 2
    assert upstream.requests[1]["messages"][-1]["content"][0]["type"] == "tool_result"
