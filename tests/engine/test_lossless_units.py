"""Focused tests of `duplicate_results`, `json_minify` and `superseded_results`, and of how later steps treat them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.engine import (
    DEFAULT_CHAIN,
    STRATEGY_NAMES,
    CompactionChain,
    DuplicateResults,
    JsonMinify,
    Kept,
    MemoryOffloadStore,
    SupersededResults,
    TiktokenCounter,
    ToolResultOffload,
    ToolResultPruning,
    Transcript,
)
from proxy.engine.plan import COMPACTION_META_KEY, EditPlan
from proxy.engine.strategies.duplicate_results import DEFAULT_REFERENCE
from proxy.engine.strategies.json_minify import minified
from proxy.engine.strategies.references import REFERS_TO
from proxy.engine.strategies.registry import strategy_by_name

COUNTER = TiktokenCounter()
FILE = "import os\n\ndef main() -> None:\n    print(os.getcwd())\n" * 20


def step(call_id: str, tool: str, arguments: str, content: Any) -> list[dict[str, Any]]:
    """An assistant message calling one tool, and the tool's result."""
    call = {"id": call_id, "type": "function", "function": {"name": tool, "arguments": arguments}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": content},
    ]


def run(*steps: list[dict[str, Any]], task: str = "Fix the bug.") -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    messages.append({"role": "user", "content": task})
    for part in steps:
        messages += part
    return messages


def compact(strategy: Any, messages: list[dict[str, Any]], meta: list[dict[str, Any]] | None = None) -> EditPlan:
    plan = CompactionChain([strategy] if not isinstance(strategy, list) else strategy).compact(
        Transcript(messages, COUNTER, meta), 0
    )
    assert plan is not None
    return plan.plan


def test_older_copies_become_references_to_the_newest_copy() -> None:
    messages = run(
        step("call_1", "read_file", '{"path": "main.py"}', FILE),
        step("call_2", "grep", '{"q": "os"}', "main.py:1"),
        step("call_3", "read_file", '{"path": "main.py"}', FILE),
        step("call_4", "cat", '{"file": "main.py"}', FILE),
    )
    plan = compact(DuplicateResults(), messages)
    output = plan.apply_messages(messages)
    reference = "[Same result as the later call `cat` (call_4) below.]"
    assert [output[3]["content"], output[7]["content"]] == [reference, reference]
    assert output[3]["tool_call_id"] == "call_1", "the reference still answers its own call"
    assert output[9] is messages[9] and output[5] is messages[5]
    assert [entry.meta[COMPACTION_META_KEY][REFERS_TO] for entry in plan.created()] == ["call_4", "call_4"]


def test_json_differing_only_in_whitespace_is_a_copy() -> None:
    """A listing minified by an earlier compaction is a copy of the same listing pretty-printed later."""
    listing = json.dumps([{"id": i, "name": f"item-{i}"} for i in range(40)], indent=2)
    messages = run(step("call_1", "list_items", "{}", minified(listing)), step("call_2", "list_items", "{}", listing))
    (entry,) = compact(DuplicateResults(), messages).created()
    assert (entry.replaces, entry.meta[COMPACTION_META_KEY][REFERS_TO]) == (3, "call_2")


def test_a_copy_smaller_than_its_reference_stays() -> None:
    messages = run(step("call_1", "touch", "{}", "OK"), step("call_2", "touch", "{}", "OK"))
    assert DuplicateResults().plan(Transcript(messages, COUNTER), 0) is None


def test_minified_json_keeps_every_literal_key_order_and_repeated_key() -> None:
    text = '{\n  "b": 1.0,\n  "a": [1e5, -0.0, "t w\\u00e9\\n"],\n  "b": 2,\n  "n": 12345678901234567890\n}\n'
    assert minified(text) == '{"b":1.0,"a":[1e5,-0.0,"t w\\u00e9\\n"],"b":2,"n":12345678901234567890}'


@pytest.mark.parametrize("text", ["[1, 2, oops]", '"a string"', '{"already":"compact"}', "plain text", "12 ", ""])
def test_what_is_not_json_or_would_not_shrink_is_left_alone(text: str) -> None:
    assert minified(text) is None


def test_a_pretty_printed_150_item_listing_loses_its_indentation() -> None:
    listing = json.dumps(
        [{"id": i, "name": f"item-{i}", "size": i * 512, "dir": i % 7 == 0} for i in range(150)], indent=2
    )
    messages = run(step("call_1", "list_items", "{}", listing), step("call_2", "list_items", '{"page": 2}', "[]"))
    plan = compact(JsonMinify(), messages)
    (entry,) = plan.created()
    assert json.loads(entry.message["content"]) == json.loads(listing)
    before, after = COUNTER.text_tokens(listing), COUNTER.text_tokens(entry.message["content"])
    assert after < 0.6 * before, (before, after)
    assert entry.meta[COMPACTION_META_KEY] == {"strategy": "json_minify", "lossless": True}


def test_json_in_text_parts_is_minified_part_by_part() -> None:
    parts = [{"type": "text", "text": '{\n  "a": 1\n}'}, {"type": "text", "text": "not json"}]
    messages = run(step("call_1", "fetch", "{}", parts))
    (entry,) = compact(JsonMinify(), messages).created()
    assert entry.message["content"] == [{"type": "text", "text": '{"a":1}'}, parts[1]]


