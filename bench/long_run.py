"""A long tool-using agent run through the proxy, with rewrite memory on and off: how stable is what the provider sees?

The agent keeps its full history client-side (as SDK users do) and reads files until a tool result says FINAL, task
after task, through a proxy process in front of the OpenAI-like fake upstream (`tests.support.openai_upstream`,
in this process, so every forwarded body is recorded). For each forwarded prompt we take the share of its
`messages` bytes that are byte-identical to the previous prompt's (the common prefix), and add up the prompt
tokens the upstream counted, and how many of them its simulated prompt cache served, for the summary calls (with
`summarization` among the strategies) on their own as well.

`python -m bench.long_run --strategies summarization,sliding_window,middle_out` runs it with another chain (and
`--window`, `--result-lines`, `--tasks`, `--steps`) and prints its figures as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
from pathlib import Path
from typing import Any

import aiohttp

from bench.processes import Server
from tests.support.agent_run import TOOLS, agent_responder, is_summary_call, messages_array, run_agent
from tests.support.openai_upstream import OpenAIUpstream

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


async def http_agent(base_url: str, tasks: int, steps: int, result_lines: int = 6) -> list[str]:
    """The agent run with plain aiohttp through `base_url`; returns each answer's X-Compaction."""
    headers = {"Authorization": "Bearer sk-bench"}
    async with aiohttp.ClientSession() as http:

        async def turn(messages: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
            body = {"model": MODEL, "messages": messages, "tools": TOOLS}
            async with http.post(f"{base_url}/v1/chat/completions", json=body, headers=headers) as response:
                answer = await response.json()
                if response.status != 200:
                    raise RuntimeError(f"a turn failed: {response.status} {answer}")
                decision = response.headers.get("X-Compaction", "")
            message = {key: value for key, value in answer["choices"][0]["message"].items() if value not in (None, [])}
            return message, decision

        return await run_agent(turn, tasks, steps, result_lines=result_lines)


async def one_run(
    rewrite_memory: bool,
    tasks: int,
    steps: int,
    log_dir: Path,
    *,
    strategies: str | None = None,
    window: int = WINDOW,
    result_lines: int = 6,
) -> dict[str, Any]:
    """The run through a proxy process with rewrite memory on or off; figures from what the upstream recorded.

    :param strategies: The proxy's `--strategies`, when not its default chain.
    :param result_lines: How long each tool result is (see `tests.support.agent_run.run_agent`).
    """
    env = {"COMPACTION_PROXY_REWRITE_MEMORY": "true" if rewrite_memory else "false"}
    async with OpenAIUpstream(agent_responder(), context_window=window) as upstream:
        args = ["-m", "proxy.cli", "serve", "--host", "127.0.0.1", "--port", "0", "--upstream", upstream.base_url]
        args += ["--context-window", f"{MODEL}={window}", *(["--strategies", strategies] if strategies else [])]
        name = f"proxy-rewrite-memory-{'on' if rewrite_memory else 'off'}"
        with Server(name, args, log_dir, env=env, url_on_stderr=True) as proxy:
            decisions = await http_agent(proxy.url, tasks, steps, result_lines)
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
    return {
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


def share_is_full(before: bytes, after: bytes) -> bool:
    """Whether `after` extends `before` byte for byte (everything but the closing bracket)."""
    return after.startswith(before[:-1])


def run(tasks: int, steps: int, log_dir: Path) -> list[dict[str, Any]]:
    """Both runs: rewrite memory on, then off."""
    return [asyncio.run(one_run(memory, tasks, steps, log_dir)) for memory in (True, False)]


def main() -> None:
    """One run with rewrite memory on, shaped by the command line; its figures printed as JSON."""
    parser = argparse.ArgumentParser(prog="python -m bench.long_run", description=__doc__)
    parser.add_argument("--strategies", help="the proxy's --strategies (default: its own chain)")
    parser.add_argument("--window", type=int, default=WINDOW, help="the model's context window, in tokens")
    parser.add_argument("--result-lines", type=int, default=6, help="length of each tool result, in lines of code")
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--log-dir", type=Path, default=Path("."), help="where the proxy's log goes")
    options = parser.parse_args()
    row = asyncio.run(
        one_run(
            True,
            options.tasks,
            options.steps,
            options.log_dir,
            strategies=options.strategies,
            window=options.window,
            result_lines=options.result_lines,
        )
    )
    print(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
