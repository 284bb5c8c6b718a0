"""Whether a reference says what it hides: offloaded and pruned results on `bench.retention`'s coding transcripts.

    python -m bench.digests [--smoke] [--output FILE]

Each transcript is compacted as the proxy would, once with offloading (the default) and once without (pruning), and
with each stand-in as it was before digests (offloading's 200-character preview, pruning's bare placeholder) and as it
is now (the digest, `proxy.engine.digest`). For every tool result a compaction replaced, it counts:

- telling line: the stand-in quotes a line of the result (with a letter or digit) that no other distinct result of
  the transcript has: what tells this test run, this version of the file, this grep from the others. Counted over the
  results that have such a line (a file read before any edit has none: every later version holds all its lines);
- call arguments: the stand-in quotes the call's arguments (which file, which query);
- tokens: what the stand-ins cost.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.publish import published
from bench.retention import COMPACT_AT, COMPACT_TO, SEEDS, SMOKE, WINDOW, transcript
from proxy.engine import DEFAULT_CHAIN, CompactionChain, Thresholds, TiktokenCounter, Transcript, chain_by_names
from proxy.engine.compaction import compact_if_needed
from proxy.engine.strategies.offload import MemoryOffloadStore, ToolResultOffload
from proxy.engine.strategies.tool_result_pruning import ToolResultPruning
from proxy.pipeline.offload.tool import POINTER

STAND_INS = {
    "offloaded, before (200-character preview)": (True, False),
    "offloaded, now (digest)": (True, True),
    "pruned, before (placeholder)": (False, False),
    "pruned, now (placeholder + digest)": (False, True),
}
"""Row label: (offloading on, digests on)."""


def chain(offload: bool, with_digest: bool) -> CompactionChain:
    """The proxy's default chain, with offloading before its first lossy step or not, with digests or not."""
    strategies = [
        ToolResultPruning(with_digest=with_digest) if strategy.name == ToolResultPruning.name else strategy
        for strategy in chain_by_names(DEFAULT_CHAIN).strategies
    ]
    if offload:
        at = next(i for i, strategy in enumerate(strategies) if strategy.name == ToolResultPruning.name)
        stand_in = ToolResultOffload(MemoryOffloadStore(), pointer=POINTER, with_digest=True)
        if not with_digest:
            stand_in = ToolResultOffload(MemoryOffloadStore())
        strategies.insert(at, stand_in)
    return CompactionChain(strategies)


def telling_lines(messages: Sequence[Mapping[str, Any]]) -> dict[str, set[str]]:
    """Each distinct tool result's lines (stripped, with a letter or digit) that no other distinct result has."""
    lines = {
        message["content"]: {line.strip() for line in message["content"].splitlines() if re.search(r"\w", line)}
        for message in messages
        if message["role"] == "tool" and isinstance(message.get("content"), str)
    }
    seen: Counter[str] = Counter(line for held in lines.values() for line in held)
    return {text: {line for line in held if seen[line] == 1} for text, held in lines.items()}


def measure(messages: list[dict[str, Any]], offload: bool, with_digest: bool, window: int) -> Counter[str]:
    """The counts of one transcript compacted by one chain (see the module docstring)."""
    counter = TiktokenCounter()
    outcome = compact_if_needed(
        Transcript(messages, counter), Thresholds(window, COMPACT_AT, COMPACT_TO), chain(offload, with_digest), 0
    )
    counts: Counter[str] = Counter()
    if outcome.result is None:
        return counts
    telling = telling_lines(messages)
    calls = {
        call["id"]: call["function"]["arguments"] for message in messages for call in message.get("tool_calls") or ()
    }
    wanted = "tool_result_offloading" if offload else "tool_result_pruning"
    for entry in outcome.result.plan.created():
        if entry.strategy != wanted or entry.replaces is None:
            continue
        original, stand_in = messages[entry.replaces], str(entry.message["content"])
        tool = next(m for m in messages if m.get("tool_calls") and m["tool_calls"][0]["id"] == original["tool_call_id"])
        name = tool["tool_calls"][0]["function"]["name"]
        counts["replaced"] += 1
        counts[f"replaced:{name}"] += 1
        counts["stand_in_tokens"] += counter.text_tokens(stand_in)
        if telling[original["content"]]:
            counts["has_telling"] += 1
            counts[f"has_telling:{name}"] += 1
        if any(line in stand_in for line in telling[original["content"]]):
            counts["telling"] += 1
            counts[f"telling:{name}"] += 1
        if calls[original["tool_call_id"]] in stand_in:
            counts["arguments"] += 1
    return counts


def run(seeds: Sequence[int] = SEEDS, window: int = WINDOW) -> dict[str, Any]:
    """Every stand-in on every transcript, summed over the transcripts."""
    transcripts = [transcript(seed, window) for seed in seeds]
    rows = []
    for label, (offload, with_digest) in STAND_INS.items():
        total: Counter[str] = Counter()
        for messages in transcripts:
            total += measure(messages, offload, with_digest, window)
        rows.append({"stand_in": label, **dict(sorted(total.items()))})
    return {
        "settings": {"window": window, "compact_at": COMPACT_AT, "compact_to": COMPACT_TO, "seeds": list(seeds)},
        "rows": rows,
    }


def render(results: dict[str, Any]) -> list[str]:
    """The markdown table."""
    settings = results["settings"]
    tools = sorted({key.split(":")[1] for row in results["rows"] for key in row if key.startswith("replaced:")})
    lines = [
        f"### Whether a reference says what it hides (`bench.digests`: {len(settings['seeds'])} agent transcripts, "
        f"{settings['window']}-token window)",
        "",
        "| stand-in | results replaced | quotes a telling line (of those with one) | "
        + " | ".join(f"telling: {tool}" for tool in tools)
        + " | quotes the call's arguments | tokens per stand-in |",
        "| --- | ---: | ---: | " + " | ".join("---:" for _ in tools) + " | ---: | ---: |",
    ]
    for row in results["rows"]:
        replaced = max(row.get("replaced", 0), 1)
        per_tool = [f"{row.get(f'telling:{tool}', 0)}/{row.get(f'has_telling:{tool}', 0)}" for tool in tools]
        telling = f"{row.get('telling', 0)}/{row.get('has_telling', 0)}"
        lines.append(
            f"| {row['stand_in']} | {row.get('replaced', 0)} | {telling} | "
            + " | ".join(per_tool)
            + f" | {row.get('arguments', 0) / replaced:.0%} | {row.get('stand_in_tokens', 0) / replaced:.0f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print the table; write the JSON results when asked."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="one small transcript (seconds)")
    parser.add_argument("--output", type=Path, help="write the JSON results here")
    args = parser.parse_args(argv)
    results = run(*SMOKE) if args.smoke else run()
    return published(render(results), results, args.output)


if __name__ == "__main__":
    sys.exit(main())
