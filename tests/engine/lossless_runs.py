"""Hypothesis strategies for tool-heavy agent runs that repeat themselves: re-read files, re-listed JSON, reruns."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import strategies as st

from proxy.engine import COMPACTION_META_KEY
from proxy.engine.strategies.offload import OFFLOADED_META_KEY
from proxy.engine.strategies.references import REFERS_TO
from proxy.engine.tool_results import LOSSLESS
from tests.engine.conversations import Conversation

TOOLS = ["read_file", "list_items", "run_tests"]
ARGUMENTS = ['{"path": "a.py"}', '{"path":"b.py"}', '{"path": "a.py", "lines": 10}', '{"lines":10,"path":"a.py"}', "{}"]
LISTING = [{"id": i, "name": f"item {i}", "score": i / 4, "tags": ["x", "é"]} for i in range(30)]
CONTENTS = [
    "def main():\n    return 42\n" * 12,
    "FAILED tests/test_a.py::test_one - AssertionError\n" * 10,
    json.dumps(LISTING, indent=2),
    json.dumps(LISTING, indent=2, ensure_ascii=False),
    json.dumps({"b": 1, "a": [1.0, 2.50, 1e5, -0.0], "s": "two  spaces\tand\\n", "u": "\u00e9\u2028"}, indent=4),
    '{\n  "dup": 1,\n  "dup": 2,\n  "n": 12345678901234567890\n}',
    '[ 1.10 , 2E3 , "x\\u0041" , {"k" : [ ] } ]',
    '{"already":"compact"}',
    "[1, 2, oops]",
    "OK",
    "",
]


def text_of(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, Mapping))


def data_of(text: str) -> Any:
    """What a result says: the parsed JSON (key order and repeated keys kept) when it is JSON, else the text."""
    try:
        return ("json", json.loads(text, object_pairs_hook=lambda pairs: pairs))
    except ValueError:
        return ("text", text)


@st.composite
def repetitive_runs(draw: st.DrawFn, max_steps: int = 10) -> Conversation:
    """A system prompt, a task, and steps calling a few tools with a few arguments that return a few outputs."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    messages.append({"role": "user", "content": "Fix the failing test. " * draw(st.integers(1, 20))})
    call = 0
    for _step in range(draw(st.integers(1, max_steps))):
        if draw(st.integers(0, 5)) == 0:
            messages.append({"role": "user", "content": "Also keep the API stable."})
        calls = []
        for _ in range(draw(st.integers(1, 3))):
            call += 1
            # Now and then an id used twice, as a broken client might send: such results are never referenced.
            call_id = f"call_{call if draw(st.integers(0, 15)) else 1}"
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": draw(st.sampled_from(TOOLS)), "arguments": draw(st.sampled_from(ARGUMENTS))},
                }
            )
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        for entry in calls:
            content: Any = draw(st.sampled_from(CONTENTS))
            if draw(st.integers(0, 6)) == 0:
                content = [{"type": "text", "text": content}]
            messages.append({"role": "tool", "tool_call_id": entry["id"], "content": content})
    if draw(st.booleans()):
        messages.append({"role": "user", "content": "Now run the whole suite."})
    return Conversation(messages, [{} for _ in messages])


def assert_references_hold(messages: Sequence[Mapping[str, Any]], meta: Sequence[Mapping[str, Any]]) -> None:
    """Every reference names the id of a later tool result that is there and holds the tool's output (or offloaded it,
    saying how to read it back)."""
    for index, marker in enumerate(entry.get(COMPACTION_META_KEY) for entry in meta):
        if not isinstance(marker, Mapping) or REFERS_TO not in marker:
            continue
        targets = [
            position
            for position in range(index + 1, len(messages))
            if messages[position].get("role") == "tool" and messages[position].get("tool_call_id") == marker[REFERS_TO]
        ]
        assert len(targets) == 1, f"reference at {index} points to {len(targets)} results"
        target_marker = meta[targets[0]].get(COMPACTION_META_KEY)
        readable = (
            target_marker is None or target_marker.get(LOSSLESS) is True or OFFLOADED_META_KEY in meta[targets[0]]
        )
        assert readable, f"reference at {index} points to a stub"
