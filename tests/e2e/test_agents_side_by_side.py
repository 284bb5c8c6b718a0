"""Every client at once through one proxy, each reaching its own provider, and a local model on a third upstream.

One proxy given nothing but the two fake providers' origins (`upstream`, `anthropic_upstream`) and one route (models
`smollm2-*` to a real llama.cpp server, as in tests/real_upstream). At the same time: the official `openai` SDK (chat
completions and the Responses API) and the official `anthropic` SDK each run a long tool-using agent (as in
`test_routes`), Claude Code and Codex CLI each a long task with the base URLs docs/routes.md gives (`ANTHROPIC_BASE_URL`
without `/v1`, Codex's `openai_base_url` with it), and the `openai` SDK asks the local model a few short questions.
Every long run is compacted on the way, no request reaches another provider, and the local model's answers come from
llama.cpp.

Each provider's model answers its two clients by the model they ask for (the SDK agents keep the models of
`tests.support.format_agents`; the CLIs use others). The CLIs are installed by `.ci/run`, as is llama-server; without
them the test skips (and fails under CI).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import openai
from openai.types.chat import ChatCompletion

from proxy.simulator.anthropic_upstream import AnthropicUpstream
from proxy.simulator.chat_completion import SYSTEM_FINGERPRINT
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.e2e.messages.test_claude_code import FINAL as CLAUDE_FINAL
from tests.e2e.messages.test_claude_code import TOO_LONG, claude_binary, reader, run_claude, write_parts
from tests.e2e.messages.test_claude_code import WINDOW as CLAUDE_WINDOW
from tests.e2e.test_codex_cli import FINAL as CODEX_FINAL
from tests.e2e.test_codex_cli import WINDOW as CODEX_WINDOW
from tests.e2e.test_codex_cli import agent, codex_binary, run_codex
from tests.e2e.test_routes import routed
from tests.real_upstream.conftest import MODEL as LOCAL_MODEL
from tests.real_upstream.conftest import N_CTX, running_llama_server
from tests.support.format_agents import AGENTS
from tests.support.proxies import LoopbackProxies, RunningProxy
from tests.support.wire_formats import CHAT_COMPLETIONS, MESSAGES, RESPONSES

TURNS: Final = 120
"""Model calls of each SDK agent: enough for each to be compacted (see `test_routes`)."""
CLAUDE_MODEL: Final = "claude-haiku-4-5"
CODEX_MODEL: Final = "gpt-4.1-mini"
"""Codex CLI's model: one Codex has no metadata for, like `test_codex_cli`'s, and not the SDK agent's."""
QUESTIONS: Final = ("Say hi.", "Name a colour.")
"""What the local model is asked, one short answer each: it generates slowly on two cores."""
ANSWER_TOKENS: Final = 8


def by_model(responders: Mapping[str, Callable[[Any], Any]]) -> Callable[[Any], Any]:
    """One provider's model for several clients: each request is answered by the responder of the model it names."""
    return lambda body: responders[body["model"]](body)


def windows() -> dict[str, int]:
    """The window of every model the proxy serves here."""
    sdk = {wire.model: AGENTS[wire].window for wire in (CHAT_COMPLETIONS, RESPONSES, MESSAGES)}
    return {**sdk, CLAUDE_MODEL: CLAUDE_WINDOW, CODEX_MODEL: CODEX_WINDOW, LOCAL_MODEL: N_CTX}


async def ask_local_model(proxy: RunningProxy) -> list[ChatCompletion]:
    """The `QUESTIONS`, one after the other, to the local model through the proxy."""
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-local", max_retries=0) as client:
        return [
            await client.chat.completions.create(
                model=LOCAL_MODEL, max_tokens=ANSWER_TOKENS, messages=[{"role": "user", "content": question}]
            )
            for question in QUESTIONS
        ]


