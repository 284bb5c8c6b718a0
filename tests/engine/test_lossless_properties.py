"""Property tests of the lossless and near-lossless strategies, alone, in the default chain and across turns."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.engine import (
    DEFAULT_CHAIN,
    ApproximateCounter,
    CompactionChain,
    DuplicateResults,
    EditPlan,
    JsonMinify,
    Kept,
    MemoryOffloadStore,
    MiddleOut,
    SlidingWindow,
    Strategy,
    SupersededResults,
    ToolResultOffload,
    ToolResultPruning,
    Transcript,
    chain_by_names,
)
from proxy.engine.messages import canonical_json_text
from proxy.engine.plan import COMPACTION_META_KEY
from proxy.engine.strategies.json_minify import minified
from proxy.engine.strategies.references import REFERS_TO
from tests.engine.conversations import Conversation, assert_tool_pairs_intact
from tests.engine.lossless_runs import assert_references_hold, data_of, repetitive_runs, text_of
from tests.support.examples import examples

COUNTER = ApproximateCounter()
PROPERTY_SETTINGS = settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
SUPERSEDED = ["read_file", "list_items"]

LOSSLESS: dict[str, list[Strategy]] = {
    "duplicate_results": [DuplicateResults()],
    "json_minify": [JsonMinify()],
    "both": [DuplicateResults(), JsonMinify()],
}
ALL: dict[str, list[Strategy]] = {
    **LOSSLESS,
    "superseded_results": [SupersededResults(SUPERSEDED)],
    "default_chain": list(chain_by_names(DEFAULT_CHAIN, superseded_tools=SUPERSEDED).strategies),
    "with_offloading": [
        DuplicateResults(),
        SupersededResults(SUPERSEDED),
        JsonMinify(),
        ToolResultOffload(MemoryOffloadStore(), min_tokens=20),
        ToolResultPruning(min_tokens=20),
        SlidingWindow(),
        MiddleOut(min_keep_tokens=16),
    ],
}


def _compact(
    messages: list[dict[str, Any]], meta: list[Mapping[str, Any]], strategies: list[Strategy], fraction: float
) -> tuple[EditPlan, list[dict[str, Any]], list[Mapping[str, Any]]] | None:
    transcript = Transcript(messages, COUNTER, meta)
    result = CompactionChain(strategies).compact(transcript, int(transcript.total() * fraction))
    if result is None:
        return None
    plan = result.plan
    output_meta = [meta[entry.index] if isinstance(entry, Kept) else entry.meta for entry in plan.entries]
    return plan, plan.apply_messages(messages), output_meta


@pytest.mark.parametrize("name", LOSSLESS)
@PROPERTY_SETTINGS
@given(run=repetitive_runs(), fraction=st.floats(min_value=0.0, max_value=1.0))
def test_lossless_strategies_change_no_data(name: str, run: Conversation, fraction: float) -> None:
    """Every result still says what it said: minified JSON parses to the same data (key order and repeated keys
    included), and a duplicate's reference names a later result that holds exactly its data."""
    compacted = _compact(run.messages, run.meta, LOSSLESS[name], fraction)
    if compacted is None:
        return
    plan, output, meta = compacted
    assert len(output) == len(run.messages), "a lossless step removed a message"
    assert_tool_pairs_intact(output)
    assert_references_hold(output, meta)
    positions = _result_positions(output)
    for position, entry in enumerate(plan.entries):
        if isinstance(entry, Kept):
            assert entry.index == position
            continue
        original = run.messages[position]
        marker = entry.meta[COMPACTION_META_KEY]
        if marker["strategy"] == "json_minify":
            assert data_of(text_of(entry.message)) == data_of(text_of(original))
            assert len(text_of(entry.message)) < len(text_of(original))
        else:
            target = output[positions[marker[REFERS_TO]]]
            assert data_of(text_of(target)) == data_of(text_of(original)), "a reference to different data"


def _result_positions(messages: list[dict[str, Any]]) -> dict[str, int]:
    return {message["tool_call_id"]: index for index, message in enumerate(messages) if message["role"] == "tool"}


def _call_of(messages: list[dict[str, Any]], index: int) -> tuple[str, bytes]:
    call_id = messages[index]["tool_call_id"]
    for position in range(index - 1, -1, -1):
        for call in messages[position].get("tool_calls") or ():
            if call["id"] == call_id:
                return call["function"]["name"], canonical_json_text(call["function"]["arguments"])
    raise AssertionError(f"no call for the result at {index}")


