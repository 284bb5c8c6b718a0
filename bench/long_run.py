"""A long tool-using agent run through the proxy, with rewrite memory on and off: how stable is what the provider sees?

The agent keeps its full history client-side (as SDK users do) and reads files until a tool result says FINAL, task
after task, through a proxy process in front of the OpenAI-like fake upstream (`tests.support.openai_upstream`,
in this process, so every forwarded body is recorded). For each forwarded prompt we take the share of its
`messages` bytes that are byte-identical to the previous prompt's (the common prefix), and add up the prompt
tokens the upstream counted, and how many of them its simulated prompt cache served.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
from pathlib import Path
from typing import Any

import aiohttp

from bench.processes import Server
from tests.support.agent_run import TOOLS, agent_responder, messages_array, run_agent
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


async def http_agent(base_url: str, tasks: int, steps: int) -> list[str]:
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

        return await run_agent(turn, tasks, steps)


async def one_run(rewrite_memory: bool, tasks: int, steps: int, log_dir: Path) -> dict[str, Any]:
    """The run through a proxy process with rewrite memory on or off; figures from what the upstream recorded."""
    env = {"COMPACTION_PROXY_REWRITE_MEMORY": "true" if rewrite_memory else "false"}
    async with OpenAIUpstream(agent_responder(), context_window=WINDOW) as upstream:
        args = ["-m", "proxy.cli", "serve", "--host", "127.0.0.1", "--port", "0", "--upstream", upstream.base_url]
        args += ["--context-window", f"{MODEL}={WINDOW}"]
        name = f"proxy-rewrite-memory-{'on' if rewrite_memory else 'off'}"
        with Server(name, args, log_dir, env=env, url_on_stderr=True) as proxy:
            decisions = await http_agent(proxy.url, tasks, steps)
        chat = [request for request in upstream.requests if request.path.endswith("/chat/completions")]
        usages = list(upstream.usages)
    arrays = [messages_array(request.body) for request in chat]
    shares = [common_prefix(before[:-1], after) / len(after) for before, after in itertools.pairwise(arrays)]
    prompt = sum(usage["prompt_tokens"] for usage in usages)
    cached = sum(usage["prompt_tokens_details"]["cached_tokens"] for usage in usages)
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
    }


def share_is_full(before: bytes, after: bytes) -> bool:
    """Whether `after` extends `before` byte for byte (everything but the closing bracket)."""
    return after.startswith(before[:-1])


def run(tasks: int, steps: int, log_dir: Path) -> list[dict[str, Any]]:
    """Both runs: rewrite memory on, then off."""
    return [asyncio.run(one_run(memory, tasks, steps, log_dir)) for memory in (True, False)]
