"""CPU time per `before_llm` call: our `hooks.compaction.CompactionHook` against Haystack's own.

Each hook runs over its own 200-step agent conversation, built step by step the way an Agent builds it (an assistant
tool call, then a tool result of a few hundred tokens), with the hook called before every model call on a Haystack
`State`. Compactions rewrite the state, and the conversation keeps growing from the compacted one. Scenarios cross
the compactor (sliding window, tool-result pruning), the counter (each side's approximate counter at 4 characters a
token; each side's tiktoken counter when the encodings are available offline) and usage (`context_tokens` set as an
Agent with usage sets it, or left at 0).

    python -m bench.hook_vs_haystack [--steps 200] [--window 32768] [--repeat 3] [--smoke]

Prints a markdown table and writes `bench/results/hook_vs_haystack.json`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

TIKTOKEN_DIR = Path("/work/shared/tiktoken")
if TIKTOKEN_DIR.is_dir():
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(TIKTOKEN_DIR))

from haystack import token_counters as haystack_counters  # noqa: E402
from haystack.components.agents.state.state import State  # noqa: E402
from haystack.dataclasses import ChatMessage, ToolCall  # noqa: E402
from haystack.hooks import compaction as haystack_compaction  # noqa: E402
from haystack.tools import Tool  # noqa: E402

from hooks import compaction as our_compaction  # noqa: E402
from hooks.compaction.convert import to_openai  # noqa: E402
from proxy.engine import TiktokenCounter  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "hook_vs_haystack.json"
SYSTEM_PROMPT = "You are a careful research agent. Use the search tool step by step."
SENTENCE = "Finding {n} for step {step}: the handler retries transient failures with exponential backoff. "


def _search(query: str) -> str:
    """The tool the conversation's calls name (never called here)."""
    return query


