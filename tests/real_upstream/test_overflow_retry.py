"""The reactive retry against a real server: llama-server rejects a prompt larger than its window.

The proxy is told the window is 8192 while the server has 2048, so it forwards a 3000-token conversation unchanged;
llama.cpp answers 400 `exceed_context_size_error` stating `n_ctx`; the proxy learns the real window, compacts, retries
once, and the client gets its 200.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import openai
import pytest

from proxy.formats.chat_completions.errors import Overflow, context_overflow
from tests.real_upstream.conftest import MODEL, N_CTX, LlamaServer, Proxies
from tests.real_upstream.texts import SYSTEM_PROMPT, prose

pytestmark = pytest.mark.real_upstream

BELIEVED_WINDOW = 8192
OVERSIZED_TOKENS = 3000


def oversized_conversation(llama_server: LlamaServer) -> list[dict[str, Any]]:
    """A conversation of about `OVERSIZED_TOKENS` server tokens, in turns the proxy can drop."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
    size = len(llama_server.tokenize(SYSTEM_PROMPT))
    paragraph = 0
    while size < OVERSIZED_TOKENS:
        text = prose(paragraph, sentences=6)
        messages += [
            {"role": "user", "content": f"{text} What should be inspected first?"},
            {"role": "assistant", "content": f"Section {paragraph} first."},
        ]
        size += len(llama_server.tokenize(text)) + 20
        paragraph += 1
    messages.append({"role": "user", "content": "Summarize the inspections in one sentence."})
    return messages


def post_json(url: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """POST JSON and return the status and JSON body, errors included."""
    data = json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_llama_server_overflow_error_is_recognized(llama_server: LlamaServer) -> None:
    """llama.cpp's own answer to an oversized prompt is an overflow the proxy recognizes, window included."""
    status, body = post_json(
        llama_server.base_url + "/v1/chat/completions",
        {"model": MODEL, "messages": oversized_conversation(llama_server), "max_tokens": 8},
    )
    print(f"\nreal_upstream llama.cpp overflow answer: {status} {json.dumps(body)}")
    assert status == 400, body
    assert body["error"]["type"] == "exceed_context_size_error", body
    assert context_overflow(status, body) == Overflow(N_CTX)


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
async def test_server_rejection_is_compacted_and_retried(
    proxies: Proxies, llama_server: LlamaServer, stream: bool
) -> None:
    """A proxy that believes in a bigger window learns the real one from the rejection and retries within it."""
    base_url, service = await proxies.start(context_windows={MODEL: BELIEVED_WINDOW})
    messages = oversized_conversation(llama_server)
    client = openai.AsyncOpenAI(api_key="sk-local", base_url=base_url, max_retries=0, timeout=120)
    try:
        options: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0}
        if stream:
            raw = await client.chat.completions.with_raw_response.create(
                **options, stream=True, stream_options={"include_usage": True}
            )
            usage = None
            async for chunk in raw.parse():
                usage = chunk.usage or usage
        else:
            raw = await client.chat.completions.with_raw_response.create(**options)
            usage = raw.parse().usage
    finally:
        await client.close()

    assert raw.status_code == 200
    assert raw.headers.get("X-Compaction") == "compacted-after-overflow"
    assert raw.headers.get("X-Compaction-Context-Window") == str(N_CTX)
    assert usage is not None
    assert usage.prompt_tokens < N_CTX
    tenant = bytes.fromhex(service.settings.tenant_of({"Authorization": "Bearer sk-local"}))
    learned = service.windows.resolve_window(MODEL, tenant=tenant)
    assert learned is not None and learned.tokens == N_CTX, "the proxy did not learn the server's window"
