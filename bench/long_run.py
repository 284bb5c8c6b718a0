"""A long tool-using agent run through the proxy, with rewrite memory on and off: how stable is what the provider sees?

The agent keeps its full history client-side (as SDK users do) and reads files until a tool result says FINAL, task
after task, through a proxy process in front of the OpenAI-like fake upstream (`proxy.simulator.openai_upstream`,
in this process, so every forwarded body is recorded). For each forwarded prompt we take the share of its
`messages` bytes that are byte-identical to the previous prompt's (the common prefix), and add up the prompt
tokens the upstream counted, and how many of them its simulated prompt cache served, for the summary calls (with
`summarization` among the strategies) on their own as well.

The same agent is also run straight at a fresh upstream until the upstream refuses a turn as too long, and what the
provider would bill (`bench.billing`) is set against the proxy's run over as many turns.

`python -m bench.long_run --strategies summarization,sliding_window,middle_out` runs it with another chain (and
`--window`, `--result-lines`, `--tasks`, `--steps`, and proxy settings such as `--settings "compact_to=0.3
compact_at=0.8"`; `--strategies` and `--settings` may be given more than once, one run for each pair) and prints
its figures as JSON, or with `--markdown` as the tables docs/benchmarks.md quotes.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench import billing
from bench.processes import Server
from proxy.engine.strategies.summarization import SUMMARY_OPENING
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.support.agent_run import FILE_TEXT, TOOLS, agent_responder, is_summary_call, messages_array, run_agent

MODEL = "gpt-4o-mini"
WINDOW = 4096


def common_prefix(a: bytes, b: bytes) -> int:
    """Length of the longest common prefix of two byte strings."""
    low, high = 0, min(len(a), len(b))
    while low < high:  # binary search on slice equality: fast in C for long prompts
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


class TurnRefused(RuntimeError):
    """The upstream (or the proxy) answered a turn with an error."""

    def __init__(self, status: int, answer: Any) -> None:
        super().__init__(f"a turn failed: {status} {answer}")
        self.overflowed = status == 400 and (answer.get("error") or {}).get("code") == "context_length_exceeded"


@dataclass(frozen=True)
class DirectRun:
    """The agent going straight to the upstream, until the upstream refused a turn as too long (or to its end).

    :param usages: The usage of every turn answered.
    :param overflowed: Whether the run ended on a refused turn rather than at its last task.
    :param client: The agent's requests as the upstream counts them, the refused one included.
    """

    usages: list[dict[str, Any]]
    overflowed: bool
    client: billing.ClientCounts


async def http_agent(
    base_url: str, tasks: int, steps: int, result_lines: int = 6, client: billing.ClientCounts | None = None
) -> list[str]:
    """The agent run with plain aiohttp through `base_url`; returns each answer's X-Compaction.

    :param client: Where each request the agent sends is counted, as the upstream would count it.
    :raises TurnRefused: When a turn is not answered with 200.
    """
    headers = {"Authorization": "Bearer sk-bench"}
    async with aiohttp.ClientSession() as http:

        async def turn(messages: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
            body = {"model": MODEL, "messages": messages, "tools": TOOLS}
            if client is not None:
                client.add(body)
            async with http.post(f"{base_url}/v1/chat/completions", json=body, headers=headers) as response:
                answer = await response.json()
                if response.status != 200:
                    raise TurnRefused(response.status, answer)
                decision = response.headers.get("X-Compaction", "")
            message = {key: value for key, value in answer["choices"][0]["message"].items() if value not in (None, [])}
            return message, decision

        return await run_agent(turn, tasks, steps, result_lines=result_lines)


async def direct_run(tasks: int, steps: int, *, window: int = WINDOW, result_lines: int = 6) -> DirectRun:
    """The agent straight at a fresh upstream of `window` tokens, until it refuses a turn as too long."""
    client = billing.ClientCounts()
    async with OpenAIUpstream(agent_responder(), context_window=window) as upstream:
        try:
            await http_agent(upstream.base_url, tasks, steps, result_lines, client)
        except TurnRefused as refused:
            if not refused.overflowed:
                raise
            return DirectRun(list(upstream.usages), overflowed=True, client=client)
        return DirectRun(list(upstream.usages), overflowed=False, client=client)


async def one_run(
    rewrite_memory: bool,
    tasks: int,
    steps: int,
    log_dir: Path,
    *,
    strategies: str | None = None,
    window: int = WINDOW,
    result_lines: int = 6,
    settings: Mapping[str, str] | None = None,
    direct: DirectRun | None = None,
    ledger: bool = False,
) -> dict[str, Any]:
    """The run through a proxy process with rewrite memory on or off; figures from what the upstream recorded.

    :param strategies: The proxy's `--strategies`, when not its default chain.
    :param result_lines: How long each tool result is (see `tests.support.agent_run.run_agent`).
    :param settings: Proxy settings by name (`compact_to`: `0.3`), set through its environment.
    :param direct: The same agent's run straight at the upstream: the row then carries `billing`, the bill of each,
        and the proxy's estimate of going direct.
    :param ledger: Run the proxy with its dashboard on: the row then carries `conversations`, the proxy's own JSON of
        each conversation it kept (`/dashboard/conversations/{id}.json`, its bill included).
    """
    env = {"COMPACTION_PROXY_REWRITE_MEMORY": "true" if rewrite_memory else "false"}
    env |= {"COMPACTION_PROXY_DASHBOARD": "true"} if ledger else {}
    env.update((f"COMPACTION_PROXY_{name.upper()}", value) for name, value in (settings or {}).items())
    async with OpenAIUpstream(agent_responder(), context_window=window) as upstream:
        args = ["-m", "proxy.cli", "serve", "--host", "127.0.0.1", "--port", "0", "--upstream", upstream.base_url]
        args += ["--context-window", f"{MODEL}={window}", *(["--strategies", strategies] if strategies else [])]
        name = f"proxy-rewrite-memory-{'on' if rewrite_memory else 'off'}"
        client = billing.ClientCounts()
        with Server(name, args, log_dir, env=env, url_on_stderr=True) as proxy:
            decisions = await http_agent(proxy.url, tasks, steps, result_lines, client)
            kept = await conversations(proxy.url) if ledger else None
        requests = [request for request in upstream.requests if request.path.endswith("/chat/completions")]
        usages = list(upstream.usages)
    if len(usages) != len(requests):
        raise RuntimeError(f"{len(requests)} chat requests reached the upstream, {len(usages)} were answered")
    summaries = [is_summary_call(request.json) for request in requests]
    chat = [request for request, summary in zip(requests, summaries, strict=True) if not summary]
    arrays = [messages_array(request.body) for request in chat]
    shares = [common_prefix(before[:-1], after) / len(after) for before, after in itertools.pairwise(arrays)]
    prompt = sum(usage["prompt_tokens"] for usage in usages)
    cached = sum(usage["prompt_tokens_details"]["cached_tokens"] for usage in usages)
    summary_usages = [usage for usage, summary in zip(usages, summaries, strict=True) if summary]
    summary_prompt = sum(usage["prompt_tokens"] for usage in summary_usages)
    summary_cached = sum(usage["prompt_tokens_details"]["cached_tokens"] for usage in summary_usages)
    row = {
        "label": label(strategies, window, result_lines, settings) + ", rewrite memory off" * (not rewrite_memory),
        "rewrite_memory": rewrite_memory,
        "turns": len(chat),
        "compacted_turns": sum(decision.startswith("compacted") for decision in decisions),
        "mean_identical_prefix_share": statistics.fmean(shares) if shares else 0.0,
        "median_identical_prefix_share": statistics.median(shares) if shares else 0.0,
        "turns_fully_extending_previous": sum(share_is_full(b, a) for b, a in itertools.pairwise(arrays)),
        "prompt_tokens_forwarded": prompt,
        "cached_prompt_tokens": cached,
        "cached_share": cached / prompt if prompt else 0.0,
        "max_prompt_tokens": max((usage["prompt_tokens"] for usage in usages), default=0),
        "summary_calls": len(summary_usages),
        "summary_cached_share": summary_cached / summary_prompt if summary_prompt else None,
    }
    row.update(kept_after_compactions([request.json["messages"] for request in chat], decisions, result_lines))
    if kept is not None:
        row["conversations"] = kept
    if direct is not None:
        row["billing"] = compared(direct, billing.records(usages, summaries, client, model=MODEL, window=window))
    return row


async def conversations(base_url: str) -> list[dict[str, Any]]:
    """Every conversation the proxy's ledger keeps, as its dashboard's JSON gives it (records and bill)."""
    headers = {"Authorization": "Bearer sk-bench"}
    async with aiohttp.ClientSession(base_url, headers=headers, raise_for_status=True) as http:
        async with http.get("/dashboard/conversations.json") as response:
            listed = (await response.json())["conversations"]
        kept = []
        for conversation in listed:
            async with http.get(f"/dashboard/conversations/{conversation['id']}.json") as response:
                kept.append(await response.json())
    return kept


def kept_after_compactions(
    prompts: Sequence[list[dict[str, Any]]], decisions: Sequence[str], result_lines: int
) -> dict[str, float]:
    """The tool results the prompts a compaction produced hold as they came: in all, and after the newest summary.

    Keeping a compacted head for the provider's cache keeps older messages at its front and fewer of the newest
    after it; these two means show that trade. A result pruned, offloaded or cut down is not counted.
    """
    whole = FILE_TEXT * result_lines
    pairs = zip(prompts, decisions, strict=False)
    compacted = [prompt for prompt, decision in pairs if decision.startswith("compacted")]
    intact = [[_intact(message, whole) for message in prompt] for prompt in compacted]
    newest = [sum(flags[_after_newest_summary(prompt) :]) for prompt, flags in zip(compacted, intact, strict=True)]
    return {
        "tool_results_after_compaction": statistics.fmean(map(sum, intact)) if intact else 0.0,
        "newest_tool_results_after_compaction": statistics.fmean(newest) if newest else 0.0,
    }


def _intact(message: dict[str, Any], whole: str) -> bool:
    """Whether a message is one of the agent's tool results as it sent it."""
    return message["role"] == "tool" and str(message.get("content", "")).endswith(whole)