SEARCH = Tool(
    name="search",
    description="Search the corpus.",
    parameters={"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    function=_search,
)


def tool_result(step: int) -> str:
    """A deterministic tool result of a few hundred tokens, varying in length with the step."""
    return f"results for step {step}:\n" + "".join(SENTENCE.format(n=n, step=step) for n in range(12 + step % 9))


@dataclass(frozen=True)
class Scenario:
    """One row: which compactor and counter each side uses, and whether the model reports usage."""

    compactor: str
    counter: str
    usage: bool

    @property
    def name(self) -> str:
        """A readable label for the table."""
        return f"{self.compactor} / {self.counter} / {'usage' if self.usage else 'no usage'}"


@dataclass
class Measured:
    """One side's timing over a scenario."""

    ms_per_call: float
    calls: int
    compactions: int
    final_messages: int


def make_hook(side: str, scenario: Scenario, window: int) -> Any:
    """A fresh hook for `side` ("ours" or "haystack") configured as the scenario says."""
    module = our_compaction if side == "ours" else haystack_compaction
    compactor = (
        module.SlidingWindowCompactor() if scenario.compactor == "sliding" else module.ToolResultPruningCompactor()
    )
    counter: Any
    if side == "ours":
        if scenario.counter == "approximate":
            counter = our_compaction.ApproximateTokenCounter(chars_per_token=4.0)
        else:
            counter = our_compaction.TiktokenTokenCounter()
    elif scenario.counter == "approximate":
        counter = haystack_counters.ApproximateTokenCounter(chars_per_token=4.0)
    else:
        counter = haystack_counters.TiktokenCounter()
        counter.warm_up()
    return module.CompactionHook(compactor=compactor, context_window=window, token_counter=counter)


class Provider:
    """Stands in for the model's own token count of each request (tiktoken, chat framing and tool schemas)."""

    def __init__(self) -> None:
        self._counter = TiktokenCounter()
        self._overhead = self._counter.overhead_tokens({"tools": [{"type": "function", "function": SEARCH.tool_spec}]})
        self._counts: dict[int, tuple[ChatMessage, int]] = {}

    def count(self, messages: list[ChatMessage]) -> int:
        """The prompt tokens of a request carrying `messages`, as the provider would report them."""
        total = self._overhead
        for message in messages:
            known = self._counts.get(id(message))
            if known is None or known[0] is not message:
                known = (message, self._counter.message_tokens(to_openai(message)))
                self._counts[id(message)] = known
            total += known[1]
        return total


def run_side(side: str, scenario: Scenario, steps: int, window: int) -> Measured:
    """Grow a conversation over `steps` agent steps, timing the hook's call before each model call."""
    hook = make_hook(side, scenario, window)
    provider = Provider()
    schema = {"context_tokens": {"type": int}, "tools": {"type": list[Tool]}}
    messages = [ChatMessage.from_system(SYSTEM_PROMPT), ChatMessage.from_user("Research the retry policy.")]
    state = State(schema=schema, data={"messages": messages, "context_tokens": 0, "tools": [SEARCH]})
    elapsed = 0.0
    compactions = 0
    clock: Callable[[], float] = time.process_time
    for step in range(1, steps + 1):
        before = state.data["messages"]
        started = clock()
        hook.run(state)
        elapsed += clock() - started
        sent = state.data["messages"]
        compactions += sent is not before
        call = ToolCall(id=f"call_{step}", tool_name="search", arguments={"query": f"retry policy, part {step}"})
        reply = ChatMessage.from_assistant(tool_calls=[call])
        if scenario.usage:
            # The provider counted the request it was sent and its reply: the conversation through this reply.
            state.set("context_tokens", provider.count([*sent, reply]))
        state.set("messages", [reply])
        state.set("messages", [ChatMessage.from_tool(tool_result(step), origin=call)])
    hook.close()
    return Measured(
        ms_per_call=elapsed * 1000 / steps,
        calls=steps,
        compactions=compactions,
        final_messages=len(state.data["messages"]),
    )


def best_of(side: str, scenario: Scenario, steps: int, window: int, repeat: int) -> Measured:
    """The fastest of `repeat` runs (all runs make the same decisions)."""
    return min((run_side(side, scenario, steps, window) for _ in range(repeat)), key=lambda m: m.ms_per_call)


def tiktoken_available() -> bool:
    """Whether Haystack's `TiktokenCounter` can load its encoding without network access."""
    return "TIKTOKEN_CACHE_DIR" in os.environ and TIKTOKEN_DIR.is_dir()


def scenarios() -> list[Scenario]:
    """Every row to measure; the tiktoken rows only when the encodings are available offline."""
    counters = ["approximate"] + (["tiktoken"] if tiktoken_available() else [])
    return [
        Scenario(compactor, counter, usage)
        for counter in counters
        for compactor in ("sliding", "pruning")
        for usage in (True, False)
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table and write the JSON results."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--window", type=int, default=32_768)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="a tiny run (20 steps, 4k window) to check it works")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*experimental component.*")
    logging.getLogger("haystack").setLevel(logging.ERROR)
    if args.smoke:
        args.steps, args.window, args.repeat = 20, 4096, 1

    rows: list[dict[str, Any]] = []
    print(
        f"{args.steps} agent steps, {args.window}-token window, compact_at 0.7, compact_to 0.4, best of {args.repeat}"
    )
    if not tiktoken_available():
        print(f"(tiktoken rows skipped: {TIKTOKEN_DIR} not found)")
    print()
    print("| scenario | ours ms/call | Haystack ms/call | ratio (ours/Haystack) | compactions (ours/Haystack) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for scenario in scenarios():
        ours = best_of("ours", scenario, args.steps, args.window, args.repeat)
        theirs = best_of("haystack", scenario, args.steps, args.window, args.repeat)
        ratio = ours.ms_per_call / theirs.ms_per_call if theirs.ms_per_call else float("inf")
        print(
            f"| {scenario.name} | {ours.ms_per_call:.3f} | {theirs.ms_per_call:.3f} | {ratio:.2f} | "
            f"{ours.compactions}/{theirs.compactions} |",
            flush=True,
        )
        rows.append({**asdict(scenario), "ours": asdict(ours), "haystack": asdict(theirs), "ratio": ratio})

    args.output.parent.mkdir(parents=True, exist_ok=True)
    settings = {"steps": args.steps, "window": args.window, "repeat": args.repeat, "compact_at": 0.7, "compact_to": 0.4}
    args.output.write_text(json.dumps({"settings": settings, "rows": rows}, indent=2) + "\n")
    print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
