"""What the proxy keeps of serialized JSON holds about its length, not orjson's grown buffer."""

from __future__ import annotations

import tracemalloc
import uuid
from collections.abc import Callable
from typing import Any

import orjson

from proxy.engine.json_bytes import json_bytes
from proxy.engine.messages import message_key


def held(make: Callable[[], Any]) -> int:
    """Bytes still allocated once `make()` returned, what it returned kept."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = make()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del kept
    return after - before


def test_json_bytes_are_the_same_bytes_in_a_buffer_of_their_own_length() -> None:
    documents = [{"path": f"src/h{index}.py"} for index in range(1000)]
    assert [json_bytes(document) for document in documents] == [orjson.dumps(document) for document in documents]
    small = held(lambda: [json_bytes(document) for document in documents])
    assert small < 1000 * 200  # orjson's own: over 4 KiB each
    large = {"messages": [{"role": "tool", "content": "x" * 1000} for _ in range(3000)]}
    size = len(orjson.dumps(large))
    assert held(lambda: json_bytes(large)) < 1.05 * size


def test_message_keys_remember_canonical_arguments_at_about_their_length() -> None:
    run = uuid.uuid4().hex
    calls = [{"name": "read", "arguments": f'{{"p": "{run}{index}"}}'} for index in range(1000)]
    messages = [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": call}]}
        for call in calls
    ]
    assert held(lambda: [message_key(message) for message in messages]) < 1000 * 1024  # was over 4 KiB a call