def test_superseded_results_only_for_named_tools_and_the_same_arguments() -> None:
    messages = run(
        step("call_1", "read_file", '{"path": "a.py", "lines": 10}', FILE),
        step("call_2", "read_file", '{"path": "b.py"}', FILE + "# b"),
        step("call_3", "search", '{"q": "x"}', FILE + "# old hits"),
        step("call_4", "read_file", '{"lines": 10, "path": "a.py"}', FILE + "# edited"),
        step("call_5", "search", '{"q": "x"}', FILE + "# new hits"),
    )
    assert SupersededResults().plan(Transcript(messages, COUNTER), 0) is None, "no tool named: nothing superseded"
    plan = compact(SupersededResults(["read_file"]), messages)
    (entry,) = plan.created()
    assert entry.replaces == 3
    assert entry.message["content"] == (
        "[Superseded by the later call `read_file` (call_4) below with the same arguments; call it again for the"
        " current state.]"
    )


def test_a_copy_of_a_superseded_result_is_superseded_too() -> None:
    """Read, read again (the same), read after an edit: both older reads point to the newest, none to nothing."""
    arguments = '{"path": "main.py"}'
    messages = run(
        step("call_1", "read_file", arguments, FILE),
        step("call_2", "read_file", arguments, FILE),
        step("call_3", "read_file", arguments, FILE + "# edited"),
    )
    plan = compact([DuplicateResults(), SupersededResults(["read_file"])], messages)
    assert [(entry.replaces, entry.strategy) for entry in plan.created()] == [
        (3, "superseded_results"),
        (5, "superseded_results"),
    ]
    assert {entry.meta[COMPACTION_META_KEY][REFERS_TO] for entry in plan.created()} == {"call_3"}


def test_references_move_on_when_a_newer_copy_arrives_on_a_later_turn() -> None:
    first_turn = run(
        step("call_1", "read_file", '{"path": "main.py"}', FILE),
        step("call_2", "read_file", '{"path": "main.py"}', FILE),
    )
    plan = compact(DuplicateResults(), first_turn)
    view = plan.apply_messages(first_turn)
    view_meta = [{} if isinstance(entry, Kept) else dict(entry.meta) for entry in plan.entries]
    later = [*view, *step("call_3", "read_file", '{"path": "main.py"}', FILE)]
    second = compact(DuplicateResults(), later, [*view_meta, {}, {}])
    output = second.apply_messages(later)
    reference = DEFAULT_REFERENCE.replace("{tool_name}", "read_file").replace("{call_id}", "call_3")
    assert [output[3]["content"], output[5]["content"]] == [reference, reference], "not moved on to the newest copy"
    assert output[7]["content"] == FILE


def test_pruning_a_referenced_result_turns_its_references_into_placeholders() -> None:
    messages = run(
        step("call_1", "read_file", '{"path": "main.py"}', FILE),
        step("call_2", "read_file", '{"path": "main.py"}', FILE),
        step("call_3", "run_tests", "{}", "3 passed"),
    )
    plan = compact([DuplicateResults(), ToolResultPruning(min_tokens=10)], messages)
    output = plan.apply_messages(messages)
    placeholder = "[This tool result was removed to free up context. Call `read_file` again if you need it.]"
    assert [output[3]["content"], output[5]["content"]] == [placeholder, placeholder]
    assert [entry.strategy for entry in plan.created()] == ["tool_result_pruning", "tool_result_pruning"]
    assert all(REFERS_TO not in entry.meta[COMPACTION_META_KEY] for entry in plan.created())


def test_pruning_still_prunes_a_minified_result() -> None:
    listing = json.dumps(list(range(400)), indent=1)
    messages = run(step("call_1", "list_items", "{}", listing), step("call_2", "run_tests", "{}", "ok"))
    plan = compact([JsonMinify(), ToolResultPruning(min_tokens=10)], messages)
    assert plan.created()[0].message["content"].startswith("[This tool result was removed")


def test_offloading_keeps_references_and_takes_minified_results() -> None:
    """An offloaded result says how to read it back, so references to it stay; a minified result is still offloaded."""
    listing = json.dumps(list(range(300)), indent=1)
    messages = run(
        step("call_1", "read_file", '{"path": "main.py"}', FILE),
        step("call_2", "read_file", '{"path": "main.py"}', FILE),
        step("call_3", "list_items", "{}", listing),
        step("call_4", "run_tests", "{}", "ok"),
    )
    store = MemoryOffloadStore()
    plan = compact([DuplicateResults(), JsonMinify(), ToolResultOffload(store, min_tokens=10)], messages)
    output = plan.apply_messages(messages)
    assert output[3]["content"].startswith("[Same result as the later call `read_file` (call_2) below")
    assert output[5]["content"].startswith("Tool result offloaded") and output[7]["content"].startswith(
        "Tool result offloaded"
    )
    assert json.loads(store.get(plan.created()[-1].meta["tool_result_offloaded"][0]) or "") == list(range(300))


def test_lossless_steps_lead_the_default_chain_and_are_named() -> None:
    assert DEFAULT_CHAIN[1:4] == ("duplicate_results", "superseded_results", "json_minify")
    assert set(DEFAULT_CHAIN) <= set(STRATEGY_NAMES)
    built = strategy_by_name("superseded_results", superseded_tools=["read_file"])
    assert isinstance(built, SupersededResults) and built.tools == {"read_file"}