async def test_every_client_at_once_reaches_its_own_provider_and_a_routed_model_its_local_server(
    tmp_path: Path,
) -> None:
    claude, codex = claude_binary(), codex_binary()
    for folder in ("claude-home", "claude-work", "codex-home", "codex-work", "llama"):
        (tmp_path / folder).mkdir()
    parts = write_parts(tmp_path / "claude-work")
    async with (
        AnthropicUpstream(context_window=AGENTS[MESSAGES].window, context_windows={CLAUDE_MODEL: CLAUDE_WINDOW}) as ant,
        OpenAIUpstream(context_windows=windows()) as oai,
    ):
        for wire, fake in ((CHAT_COMPLETIONS, oai), (RESPONSES, oai), (MESSAGES, ant)):
            AGENTS[wire].install(fake, summary="")
        ant.responder = by_model({MESSAGES.model: ant.responder, CLAUDE_MODEL: reader(parts)})
        oai.responses_responder = by_model({RESPONSES.model: oai.responses_responder, CODEX_MODEL: agent()})
        with running_llama_server(tmp_path / "llama") as llama:
            local = {"name": "local", "upstream": llama.base_url, "models": ["smollm2-*"]}
            proxies = LoopbackProxies(
                upstream=oai.base_url,
                anthropic_upstream=ant.base_url,
                routes=[local],
                context_windows=windows(),
                provider_state="compaction",
            )
            proxy = await proxies.start()
            base = f"http://127.0.0.1:{proxy.server.port}"
            try:
                sdk_runs = [AGENTS[wire].run(proxy, TURNS, lambda turn: turn % 2 == 1) for wire in AGENTS]
                *decisions, (claude_code, printed), (codex_code, out, err), answers = await asyncio.gather(
                    *sdk_runs,
                    run_claude(claude, CLAUDE_MODEL, base, tmp_path / "claude-work", tmp_path / "claude-home"),
                    run_codex(
                        codex, base + "/v1", tmp_path / "codex-work", tmp_path / "codex-home", "Count to a lot.",
                        model=CODEX_MODEL,
                    ),
                    ask_local_model(proxy),
                )  # fmt: skip
            finally:
                await proxies.close()

    for wire, headers in zip(AGENTS, decisions, strict=True):
        assert len(headers) == TURNS and "compacted" in headers, f"{wire.name}: the long run was never compacted"
        assert "compacted-after-overflow" not in headers
    assert claude_code == 0 and CLAUDE_FINAL in printed and TOO_LONG not in printed, printed[-2000:]
    assert codex_code == 0 and CODEX_FINAL in out, err[-2000:]
    assert ant.rejections == []
    assert proxy.metric("compaction_proxy_decisions_total", route="messages", decision="compacted") >= 1
    assert oai.responses_service.compactions >= 1, "Codex's chain passed the trigger and the provider compacted"
    # The local model answered, as llama.cpp does (its own fingerprint, its per-request timings, its usage).
    assert len(answers) == len(QUESTIONS)
    for answer in answers:
        assert answer.system_fingerprint != SYSTEM_FINGERPRINT and (answer.model_extra or {}).get("timings")
        assert answer.usage is not None and 0 < answer.usage.completion_tokens <= ANSWER_TOKENS
    assert await routed(proxy, "local") == len(QUESTIONS)
    # Nothing crossed: each fake saw only its own API and its own clients' models, none the local model.
    assert {request["model"] for request in ant.requests} == {MESSAGES.model, CLAUDE_MODEL}
    assert oai.requests and not [request for request in oai.requests if "/messages" in request.path]
    chat_models = {body.get("model") for body in oai.chat_requests}
    creates = [request.json for request in oai.requests if request.json and "input" in request.json]
    assert chat_models == {CHAT_COMPLETIONS.model}
    assert {body.get("model") for body in creates} == {RESPONSES.model, CODEX_MODEL}
    served = f"{len(answers)} to llama.cpp ({answers[0].system_fingerprint})"
    print(f"\n{len(ant.requests)} requests to Anthropic, {len(oai.requests)} to OpenAI, {served}")
