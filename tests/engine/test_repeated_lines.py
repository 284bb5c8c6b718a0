"""`repeated_lines`: runs of repeated lines and blocks written once with a marker; lossless, idempotent, tools only."""

from __future__ import annotations

import random
import timeit
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.engine import DEFAULT_CHAIN, CompactionChain, DuplicateResults, RepeatedLines, TiktokenCounter, Transcript
from proxy.engine.plan import COMPACTION_META_KEY
from proxy.engine.strategies.repeated_lines import MARKER, MAX_BLOCK_LINES, collapsed, marker
from proxy.engine.tool_results import LOSSLESS
from tests.support.examples import examples

COUNTER = TiktokenCounter()

TRACE = ["Traceback (most recent call last):", '  File "fetch.py", line 12, in <module>', "ConnectionError: timed out"]
LOG = "\n".join(["$ fetch --retry 5", *["Downloading index..."] * 38, *TRACE * 5, "gave up after 5 attempts", ""])


def expanded(text: str) -> str:
    """The original of a collapsed text: each marker replaced by that many more copies of the lines before it."""
    segments: list[list[str]] = []
    for line in text.split("\n"):
        match = MARKER.fullmatch(line)
        if match is None:
            segments.append([line])
            continue
        size, times = int(match.group(1) or 1), int(match.group(2))
        segments.append([copy for segment in segments[-size:] for copy in segment] * times)
    return "\n".join(line for segment in segments for line in segment)


def test_a_log_is_written_once_per_run_with_markers() -> None:
    assert collapsed(LOG) == "\n".join(
        [
            "$ fetch --retry 5",
            "Downloading index...",
            "[the previous line repeats 37 more times]",
            *TRACE,
            "[the previous 3 lines repeat 4 more times]",
            "gave up after 5 attempts",
            "",
        ]
    )


def test_what_does_not_shorten_or_could_be_misread_is_left_alone() -> None:
    assert collapsed("a\nb\nc") is None, "nothing repeats"
    assert collapsed("ok\nok") is None, "the marker would be longer than the copy it replaces"
    assert collapsed('[\n  "same line, again and again",\n  "same line, again and again"\n]') is None, "JSON"
    held = "\n".join(["step", "[the previous line repeats 2 more times]", *["Downloading index..."] * 30])
    assert collapsed(held) is None, "a line reading like a marker: a marker could no longer be told from the text"
    assert marker(1, 1) == "[the previous line repeats 1 more time]"
    assert marker(4, 2) == "[the previous 4 lines repeat 2 more times]"


LINES = st.sampled_from(
    ["", "ok", "Downloading index... 42%", "ERROR: connection reset by peer", "  at fetch (client.js:12:7)", "}"]
)
RUNS = st.lists(st.tuples(st.lists(LINES, min_size=1, max_size=5), st.integers(1, 12)), max_size=12)


def text_of(runs: list[tuple[list[str], int]], marker_like: bool) -> str:
    lines = [line for block, times in runs for line in block * times]
    return "\n".join([*lines, "[the previous line repeats 3 more times]"] if marker_like else lines)


@settings(max_examples=examples(300))
@given(runs=RUNS, marker_like=st.booleans())
def test_collapsing_is_lossless_shorter_and_idempotent(runs: list[tuple[list[str], int]], marker_like: bool) -> None:
    text = text_of(runs, marker_like)
    written = collapsed(text)
    if written is None:
        return
    assert expanded(written) == text, "expanding the markers gives back every line, in order"
    assert len(written) < len(text)
    assert collapsed(written) is None, "a second pass changes nothing"


def searched_one_start_at_a_time(text: str) -> str | None:
    """What `collapsed` specifies, the slow way: at each line, every block size up to 64 is tried and counted out."""
    lines = text.split("\n")
    if len(set(lines)) == len(lines) or collapsed(text) is None:
        return collapsed(text)
    written, start = [], 0
    while start < len(lines):
        best, best_gain = (1, 1), 0
        for size in range(1, MAX_BLOCK_LINES + 1):
            times = 1
            while start + (times + 1) * size <= len(lines) and (
                lines[start + times * size : start + (times + 1) * size] == lines[start : start + size]
            ):
                times += 1
            gain = (
                sum(len(line) + 1 for line in lines[start : start + size]) * (times - 1)
                - len(marker(size, times - 1))
                - 1
            )
            if times > 1 and gain > best_gain:
                best, best_gain = (size, times), gain
        written += lines[start : start + best[0]] + ([marker(best[0], best[1] - 1)] if best[1] > 1 else [])
        start += best[0] * best[1]
    return "\n".join(written)


