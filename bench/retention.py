"""What each chain keeps: realistic agent transcripts compacted to `compact_to` of a window, chain by chain.

    python -m bench.retention [--smoke] [--output FILE]

The transcripts are generated deterministically (seeded): a long system prompt, long user instructions, and an agent
working through a repository and an orders API: it reads the same files again and again (identical until it edits
them), re-lists 150 orders as pretty-printed JSON, greps, and reruns the tests (logs). Each ends with the latest task
and its first steps. Every chain compacts the same transcripts to the same target, as the proxy would (trigger
`compact_at`, target `compact_to` of the window), and is scored on what is still there:

- distinct tool results kept: of the distinct results the tools returned, the share still present verbatim or
  losslessly (JSON that parses to the same data), by count and by tokens (a reference to a copy that is present is
  nothing lost; a placeholder or a cut-down copy is);
- user instructions kept: the user messages before the latest one still present verbatim;
- latest task whole: its user message and every result of its steps still present verbatim or losslessly.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.publish import published
from proxy.engine import DEFAULT_CHAIN, CompactionChain, Thresholds, TiktokenCounter, Transcript, chain_by_names
from proxy.engine.compaction import compact_if_needed
from proxy.engine.strategies.offload import MemoryOffloadStore, ToolResultOffload, content_reference

OFFLOAD_ROW = "new default + offload (kept, or offloaded and readable back)"
"""The proxy's chain with `offload` on: offloading before the first lossy step, content reachable through the store."""

OLD_DEFAULT = ("provider_compaction", "tool_result_pruning", "sliding_window", "middle_out")
"""The default chain before the lossless strategies (`provider_compaction` acts only on Responses API checkpoints)."""


def _before_loss(*lossless: str) -> tuple[str, ...]:
    """The old default chain with `lossless` steps put where the new default puts them: before anything is lost."""
    return (OLD_DEFAULT[0], *lossless, *OLD_DEFAULT[1:])


CHAINS: dict[str, tuple[Sequence[str], Sequence[str]]] = {
    "old default (provider_compaction, pruning, sliding window, middle-out)": (OLD_DEFAULT, ()),
    "duplicate_results alone": (("duplicate_results",), ()),
    "json_minify alone": (("json_minify",), ()),
    "superseded_results alone (read_file, list_orders)": (("superseded_results",), ("read_file", "list_orders")),
    "duplicate_results + old default": (_before_loss("duplicate_results"), ()),
    "json_minify + old default": (_before_loss("json_minify"), ()),
    "json_minify, duplicate_results + old default": (_before_loss("json_minify", "duplicate_results"), ()),
    "new default": (DEFAULT_CHAIN, ()),
    "new default + superseded_tools read_file, list_orders": (DEFAULT_CHAIN, ("read_file", "list_orders")),
    OFFLOAD_ROW: (DEFAULT_CHAIN, ()),
}
"""Row label: (strategy names, `superseded_tools`)."""

WINDOW = 65_536
COMPACT_AT, COMPACT_TO = 0.7, 0.4
SEEDS = (1, 2, 3, 4)
SMOKE = ([1], 16_384)
"""Seeds and window of the seconds-long smoke run."""
FILL = 0.72
"""Transcripts grow past this share of the window (over the trigger, under the window) before the latest task."""

_INSTRUCTIONS = (
    "the handler must keep backwards compatibility with existing clients and log every rejected order with its"
    " reason never swallow exceptions prefer small functions add a test for each fix run the whole suite before"
    " you report and do not touch the migrations or the public API schema unless asked explicitly"
)
_WORDS = _INSTRUCTIONS.split()
_FILES = ("orders/handler.py", "orders/models.py", "orders/validation.py", "tests/test_handler.py")


def _sentences(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words)).capitalize() + "."


