"""Digests: what a pruned or offloaded result held, bounded, deterministic, and only where the proxy asks for it."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.engine import (
    DEFAULT_CHAIN,
    CompactionChain,
    DuplicateResults,
    MemoryOffloadStore,
    TiktokenCounter,
    ToolResultOffload,
    ToolResultPruning,
    Transcript,
)
from proxy.engine.digest import ARGUMENTS_CHARS, LINE_CHARS, MAX_CHARS, digest
from proxy.engine.strategies.registry import chain_by_names, strategy_by_name
from proxy.engine.strategies.tool_result_pruning import DEFAULT_PLACEHOLDER
from tests.support.examples import examples

COUNTER = TiktokenCounter()

TEST_LOG = "\n".join(
    [
        "$ pytest -q",
        "============ test session starts ============",
        *(f"tests/test_handler.py::test_case_{n} PASSED" for n in range(40)),
        "tests/test_handler.py::test_refund FAILED",
        "E   KeyError: 'currency' not found in order 1042",
        *(f"tests/test_models.py::test_model_{n} PASSED" for n in range(40)),
        "E   KeyError: 'currency' not found in order 1042",
        "1 failed, 80 passed in 3.21s",
    ]
)


def call(name: str, arguments: str, call_id: str = "call_1") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def result(content: str, call_id: str = "call_1") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def run(*steps: tuple[dict[str, Any], str]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the refund bug."},
    ]
    for tool_call, content in steps:
        messages.append({"role": "assistant", "content": None, "tool_calls": [tool_call]})
        messages.append(result(content, tool_call["id"]))
    return messages


def test_a_test_log_digest_names_the_call_the_size_and_the_telling_lines() -> None:
    text = digest(result(TEST_LOG), call("run_tests", '{"path": "tests/"}'))
    lines = text.splitlines()
    assert lines[0] == f'Digest of run_tests({{"path": "tests/"}}): 86 lines, {len(TEST_LOG)} characters.'
    assert lines[1:3] == ["first: $ pytest -q", "first: ============ test session starts ============"]
    errors = [line for line in lines if line.startswith("error: ")]
    assert errors == [
        "error: tests/test_handler.py::test_refund FAILED",
        "error: E   KeyError: 'currency' not found in order 1042",
    ], "each error line once, in order"
    assert lines[-1] == "last: 1 failed, 80 passed in 3.21s"
    assert not any("PASSED" in line for line in lines), "ordinary lines are left out"


def test_json_results_are_described_by_their_keys_and_length() -> None:
    listing = json.dumps([{"id": i, "customer": f"c-{i}", "total": i * 2.5} for i in range(150)], indent=2)
    array = digest(result(listing), call("list_orders", "{}")).splitlines()
    assert array[1] == "json: array of 150 items, the first with keys: id, customer, total"
    assert array[2].startswith('first: [{"id":0,"customer":"c-0","total":0.0},{"id":1'), "a sample, not indentation"
    config = json.dumps({f"key_{n}": n for n in range(20)}, indent=2)
    described = digest(result(config), None).splitlines()[1]
    assert described.startswith("json: object with 20 keys: key_0, key_1,") and described.endswith(", … (8 more)")


def test_bracket_lines_are_passed_over_and_long_lines_and_arguments_are_cut() -> None:
    text = "[\n  {\n" + "x" * 500 + "\n  }\n]"
    lines = digest(result(text), call("fetch", json.dumps({"query": "y" * 400}))).splitlines()
    assert lines[1] == "first: " + "x" * (LINE_CHARS - 1) + "…"
    head = lines[0].removeprefix("Digest of fetch(").split("): ")[0]
    assert len(head) == ARGUMENTS_CHARS and head.endswith("…")


def test_a_tool_with_no_known_call_is_named_by_the_result() -> None:
    text = digest({"role": "tool", "tool_call_id": "c", "name": "search", "content": "one\ntwo"}, None)
    assert text.splitlines()[0] == "Digest of search(): 2 lines, 7 characters."


LINE = st.one_of(
    st.text(max_size=300),
    st.sampled_from(["ERROR: disk full", "Traceback (most recent call last):", "{", "]", "", "warning: slow", "ok"]),
)


@settings(max_examples=examples(200))
@given(lines=st.lists(LINE, max_size=60), arguments=st.text(max_size=400), name=st.text(min_size=1, max_size=80))
def test_a_digest_is_bounded_and_a_pure_function_of_the_result_and_its_call(
    lines: list[str], arguments: str, name: str
) -> None:
    message, tool_call = result("\n".join(lines)), call(name, arguments)
    text = digest(message, tool_call)
    assert len(text) <= MAX_CHARS
    assert digest(copy.deepcopy(message), copy.deepcopy(tool_call)) == text
    assert message == result("\n".join(lines)), "the message is not mutated"


def test_the_proxy_chain_prunes_with_a_digest_and_the_engine_default_keeps_haystacks_placeholder() -> None:
    """Haystack's placeholder stays the engine's default (the hook's parity); the proxy's chain adds the digest."""
    messages = run((call("run_tests", "{}"), TEST_LOG), (call("read_file", "{}", "call_2"), "ok"))
    placeholder = DEFAULT_PLACEHOLDER.replace("{tool_name}", "run_tests")
    plain = CompactionChain([ToolResultPruning(min_tokens=10)]).compact(Transcript(messages, COUNTER), 0)
    assert plain is not None and plain.compacted.messages[3]["content"] == placeholder
    proxy = chain_by_names(["tool_result_pruning"]).compact(Transcript(messages, COUNTER), 0)
    assert proxy is not None
    assert proxy.compacted.messages[3]["content"] == placeholder + "\n" + digest(
        messages[3], messages[2]["tool_calls"][0]
    )
    pruning = strategy_by_name("tool_result_pruning")
    assert isinstance(pruning, ToolResultPruning) and pruning.with_digest and "tool_result_pruning" in DEFAULT_CHAIN


def test_an_offloaded_result_leaves_its_pointer_and_digest_and_stays_readable() -> None:
    messages = run((call("run_tests", "{}"), TEST_LOG), (call("read_file", "{}", "call_2"), "ok"))
    store = MemoryOffloadStore()
    outcome = CompactionChain([ToolResultOffload(store, min_tokens=10, pointer="Ref {reference}.", with_digest=True)])
    compacted = outcome.compact(Transcript(messages, COUNTER), 0)
    assert compacted is not None
    (reference,) = compacted.compacted.meta[3]["tool_result_offloaded"]
    expected = f"Ref {reference}.\n" + digest(messages[3], messages[2]["tool_calls"][0])
    assert compacted.compacted.messages[3]["content"] == expected
    assert store.get(reference) == TEST_LOG


def test_a_reference_to_a_result_pruned_with_a_digest_gives_way_to_the_placeholder() -> None:
    """The dangling-reference repair still runs when the pruned copy carries a digest."""
    messages = run(
        (call("run_tests", "{}"), TEST_LOG),
        (call("run_tests", "{}", "call_2"), TEST_LOG),
        (call("ls", "{}", "c3"), "a"),
    )
    chain = CompactionChain([DuplicateResults(), ToolResultPruning(min_tokens=10, with_digest=True)])
    compacted = chain.compact(Transcript(messages, COUNTER), 0)
    assert compacted is not None
    output = compacted.compacted.messages
    assert output[3]["content"] == DEFAULT_PLACEHOLDER.replace("{tool_name}", "run_tests")
    assert output[5]["content"].startswith(DEFAULT_PLACEHOLDER.replace("{tool_name}", "run_tests") + "\nDigest of")


def test_a_result_with_images_says_how_many_parts_are_not_text() -> None:
    content = [
        {"type": "text", "text": "screenshot of the login page"},
        {"type": "image_url", "image_url": {"url": "x"}},
    ]
    header = digest({"role": "tool", "tool_call_id": "c", "content": content}, call("screenshot", "{}")).splitlines()[0]
    assert header == "Digest of screenshot({}): 1 line, 28 characters, 1 non-text part."
