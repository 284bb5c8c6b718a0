"""Claude Code itself, in print mode, through the real proxy, against the strict fake Anthropic upstream.

Claude Code (npm `@anthropic-ai/claude-code`, a native binary inside the package, installed by `.ci/run` under
`~/.cache/compaction-proxy`) runs `claude -p` with `ANTHROPIC_BASE_URL` at the proxy and a dummy key. Its own system
prompt and tools take about 20k tokens of a `WINDOW`-token window; the model reads `PARTS` files of `PART_LINES`
lines each with the Read tool, one call per request, then answers. Going direct, the session passes the window about
two thirds of the way: the API refuses the request ("prompt is too long"), and Claude Code compacts on its own (a
summary request, then a summary in place of the history). Through the proxy it completes without either: no request
refused, no summary round trip, the compacted conversation replayed as the proxy compacted it.

On a model that binds thinking to its prefix (`BINDING`), Claude Code also edits its newest system message every turn
(a hint it adds and takes back), which the API's prefix check refuses ("bound to a different conversation") going
direct; Claude Code then sends the request again without thinking. Through the proxy that happens only until the
proxy first rewrites the conversation: from then on the proxy drops what the edit invalidated.

Claude Code is told to send nothing but its API requests (`CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC` and the rest),
and any other outbound connection goes to a dead proxy on loopback, so the test uses no network. Without the binary
the test skips (the run's summary names the install command), and fails under CI, which installs it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from proxy.simulator.anthropic_rules import prompt_segments
from proxy.simulator.anthropic_upstream import AnthropicUpstream, thinks
from tests.support.agent_cli import installed_cli, run_cli
from tests.support.proxies import LoopbackProxies

CLAUDE_CODE_VERSION = "2.1.332"
MODEL = "claude-sonnet-4-5"
BINDING = "claude-fable-5-1"
"""A model that binds thinking to its prefix: there Claude Code sends a system message after each tool result."""
BOUND_ELSEWHERE = "The block is bound to a different conversation"
WINDOW = 120_000
"""Small, yet more than `compact_at` of it plus the 32k Claude Code reserves for its reply (`max_tokens`)."""
PARTS = 30
PART_LINES = 66
"""About 4,500 tokens a part read."""
FINAL = "done: read every part through the proxy"
TOO_LONG = "Prompt is too long"
DEAD_PROXY = "http://127.0.0.1:9"
"""Where Claude Code's attempts to reach the internet go: nothing listens there."""
MARKER = re.compile(r"PART (\d+) OF")
SUMMARY_REQUEST = "create a detailed summary of the conversation"
"""From the prompt Claude Code appends to the history when it compacts on its own."""


def claude_binary() -> Path:
    """The installed `claude` (`CLAUDE_CODE_BIN` overrides the cache); skips (fails under CI) when there is none."""
    return installed_cli("Claude Code", f"claude-code-{CLAUDE_CODE_VERSION}", "claude", "CLAUDE_CODE_BIN")


def write_parts(folder: Path) -> list[Path]:
    """`PARTS` files of about `PART_TOKENS` tokens, each naming its number on its first line."""
    paths = []
    for number in range(1, PARTS + 1):
        lines = [f"PART {number} OF {PARTS}"]
        lines += [f"{secrets.token_hex(4)} " * 12 for _ in range(PART_LINES)]
        path = folder / f"part-{number:02d}.txt"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def reader(parts: list[Path]) -> Any:
    """The model: a Read call for the part after the one whose result ends the request, then, after the last, `FINAL`.

    It goes by the newest user message only (what it read last), which every compaction keeps; on the newest models
    Claude Code appends a system message after it each turn. Asked by Claude Code for a summary of the conversation
    (its own compaction), it answers with one, in text, as told.
    """

    def respond(body: Mapping[str, Any]) -> list[dict[str, Any]]:
        last = newest_user_message(body)
        done = max((int(found) for found in MARKER.findall(last)), default=0)
        blocks: list[dict[str, Any]] = [{"type": "thinking", "thinking": f"Read part {done + 1} next."}]
        blocks = blocks if thinks(body) else []
        if SUMMARY_REQUEST in last:
            summary = (
                f"<analysis>Reading parts in order.</analysis>\n<summary>Read up to PART {done} OF {PARTS}.</summary>"
            )
            return [*blocks, {"type": "text", "text": summary}]
        if done >= len(parts):
            return [*blocks, {"type": "text", "text": FINAL}]
        call = {"file_path": str(parts[done])}
        return [*blocks, {"type": "tool_use", "id": f"toolu_{secrets.token_hex(8)}", "name": "Read", "input": call}]

    return respond


