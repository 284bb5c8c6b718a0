"""The proxy's default chain removes duplicates and JSON whitespace before anything is lost, through a real client."""

from __future__ import annotations

import json
from typing import Any

import openai

from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.e2e.conftest import MODEL, StartProxy

FILE = "def handler(event):\n    return {'status': 200, 'body': event['body']}\n" * 18
LISTING = json.dumps(
    [{"id": i, "name": f"order-{i}", "total": i * 3.5, "paid": i % 2 == 0} for i in range(40)], indent=2
)


def step(number: int, tool: str, arguments: dict[str, Any], content: str) -> list[dict[str, Any]]:
    call_id = f"call_{number}"
    call = {"id": call_id, "type": "function", "function": {"name": tool, "arguments": json.dumps(arguments)}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": content},
    ]


def agent_run() -> list[dict[str, Any]]:
    """An agent that read a file three times (the last after an edit) and listed orders twice, pretty-printed."""
    return [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Make the handler return 201 for new orders."},
        *step(1, "read_file", {"path": "handler.py"}, FILE),
        *step(2, "list_orders", {}, LISTING),
        *step(3, "read_file", {"path": "handler.py"}, FILE),
        *step(4, "read_file", {"path": "handler.py"}, FILE + "# edited\n"),
        *step(5, "list_orders", {}, LISTING),
        {"role": "user", "content": "Now run the tests."},
    ]


async def test_the_default_chain_is_lossless_first_and_superseded_reads_are_opt_in(
    upstream: OpenAIUpstream, start_proxy: StartProxy
) -> None:
    base_url = await start_proxy(superseded_tools=["read_file"])
    async with openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0) as client:
        raw = await client.chat.completions.with_raw_response.create(model=MODEL, messages=agent_run())  # type: ignore[arg-type]
    assert raw.headers["X-Compaction"] == "compacted"
    assert raw.headers["X-Compaction-Strategies"].split(",")[:2] == ["duplicate_results", "superseded_results"]
    forwarded = upstream.requests[-1].json["messages"]
    assert len(forwarded) == len(agent_run()), "results were replaced, nothing removed"
    contents = [message["content"] for message in forwarded if message["role"] == "tool"]
    assert contents[0].startswith("[Superseded by the later call `read_file` (call_4) below")
    assert contents[2].startswith("[Superseded by the later call `read_file` (call_4) below")
    assert contents[1].startswith("[Same result as the later call `list_orders` (call_5) below")
    assert contents[3] == FILE + "# edited\n"
    assert json.loads(contents[4]) == json.loads(LISTING)
    assert forwarded[-1] == {"role": "user", "content": "Now run the tests."}


async def test_references_replayed_on_later_turns_move_on_to_a_newer_copy(
    upstream: OpenAIUpstream, start_proxy: StartProxy
) -> None:
    """Rewrite memory replays the references byte for byte; a newer copy later moves them on, never to nothing."""
    base_url = await start_proxy()
    first = agent_run()
    second = [*first, {"role": "assistant", "content": "Tests pass."}, {"role": "user", "content": "Thanks."}]
    third = [
        *second,
        *step(6, "read_file", {"path": "handler.py"}, FILE + "# edited\n"),
        *step(7, "list_orders", {}, LISTING),
        {"role": "user", "content": "Check the orders once more."},
    ]
    forwarded = []
    async with openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0) as client:
        for messages in (first, second, third):
            raw = await client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
            forwarded.append((raw.headers["X-Compaction"], upstream.requests[-1].json["messages"]))
    (state_1, sent_1), (state_2, sent_2), (state_3, sent_3) = forwarded
    assert (state_1, state_2, state_3) == ("compacted", "unchanged", "compacted")
    assert sent_2[: len(sent_1)] == sent_1, "the rewrite is replayed as it was sent"
    results = {message["tool_call_id"]: message["content"] for message in sent_3 if message["role"] == "tool"}
    assert results["call_2"].startswith("[Same result as the later call `list_orders` (call_7) below")
    assert results["call_5"].startswith("[Same result as the later call `list_orders` (call_7) below")
    assert results["call_4"].startswith("[Same result as the later call `read_file` (call_6) below")
    assert json.loads(results["call_7"]) == json.loads(LISTING)