def _after_newest_summary(prompt: list[dict[str, Any]]) -> int:
    """Where the messages after the prompt's newest summary start (0 when it holds none)."""
    summaries = [
        index
        for index, message in enumerate(prompt)
        if message["role"] == "user" and str(message.get("content", "")).startswith(SUMMARY_OPENING)
    ]
    return summaries[-1] + 1 if summaries else 0


def compared(direct: DirectRun, run: Sequence[billing.Record]) -> dict[str, Any]:
    """The bill of the direct run; of the proxy's run, whole and over the turns going direct could make (its summary
    calls included); and the proxy's estimate of going direct, from the proxy's run alone."""
    window = run[0].window if run else 0
    own = [False] * len(direct.usages)
    went = billing.bills(billing.records(direct.usages, own, direct.client, model=MODEL, window=window))
    through = billing.bills(run)
    return {
        "direct_turns": len(direct.usages),
        "direct_overflowed": direct.overflowed,
        "direct": billing.priced({model: bill.proxy for model, bill in went.items()}),
        "direct_estimate": billing.priced({model: bill.direct for model, bill in through.items()}),
        "estimate_stopped": any(bill.stopped for bill in through.values()),
        "proxy_same_turns": billing.priced({model: bill.covered for model, bill in through.items()}),
        "proxy": billing.priced({model: bill.proxy for model, bill in through.items()}),
    }


