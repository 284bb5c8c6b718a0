"""Codex CLI itself, through the real proxy, over the Responses API's WebSocket mode.

Codex CLI (npm `@openai/codex`, installed by `.ci/run` under `~/.cache/compaction-proxy`) runs `codex exec` with its
built-in OpenAI provider, its base URL set to the proxy (`-c openai_base_url=...`) and a dummy key, against the fake
upstream's WebSocket mode on loopback. Codex opens one socket to `/v1/responses`, prewarms it (`generate: false`),
then chains every request with `previous_response_id` and only the new items: the history is kept by the provider,
which the proxy cannot rewrite, so with `provider_state: compaction` it asks the provider to compact once the chain
passes the trigger (`context_management`), as it does over HTTP.

Outbound connections other than loopback (Codex's plugin sync, for one) go to a dead proxy on loopback, so the test
uses no network. Without the binary the test skips, and fails under CI, which installs it.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from proxy.simulator.openai_upstream import OpenAIUpstream
from proxy.simulator.responses_api import (
    FunctionCall,
    ResponsesReply,
    ResponsesResponder,
    responses_tool_loop_responder,
)
from proxy.simulator.responses_items import item_type
from tests.support.agent_cli import installed_cli, run_cli
from tests.support.proxies import LoopbackProxies

CODEX_VERSION = "0.171.0"
MODEL = "gpt-4.1"
WINDOW = 16_000
STEPS = 100
"""More calls than fit: the task goes on until the provider compacts."""
FINAL = "done: resumed after the compaction"
DEAD_PROXY = "http://127.0.0.1:9"
"""Where Codex's attempts to reach the internet go: nothing listens there."""


def codex_binary() -> Path:
    """The installed `codex` (`CODEX_BIN` overrides the cache); skips (fails under CI) when there is none."""
    return installed_cli("Codex CLI", f"codex-{CODEX_VERSION}", "codex", "CODEX_BIN")


def agent() -> ResponsesResponder:
    """The model: `exec_command` calls printing numbers until the provider compacts, one more after, then an answer."""

    def command(step: int, _call: int) -> dict[str, Any]:
        return {"cmd": f"seq {step * 1000} {step * 1000 + 150}"}

    loop = responses_tool_loop_responder("exec_command", steps=STEPS, reasoning=False, arguments=command)

    def respond(request: dict[str, Any]) -> ResponsesReply:
        items = request["input"]
        if items and item_type(items[-1]) == "compaction":
            return ResponsesReply(function_calls=(FunctionCall("exec_command", json.dumps({"cmd": "pwd"})),))
        if any(item_type(item) == "compaction" for item in items):
            return ResponsesReply(text=FINAL)
        return loop(request)

    return respond


@pytest.fixture
async def upstream() -> AsyncIterator[OpenAIUpstream]:
    async with OpenAIUpstream(context_window=WINDOW, responses_responder=agent()) as fake:
        yield fake


API_KEY_LOGIN: Mapping[str, str] = {"OPENAI_API_KEY": "sk-dummy-for-loopback"}
"""The environment of Codex signed in with an API key (the default of `run_codex`)."""


async def run_codex(
    binary: Path,
    base_url: str,
    workdir: Path,
    home: Path,
    prompt: str,
    *,
    login: Mapping[str, str] = API_KEY_LOGIN,
    config: Mapping[str, str] | None = None,
    model: str = MODEL,
) -> tuple[int, str, str]:
    """`codex exec` of `prompt` with its built-in OpenAI provider at `base_url`: its exit code, stdout and stderr.

    :param login: Environment variables of its login (an API key by default; a ChatGPT login lives in `home`).
    :param config: More `-c key=value` settings, each value a string.
    """
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "CODEX_HOME": str(home),
        "HTTPS_PROXY": DEAD_PROXY,
        "HTTP_PROXY": DEAD_PROXY,
        "NO_PROXY": "127.0.0.1,localhost",
        **login,
    }
    command = [
        str(binary),
        "exec",
        "--skip-git-repo-check",
        "--ephemeral",
        "--dangerously-bypass-approvals-and-sandbox",
    ]
    for key, value in {"openai_base_url": base_url, **(config or {})}.items():
        command += ["-c", f"{key}={json.dumps(value)}"]
    command += ["-m", model, prompt]
    return await run_cli(command, workdir, env)


async def test_codex_cli_completes_a_long_task_over_one_socket_and_is_compacted(
    upstream: OpenAIUpstream, tmp_path: Path
) -> None:
    binary = codex_binary()
    proxies = LoopbackProxies(upstream=upstream.base_url, context_windows={MODEL: WINDOW}, provider_state="compaction")
    proxy = await proxies.start()
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()
    try:
        code, out, err = await run_codex(binary, proxy.url, tmp_path / "work", tmp_path / "home", "Count to a lot.")
    finally:
        await proxies.close()

    assert code == 0, err[-2000:]
    assert FINAL in out, out[-2000:]
    assert "Reconnecting" not in out + err
    upgrades = [request for request in upstream.requests if request.method == "GET" and request.path == "/v1/responses"]
    assert len(upgrades) == 1, "one socket for the whole task: no reconnect"
    creates = [request.json for request in upstream.requests if request.method == "WEBSOCKET"]
    assert all(body.get("previous_response_id") for body in creates[1:]), "Codex chains every request"
    asked = [body["context_management"] for body in creates if body.get("context_management")]
    assert asked, "the chain passed the trigger: the proxy asked the provider to compact"
    assert {entry[0]["compact_threshold"] for entry in asked} == {int(0.7 * WINDOW)}
    assert upstream.responses_service.compactions >= 1, "and the provider compacted"
    assert max(usage["input_tokens"] for usage in upstream.responses_usages) <= WINDOW
