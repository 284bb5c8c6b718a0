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
import json
import statistics
from pathlib import Path
from typing import Any

import aiohttp

from bench.processes import Server
from tests.support.openai_upstream import OpenAIUpstream, Reply, ToolCall

MODEL = "gpt-4o-mini"
WINDOW = 4096
FILE_TEXT = "def handler(event, context):\n    return process(event['records'], retries=3)\n"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    }
]


def agent_responder() -> Any:
    """A model that reads files until a tool result says FINAL, sometimes two at once."""
    ids = itertools.count(1)

    def respond(request: dict[str, Any]) -> Reply:
        last = request["messages"][-1]
        if last["role"] == "tool" and str(last.get("content", "")).startswith("FINAL"):
            return Reply(content="All files read; the handler retries three times.")
        parallel = 2 if len(request["messages"]) % 3 == 0 else 1
        return Reply(
            tool_calls=tuple(
                ToolCall(id=f"call_{next(ids)}", name="read_file", arguments=json.dumps({"path": f"src/{n}.py"}))
                for n in range(parallel)
            )
        )

    return respond


def messages_array(raw: bytes) -> bytes:
    """The exact bytes of the `messages` array inside a request body."""
    text = raw.decode()
    start = text.index("[", text.index('"messages"'))
    _value, end = json.JSONDecoder().raw_decode(text, start)
    return raw[start:end] if text.isascii() else text[start:end].encode()


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


async def run_agent(base_url: str, tasks: int, steps: int) -> list[str]:
    """Run `tasks` tasks of `steps` tool rounds each through `base_url`; return each answer's X-Compaction."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a meticulous code reviewer."}]
    decisions: list[str] = []
    headers = {"Authorization": "Bearer sk-bench"}
    async with aiohttp.ClientSession() as http:
        for task in range(tasks):
            messages.append({"role": "user", "content": f"Task {task}: review the handlers in src/ and report."})
            for step in range(steps + 1):
                body = {"model": MODEL, "messages": messages, "tools": TOOLS}
                async with http.post(f"{base_url}/v1/chat/completions", json=body, headers=headers) as response:
                    answer = await response.json()
                    if response.status != 200:
                        raise RuntimeError(f"turn {len(decisions)} failed: {response.status} {answer}")
                    decisions.append(response.headers.get("X-Compaction", ""))
                message = {
                    key: value for key, value in answer["choices"][0]["message"].items() if value not in (None, [])
                }
                messages.append(message)
                for call in message.get("tool_calls") or []:
                    final = step == steps - 1
                    content = ("FINAL " if final else "") + f"{call['function']['arguments']}\n" + FILE_TEXT * 6
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
                if not message.get("tool_calls"):
                    break
    return decisions


async def one_run(rewrite_memory: bool, tasks: int, steps: int, log_dir: Path) -> dict[str, Any]:
    """The run through a proxy process with rewrite memory on or off; figures from what the upstream recorded."""
    env = {"COMPACTION_PROXY_REWRITE_MEMORY": "true" if rewrite_memory else "false"}
    async with OpenAIUpstream(agent_responder(), context_window=WINDOW) as upstream:
        args = ["-m", "proxy.cli", "serve", "--host", "127.0.0.1", "--port", "0", "--upstream", upstream.base_url]
        args += ["--context-window", f"{MODEL}={WINDOW}"]
        name = f"proxy-rewrite-memory-{'on' if rewrite_memory else 'off'}"
        with Server(name, args, log_dir, env=env, url_on_stderr=True) as proxy:
            decisions = await run_agent(proxy.url, tasks, steps)
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
