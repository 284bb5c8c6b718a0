"""Claude Code and Codex CLI side by side through one proxy, each reaching its own provider.

One proxy given nothing but the two fake providers' origins (`upstream`, `anthropic_upstream`), the two real CLIs
run at once against it with the base URLs docs/routes.md gives (`ANTHROPIC_BASE_URL` without `/v1`, Codex's
`openai_base_url` with it): each completes its long task, compacted on the way, and no request reaches the other
provider. Both CLIs are installed by `.ci/run`; without them the test skips (and fails under CI).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from proxy.simulator.anthropic_upstream import AnthropicUpstream
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.e2e.messages.test_claude_code import FINAL as CLAUDE_FINAL
from tests.e2e.messages.test_claude_code import MODEL as CLAUDE_MODEL
from tests.e2e.messages.test_claude_code import TOO_LONG, claude_binary, reader, run_claude, write_parts
from tests.e2e.messages.test_claude_code import WINDOW as CLAUDE_WINDOW
from tests.e2e.test_codex_cli import FINAL as CODEX_FINAL
from tests.e2e.test_codex_cli import MODEL as CODEX_MODEL
from tests.e2e.test_codex_cli import WINDOW as CODEX_WINDOW
from tests.e2e.test_codex_cli import agent, codex_binary, run_codex
from tests.support.proxies import LoopbackProxies


async def test_claude_code_and_codex_cli_at_once_each_reach_their_own_provider(tmp_path: Path) -> None:
    claude, codex = claude_binary(), codex_binary()
    for folder in ("claude-home", "claude-work", "codex-home", "codex-work"):
        (tmp_path / folder).mkdir()
    parts = write_parts(tmp_path / "claude-work")
    async with (
        AnthropicUpstream(context_window=CLAUDE_WINDOW, responder=reader(parts)) as anthropic,
        OpenAIUpstream(context_window=CODEX_WINDOW, responses_responder=agent()) as openai,
    ):
        proxies = LoopbackProxies(
            upstream=openai.base_url,
            anthropic_upstream=anthropic.base_url,
            context_windows={"claude": CLAUDE_WINDOW, CODEX_MODEL: CODEX_WINDOW},
            provider_state="compaction",
        )
        proxy = await proxies.start()
        base = f"http://127.0.0.1:{proxy.server.port}"
        try:
            (claude_code, printed), (codex_code, out, err) = await asyncio.gather(
                run_claude(claude, CLAUDE_MODEL, base, tmp_path / "claude-work", tmp_path / "claude-home"),
                run_codex(codex, base + "/v1", tmp_path / "codex-work", tmp_path / "codex-home", "Count to a lot."),
            )
        finally:
            await proxies.close()

    paths = sorted({request.path for request in openai.requests})
    print(f"\nClaude Code: {len(anthropic.requests)} requests to Anthropic; Codex: {paths} at OpenAI")
    assert claude_code == 0 and CLAUDE_FINAL in printed and TOO_LONG not in printed, printed[-2000:]
    assert codex_code == 0 and CODEX_FINAL in out, err[-2000:]
    assert anthropic.rejections == []
    assert proxy.metric("compaction_proxy_decisions_total", route="messages", decision="compacted") >= 1
    assert openai.responses_service.compactions >= 1, "Codex's chain passed the trigger and the provider compacted"
    # Nothing crossed: the Anthropic fake saw only Messages requests (it serves nothing else), OpenAI's none of them.
    assert anthropic.requests and all(request["model"] == CLAUDE_MODEL for request in anthropic.requests)
    assert openai.requests and not [request for request in openai.requests if "/messages" in request.path]