class _Agent:
    """The world an agent works in (files, orders, failing tests) and the transcript it writes, step by step."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.files = {path: self._code(path, 60 + 10 * index) for index, path in enumerate(_FILES)}
        self.orders = [
            {"id": 1000 + i, "customer": f"customer-{i % 37}", "total": round(9.5 + i * 3.25, 2), "status": "open"}
            for i in range(150)
        ]
        self.failing = 5
        self.messages: list[dict[str, Any]] = []
        self.calls = 0

    def _code(self, path: str, lines: int) -> str:
        return "\n".join(f"    value_{n} = compute('{path}', {n}, retries={n % 4})  # step {n}" for n in range(lines))

    def call(self, tool: str, arguments: dict[str, Any]) -> None:
        """One Agent step: the call, and the tool's result from the current state of the world."""
        self.calls += 1
        call_id = f"call_{self.calls:04d}"
        function = {"name": tool, "arguments": json.dumps(arguments)}
        self.messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call_id, "type": "function", "function": function}],
            }
        )
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": self._result(tool, arguments)})

    def _result(self, tool: str, arguments: dict[str, Any]) -> str:
        if tool == "read_file":
            return self.files[arguments["path"]]
        if tool == "list_orders":
            return json.dumps(self.orders, indent=2)
        if tool == "grep":
            hits = [
                f"{path}:{n}: {line.strip()}"
                for path, text in self.files.items()
                for n, line in enumerate(text.splitlines())
                if f"({n % 4})" in line or f"retries={arguments['n']}" in line
            ]
            return "\n".join(hits[:40])
        if tool == "run_tests":
            lines = [
                f"tests/test_handler.py::test_case_{n} {'FAILED' if n < self.failing else 'PASSED'}" for n in range(60)
            ]
            traces = [
                f"E   AssertionError: expected 201, got 200 (case {n})\n    at handler.py:{40 + n}"
                for n in range(self.failing)
            ]
            return "\n".join(
                ["============ test session starts ============", *lines, *traces, f"{self.failing} failed"]
            )
        # write_file: the world changes, so later reads, listings and test runs return something new.
        path = arguments["path"]
        self.files[path] += f"\n    fixed_{self.calls} = True  # edit {self.calls}"
        self.failing = max(self.failing - 1, 0)
        self.orders[self.rng.randrange(len(self.orders))]["status"] = "paid"
        return f"Wrote {len(self.files[path])} bytes to {path}."

    def turn(self, words: int, steps: int, stop: Callable[[], bool]) -> None:
        """A user instruction, up to `steps` of the agent's steps (fewer once `stop()`), and its short reply."""
        self.messages.append({"role": "user", "content": _sentences(self.rng, words)})
        for _ in range(steps):
            if stop():
                break
            tool = self.rng.choices(
                ("read_file", "list_orders", "grep", "run_tests", "write_file"), weights=(6, 2, 2, 2, 1)
            )[0]
            arguments: dict[str, Any] = {}
            if tool in ("read_file", "write_file"):
                arguments = {"path": self.rng.choice(_FILES)}
            elif tool == "grep":
                arguments = {"n": self.rng.randrange(3)}
            self.call(tool, arguments)
        self.messages.append({"role": "assistant", "content": "Done: " + _sentences(self.rng, 30)})


def transcript(seed: int, window: int = WINDOW) -> list[dict[str, Any]]:
    """An agent run filling `FILL` of `window`, then the latest task with its first two steps."""
    counter = TiktokenCounter()
    agent = _Agent(seed)
    agent.messages.append(
        {"role": "system", "content": "You are a careful coding agent. " + _sentences(agent.rng, 300)}
    )
    # Odd seeds: an agent left to work (short instructions, many steps); even seeds: a user who says a lot.
    words, steps = ((60, 300), (4, 10)) if seed % 2 else ((2500, 5000), (1, 4))

    def full() -> bool:
        return counter.messages_tokens(agent.messages) >= FILL * window

    while not full():
        agent.turn(agent.rng.randrange(*words), agent.rng.randrange(*steps), full)
    agent.messages.append({"role": "user", "content": "Latest task: " + _sentences(agent.rng, 200)})
    agent.call("read_file", {"path": _FILES[0]})
    agent.call("run_tests", {})
    return agent.messages


def _data(text: str) -> Any:
    """What a result says: the parsed JSON when it is JSON, else the text itself."""
    try:
        return ("json", json.loads(text))
    except ValueError:
        return ("text", text)


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


@dataclass(frozen=True)
class Score:
    """How one chain did on one transcript."""

    tokens_before: int
    tokens_after: int
    distinct_results: int
    distinct_results_kept: int
    result_tokens: int
    result_tokens_kept: int
    instructions: int
    instructions_kept: int
    latest_task_whole: bool