async def run_claude(binary: Path, model: str, base_url: str, workdir: Path, home: Path) -> tuple[int, str]:
    """`claude -p --model model` in `workdir` against `base_url`: its exit code and what it printed (stdout, then
    stderr)."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "sk-ant-dummy-for-loopback",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "HTTPS_PROXY": DEAD_PROXY,
        "HTTP_PROXY": DEAD_PROXY,
        "NO_PROXY": "127.0.0.1,localhost",
    }
    prompt = f"Read the {PARTS} part files in this folder, one after the other."
    command = [str(binary), "-p", prompt, "--model", model, "--allowedTools", "Read"]
    code, out, err = await run_cli(command, workdir, env)
    return code, out + err


def newest_user_message(body: Mapping[str, Any]) -> str:
    """The newest user message of a request, as JSON (what follows it is Claude Code's system messages, if anything)."""
    return json.dumps(next(m for m in reversed(body["messages"]) if m.get("role") == "user"))


def summarizing(bodies: list[dict[str, Any]]) -> int:
    """How many of `bodies` are Claude Code asking for a summary of its conversation (its own compaction)."""
    return sum(1 for body in bodies if SUMMARY_REQUEST in newest_user_message(body))


@pytest.mark.parametrize("model", [MODEL, BINDING])
async def test_claude_code_overflows_going_direct_and_completes_through_the_proxy_without_compacting_itself(
    tmp_path: Path, model: str
) -> None:
    binary = claude_binary()
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()
    parts = write_parts(tmp_path / "work")
    async with AnthropicUpstream(context_window=WINDOW, responder=reader(parts)) as upstream:
        await run_claude(binary, model, upstream.base_url, tmp_path / "work", tmp_path / "home")
        overflows = [error for error in upstream.rejections if "prompt is too long" in error["error"]["message"]]
        assert overflows, "going direct, the session did not overflow: the test proves nothing"
        assert summarizing(upstream.requests) >= 1, "going direct, Claude Code had to compact on its own"
        direct, refused = len(upstream.requests), len(upstream.rejections)
        unbound = [error for error in upstream.rejections if BOUND_ELSEWHERE in error["error"]["message"]]
        assert len(unbound) + len(overflows) == refused, upstream.rejections
        assert bool(unbound) is (model == BINDING), "Claude Code edits its newest system message on binding models"

        proxies = LoopbackProxies(upstream=upstream.base_url, context_windows={"claude": WINDOW})
        proxy = await proxies.start()
        try:
            code, printed = await run_claude(
                binary, model, proxy.url.removesuffix("/v1"), tmp_path / "work", tmp_path / "home"
            )
        finally:
            await proxies.close()

    through = upstream.requests[direct:]
    refused_through = [position - direct for position in upstream.refused[refused:]]
    prompts = [sum(segment.tokens for segment in prompt_segments(body, body["messages"])) for body in through]
    compacted = proxy.metric("compaction_proxy_decisions_total", route="messages", decision="compacted")
    cached = proxy.metric("compaction_proxy_cached_prompt_tokens_total") / proxy.metric(
        "compaction_proxy_prompt_tokens_total"
    )
    print(
        f"\n{model} direct: {direct} requests, {len(overflows)} refused as too long, {len(unbound)} as bound to a"
        f" different conversation, {summarizing(upstream.requests[:direct])} summary by Claude Code; through the"
        f" proxy: {len(through)} requests, {len(refused_through)} refused, {compacted:.0f} compacted, prompts of"
        f" {min(prompts)} to {max(prompts)} tokens in a {WINDOW}-token window, {cached:.0%} read from the cache"
    )
    assert code == 0, printed[-2000:]
    assert FINAL in printed, printed[-2000:]
    assert TOO_LONG not in printed
    assert summarizing(through) == 0, "Claude Code never needed to compact on its own"
    assert compacted >= 1
    assert len(through) == PARTS + 1 + len(refused_through), "one request per part read, then the answer"
    if model == MODEL:
        assert refused_through == [], "the proxy sent nothing the API refuses"
        return
    # Until the proxy first rewrites the conversation it forwards Claude Code's own requests as they came, and the API
    # refuses those as it does going direct; from then on it drops what Claude Code's edit invalidated, and lets the
    # turn's own thinking through for the API to drop (the opt-in Claude Code never sends itself).
    assert all(BOUND_ELSEWHERE in error["error"]["message"] for error in upstream.rejections[refused:])
    rewritten = next(index for index, body in enumerate(through) if "block_binding" in json.dumps(body["thinking"]))
    assert all(index < rewritten for index in refused_through), "the proxy sent nothing the API refuses"
    assert len(refused_through) < len(unbound)