@PROPERTY_SETTINGS
@given(run=repetitive_runs(), fraction=st.floats(min_value=0.0, max_value=1.0))
def test_superseded_results_point_to_the_same_call_made_later(run: Conversation, fraction: float) -> None:
    compacted = _compact(run.messages, run.meta, ALL["superseded_results"], fraction)
    if compacted is None:
        return
    plan, output, meta = compacted
    assert_tool_pairs_intact(output)
    assert_references_hold(output, meta)
    positions = _result_positions(output)
    for position, entry in enumerate(plan.entries):
        if isinstance(entry, Kept):
            continue
        name, arguments = _call_of(run.messages, position)
        assert name in SUPERSEDED, f"{name} was not named as superseded"
        target = positions[entry.meta[COMPACTION_META_KEY][REFERS_TO]]
        assert _call_of(output, target) == (name, arguments)
        assert target > position


@pytest.mark.parametrize("name", ALL)
@PROPERTY_SETTINGS
@given(run=repetitive_runs(), fraction=st.floats(min_value=0.0, max_value=1.0))
def test_pairs_whole_references_hold_and_protected_messages_survive(
    name: str, run: Conversation, fraction: float
) -> None:
    """Whatever runs after the lossless steps (pruning, dropping turns, cutting), no reference points to nothing."""
    compacted = _compact(run.messages, run.meta, ALL[name], fraction)
    if compacted is None:
        return
    plan, output, meta = compacted
    assert_tool_pairs_intact(output)
    assert_references_hold(output, meta)
    assert output[0] is run.messages[0], "the system prompt was changed"
    last_user = max(index for index, message in enumerate(run.messages) if message["role"] == "user")
    assert Kept(last_user) in plan.entries, "the latest user message was changed or removed"


@PROPERTY_SETTINGS
@given(
    run=repetitive_runs(max_steps=14),
    split=st.floats(min_value=0.2, max_value=0.9),
    first=st.floats(min_value=0.0, max_value=1.0),
    second=st.floats(min_value=0.0, max_value=1.0),
)
def test_references_stay_valid_when_a_replayed_rewrite_is_compacted_again(
    run: Conversation, split: float, first: float, second: float
) -> None:
    """As rewrite memory does: compact a prefix, replay it with later messages appended, compact that again."""
    strategies = ALL["default_chain"]
    cut = max(2, int(len(run.messages) * split))
    while cut < len(run.messages) and run.messages[cut]["role"] == "tool":
        cut += 1  # a request ends after a step's results, never between them
    earlier = _compact(run.messages[:cut], run.meta[:cut], strategies, first)
    view, view_meta = (run.messages[:cut], run.meta[:cut]) if earlier is None else (earlier[1], earlier[2])
    later_messages = [*view, *run.messages[cut:]]
    later = _compact(later_messages, [*view_meta, *run.meta[cut:]], strategies, second)
    if later is None:
        return
    _plan, output, meta = later
    assert_tool_pairs_intact(output)
    assert_references_hold(output, meta)


@pytest.mark.parametrize("name", ALL)
@PROPERTY_SETTINGS
@given(run=repetitive_runs(), fraction=st.floats(min_value=0.0, max_value=1.0))
def test_input_untouched_and_output_deterministic(name: str, run: Conversation, fraction: float) -> None:
    before = copy.deepcopy((run.messages, run.meta))
    first = _compact(run.messages, run.meta, ALL[name], fraction)
    assert (run.messages, run.meta) == before
    fresh = Conversation(copy.deepcopy(run.messages), copy.deepcopy(run.meta))
    second = _compact(fresh.messages, fresh.meta, ALL[name], fraction)
    assert (first is None) == (second is None)
    if first is not None and second is not None:
        assert orjson.dumps(first[1]) == orjson.dumps(second[1])


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=examples(300), deadline=None)
@given(
    value=JSON_VALUES,
    indent=st.sampled_from([None, 0, 1, 2, 4, "\t"]),
    ascii_only=st.booleans(),
    padding=st.sampled_from(["", " ", "\n", "\u00a0", "\r\n\t"]),
)
def test_minified_json_parses_to_the_same_data(value: Any, indent: Any, ascii_only: bool, padding: str) -> None:
    text = padding + json.dumps(value, indent=indent, ensure_ascii=ascii_only) + padding
    compact = minified(text)
    if compact is None:
        return
    same_data = json.loads(text, object_pairs_hook=list)  # raises if the original was not JSON to begin with
    assert json.loads(compact, object_pairs_hook=list) == same_data
    assert len(compact) < len(text)


@settings(max_examples=examples(300), deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list('{}[]",:01.eE-+ \n\t\\u\u00a0a')), max_size=40))
def test_only_json_is_minified(text: str) -> None:
    compact = minified(text)
    if compact is not None:
        assert json.loads(compact, object_pairs_hook=list) == json.loads(text, object_pairs_hook=list)