def score(
    messages: list[dict[str, Any]],
    chain: CompactionChain,
    window: int = WINDOW,
    store: MemoryOffloadStore | None = None,
    compact_to: float = COMPACT_TO,
) -> Score:
    """Compact `messages` as the proxy would and measure what survived.

    :param store: Where the chain offloads: a result it holds counts as kept, since the model can read it back.
    """
    counter = TiktokenCounter()
    transcript_ = Transcript(messages, counter)
    outcome = compact_if_needed(transcript_, Thresholds(window, COMPACT_AT, compact_to), chain, 0)
    output = messages if outcome.result is None else outcome.result.plan.apply_messages(messages)
    present = {json.dumps(_data(_text(message))) for message in output if message["role"] == "tool"}
    distinct = {_text(message): json.dumps(_data(_text(message))) for message in messages if message["role"] == "tool"}
    kept = [
        text
        for text, data in distinct.items()
        if data in present or (store is not None and store.get(content_reference(text)) == text)
    ]
    users = [index for index, message in enumerate(messages) if message["role"] == "user"]
    task = users[-1]
    survivors = {id(message) for message in output}
    current_results = [message for message in messages[task + 1 :] if message["role"] == "tool"]
    return Score(
        tokens_before=transcript_.total(),
        tokens_after=outcome.result.tokens_after if outcome.result is not None else transcript_.total(),
        distinct_results=len(distinct),
        distinct_results_kept=len(kept),
        result_tokens=sum(counter.text_tokens(text) for text in distinct),
        result_tokens_kept=sum(counter.text_tokens(text) for text in kept),
        instructions=len(users) - 1,
        instructions_kept=sum(1 for index in users[:-1] if id(messages[index]) in survivors),
        latest_task_whole=id(messages[task]) in survivors
        and all(json.dumps(_data(_text(message))) in present for message in current_results),
    )


def run(seeds: Sequence[int] = SEEDS, window: int = WINDOW, compact_to: float = COMPACT_TO) -> dict[str, Any]:
    """Every chain on every transcript: one row per chain, summed over the transcripts."""
    transcripts = [transcript(seed, window) for seed in seeds]
    rows = []
    for label, (names, superseded) in CHAINS.items():
        chain = chain_by_names(names, superseded_tools=superseded)
        scores = []
        for messages in transcripts:
            offloading, store = _offloading(chain) if label == OFFLOAD_ROW else (chain, None)
            scores.append(score(messages, offloading, window, store, compact_to))
        total = {
            field: sum(getattr(s, field) for s in scores) for field in asdict(scores[0]) if field != "latest_task_whole"
        }
        rows.append(
            {
                "chain": label,
                "strategies": list(names),
                "superseded_tools": list(superseded),
                **total,
                "latest_task_whole": sum(s.latest_task_whole for s in scores),
                "transcripts": len(scores),
            }
        )
    settings = {"window": window, "compact_at": COMPACT_AT, "compact_to": compact_to, "seeds": list(seeds)}
    return {"settings": settings, "rows": rows}


def _offloading(chain: CompactionChain) -> tuple[CompactionChain, MemoryOffloadStore]:
    """`chain` with offloading before its first lossy step, as the proxy runs it, and the store it offloads to."""
    store = MemoryOffloadStore()
    strategies = list(chain.strategies)
    at = next((i for i, strategy in enumerate(strategies) if strategy.name == "tool_result_pruning"), len(strategies))
    strategies.insert(at, ToolResultOffload(store))
    return CompactionChain(strategies), store


def render(results: dict[str, Any]) -> list[str]:
    """The markdown table."""
    settings = results["settings"]
    lines = [
        f"### What each chain keeps (`bench.retention`: {len(settings['seeds'])} agent transcripts, "
        f"{settings['window']}-token window, compacted to {settings['compact_to']:.0%} of it)",
        "",
        "| chain | tokens before | tokens after | distinct tool results kept | their tokens kept "
        "| user instructions kept | latest task whole |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in results["rows"]:
        lines.append(
            f"| {row['chain']} | {row['tokens_before']} | {row['tokens_after']} "
            f"| {row['distinct_results_kept'] / row['distinct_results']:.1%} "
            f"| {row['result_tokens_kept'] / row['result_tokens']:.1%} "
            f"| {row['instructions_kept'] / max(row['instructions'], 1):.1%} "
            f"| {row['latest_task_whole']}/{row['transcripts']} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print the table; write the JSON results when asked."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="one small transcript (seconds)")
    parser.add_argument("--output", type=Path, help="write the JSON results here")
    parser.add_argument("--compact-to", type=float, default=COMPACT_TO, help="the target, a fraction of the window")
    args = parser.parse_args(argv)
    results = run(*SMOKE, compact_to=args.compact_to) if args.smoke else run(compact_to=args.compact_to)
    return published(render(results), results, args.output)


if __name__ == "__main__":
    sys.exit(main())
