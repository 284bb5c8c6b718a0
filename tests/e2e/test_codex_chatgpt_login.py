"""Codex CLI signed in with ChatGPT, its built-in provider pointed at the proxy: a long task over the ChatGPT route.

The real Codex CLI (as in `test_codex_cli`) with the `auth.json` a ChatGPT sign-in writes and no API key, its
`openai_base_url` at the proxy's `/backend-api/codex` (as docs/routes.md tells such users) and its `chatgpt_base_url` at
a stand-in for chatgpt.com's account service (`tests.support.chatgpt_login`). Its model traffic (the Responses API's
WebSocket mode at `/backend-api/codex/responses`, with `ChatGPT-Account-ID` and the login's bearer) takes the proxy's
`chatgpt` route to a fake ChatGPT backend; the API-key route's upstream sees nothing. The chain outgrows the window,
so the proxy has the backend compact it, and the task finishes after the compaction.
"""

from __future__ import annotations

from pathlib import Path

from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.e2e.test_codex_cli import FINAL, MODEL, agent, codex_binary, run_codex
from tests.e2e.test_routes import routed
from tests.support.chatgpt_login import ACCOUNT_ID, ChatGPTAccounts, write_chatgpt_login
from tests.support.private_ca import PrivateCA
from tests.support.proxies import LoopbackProxies

BACKEND_PATH = "/backend-api/codex/responses"
WINDOW = 48_000
"""Room for about 45 of the task's calls (Codex's instructions and tools take 8,400 tokens, each call 520) before
the proxy's trigger (70%), a fifth of what the ChatGPT backend's models serve."""
LONG = 30
"""Calls a long task makes at least."""


async def test_codex_signed_in_with_chatgpt_completes_a_long_task_through_the_chatgpt_route(tmp_path: Path) -> None:
    binary = codex_binary()
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    bearer = write_chatgpt_login(home)
    ca = PrivateCA.create(tmp_path, "chatgpt")
    async with (
        ChatGPTAccounts(ca.issue("chatgpt.com")) as accounts,
        OpenAIUpstream() as api,
        OpenAIUpstream(context_window=WINDOW, responses_responder=agent()) as backend,
    ):
        chatgpt = {
            "name": "chatgpt",
            "upstream": backend.base_url,
            "path_prefix": "/backend-api/codex",
            "header": "ChatGPT-Account-ID",
        }
        proxies = LoopbackProxies(
            upstream=api.base_url, routes=[chatgpt], context_windows={MODEL: WINDOW}, provider_state="compaction"
        )
        proxy = await proxies.start()
        base = f"http://127.0.0.1:{proxy.server.port}/backend-api/codex"
        login = {"CODEX_CA_CERTIFICATE": str(ca.bundle)}
        config = {"chatgpt_base_url": accounts.base_url, "forced_login_method": "chatgpt"}
        try:
            code, out, err = await run_codex(binary, base, work, home, "Count to a lot.", login=login, config=config)
        finally:
            await proxies.close()

    assert code == 0, err[-2000:]
    assert FINAL in out, out[-2000:]
    # Signed in with ChatGPT: Codex checked its account with chatgpt.com, and sent its model traffic to the proxy.
    assert ("GET", "/backend-api/wham/accounts/check", ACCOUNT_ID) in accounts.requests
    assert not [seen for seen in accounts.requests if seen.path.startswith(BACKEND_PATH)]
    # Every request reached the ChatGPT backend with the account and the login's token; none the API-key route.
    assert {request.headers.get("ChatGPT-Account-ID") for request in backend.requests} == {ACCOUNT_ID}
    assert {request.headers.get("Authorization") for request in backend.requests} == {f"Bearer {bearer}"}
    assert not api.requests
    assert await routed(proxy, "default") == 0
    upgrades = [request for request in backend.requests if request.method == "GET" and request.path == BACKEND_PATH]
    assert len(upgrades) == 1, "one WebSocket for the whole task"
    creates = [request.json for request in backend.requests if request.method == "WEBSOCKET"]
    assert {request.path for request in backend.requests if request.method == "WEBSOCKET"} == {BACKEND_PATH}
    # A long task: dozens of calls, then past the trigger the proxy asked the backend to compact, and it did.
    assert len(creates) > LONG
    assert [body for body in creates if body.get("context_management")], "the proxy asked the backend to compact"
    assert backend.responses_service.compactions >= 1
    assert max(usage["input_tokens"] for usage in backend.responses_usages) <= WINDOW
    print(f"\nCodex on ChatGPT: {len(creates)} requests on one socket, {len(accounts.requests)} to chatgpt.com")