FEW_LINES = st.lists(st.sampled_from(["a", "bb", "", "x" * 30, "Downloading index... 42%", "e" * 70]), max_size=400)


@settings(max_examples=examples(300))
@given(lines=FEW_LINES)
def test_the_runs_found_are_those_a_search_of_every_start_and_size_finds(lines: list[str]) -> None:
    text = "\n".join(lines)
    assert collapsed(text) == searched_one_start_at_a_time(text)


def test_a_result_of_few_distinct_short_lines_costs_about_what_counting_it_costs() -> None:
    """The costliest text to search (200 KB of lines reading "a" or "b": every line recurs at most block sizes) is
    collapsed in a small multiple of the time tiktoken takes to count it, on the same machine in the same test.
    Searching one start at a time took 57 times as long (1.3 s on the machine this was written on); now about 2."""
    rng = random.Random(7)
    text = "\n".join(rng.choice("ab") for _ in range(100_000))

    def fastest(work: Callable[[], object]) -> float:
        return min(timeit.repeat(work, number=1, repeat=3))

    assert fastest(lambda: collapsed(text)) < 8 * fastest(lambda: COUNTER.text_tokens(text))


def conversation(log: str) -> list[dict[str, Any]]:
    call = {"id": "call_1", "type": "function", "function": {"name": "run_build", "arguments": "{}"}}
    return [
        {"role": "system", "content": "You are a build agent.\n" + "Never skip a failing step.\n" * 20},
        {"role": "user", "content": "Here is what I saw:\n" + log},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": log},
        {"role": "user", "content": "And again:\n" + log},
    ]


@settings(max_examples=examples(100))
@given(runs=RUNS)
def test_only_tool_results_are_rewritten_and_only_when_that_saves_tokens(runs: list[tuple[list[str], int]]) -> None:
    log = text_of(runs, False) + "\n" + LOG
    messages = conversation(log)
    transcript = Transcript(messages, COUNTER)
    plan = RepeatedLines().plan(transcript, 0)
    assert plan is not None, "the log always holds a run worth collapsing"
    output = plan.apply_messages(messages)
    assert [output[i] for i in (0, 1, 2, 4)] == [messages[i] for i in (0, 1, 2, 4)], "never the user's or the system's"
    assert expanded(output[3]["content"]) == log
    assert transcript.edited(plan).total() < transcript.total()
    (entry,) = plan.created()
    assert entry.meta[COMPACTION_META_KEY][LOSSLESS] is True, "later strategies still treat it as the tool's output"
    assert RepeatedLines().plan(transcript.edited(plan), 0) is None, "a second pass changes nothing"


def test_it_runs_only_over_the_target_and_leads_the_lossy_steps() -> None:
    transcript = Transcript(conversation(LOG), COUNTER)
    assert RepeatedLines().plan(transcript, transcript.total()) is None
    assert CompactionChain([RepeatedLines()]).compact(transcript, transcript.total() - 1) is not None
    at = DEFAULT_CHAIN.index("repeated_lines")
    assert DEFAULT_CHAIN[at - 1 : at + 2] == ("json_minify", "repeated_lines", "tool_result_pruning")


def test_a_copy_collapsed_by_an_earlier_compaction_is_still_a_duplicate_of_the_raw_copy_after_it() -> None:
    """Rewrite memory replays the collapsed copy; the same log returned again later still makes it a reference."""
    messages = conversation(LOG)
    first = CompactionChain([RepeatedLines()]).compact(Transcript(messages, COUNTER), 0)
    assert first is not None
    again = {"id": "call_2", "type": "function", "function": {"name": "run_build", "arguments": "{}"}}
    later = [
        *first.compacted.messages[:4],
        {"role": "assistant", "content": None, "tool_calls": [again]},
        {"role": "tool", "tool_call_id": "call_2", "content": LOG},
        messages[4],
    ]
    meta = [*first.compacted.meta[:4], {}, {}, {}]
    second = CompactionChain([DuplicateResults()]).compact(Transcript(later, COUNTER, meta), 0)
    assert second is not None
    assert second.compacted.messages[3]["content"] == "[Same result as the later call `run_build` (call_2) below.]"