def label(strategies: str | None, window: int, result_lines: int, settings: Mapping[str, str] | None) -> str:
    """How a run is named in the report: its chain, window, tool-result length and the settings it was given."""
    given = "".join(f", {name} {value}" for name, value in (settings or {}).items())
    return f"{strategies or 'default chain'}, {window} tokens, {result_lines}-line results{given}"


def proxy_settings(text: str) -> dict[str, str]:
    """`--settings` parsed: space-separated `name=value` pairs."""
    pairs = [pair.partition("=") for pair in text.split()]
    if any(not name or not sign or not value for name, sign, value in pairs):
        raise argparse.ArgumentTypeError(f"settings are space-separated name=value pairs, not {text!r}")
    return {name: value for name, _sign, value in pairs}


def share_is_full(before: bytes, after: bytes) -> bool:
    """Whether `after` extends `before` byte for byte (everything but the closing bracket)."""
    return after.startswith(before[:-1])


def run(tasks: int, steps: int, log_dir: Path) -> list[dict[str, Any]]:
    """Both runs, rewrite memory on then off, each billed against the agent going direct."""
    direct = asyncio.run(direct_run(tasks, steps))
    return [asyncio.run(one_run(memory, tasks, steps, log_dir, direct=direct)) for memory in (True, False)]


def main() -> None:
    """Runs with rewrite memory on, one per chain and settings asked, billed against going direct."""
    parser = argparse.ArgumentParser(prog="python -m bench.long_run", description=__doc__)
    parser.add_argument(
        "--strategies", action="append", help="the proxy's --strategies (`default`, or none given: its own chain)"
    )
    parser.add_argument(
        "--settings", type=proxy_settings, action="append", help='proxy settings of one run, e.g. "compact_to=0.3"'
    )
    parser.add_argument("--window", type=int, default=WINDOW, help="the model's context window, in tokens")
    parser.add_argument("--result-lines", type=int, default=6, help="length of each tool result, in lines of code")
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--log-dir", type=Path, default=Path("."), help="where the proxy's log goes")
    parser.add_argument("--markdown", action="store_true", help="print the tables of docs/benchmarks.md, not JSON")
    options = parser.parse_args()
    shape = {"window": options.window, "result_lines": options.result_lines}
    direct = asyncio.run(direct_run(options.tasks, options.steps, **shape))
    rows = [
        asyncio.run(
            one_run(
                True,
                options.tasks,
                options.steps,
                options.log_dir,
                strategies=strategies,
                settings=settings,
                direct=direct,
                **shape,
            )
        )
        for strategies in [None if chain == "default" else chain for chain in options.strategies or ["default"]]
        for settings in options.settings or [None]
    ]
    print("\n".join(markdown(rows)) if options.markdown else json.dumps(rows, indent=1))


def markdown(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The runs' cache figures, then their bills against going direct."""
    lines = [
        "| run | turns | compactions | summary calls | summary calls' prompt cached | all prompt tokens cached "
        "| tool results kept whole after a compaction: all / after the newest summary |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        summary = row["summary_cached_share"]
        kept = f"{row['tool_results_after_compaction']:.1f} / {row['newest_tool_results_after_compaction']:.1f}"
        lines.append(
            f"| {row['label']} | {row['turns']} | {row['compacted_turns']} | {row['summary_calls']} "
            f"| {'-' if summary is None else f'{summary * 100:.1f} %'} | {row['cached_share'] * 100:.1f} % "
            f"| {kept} |"
        )
    return [*lines, "", *billing.table(rows)]


if __name__ == "__main__":
    main()
