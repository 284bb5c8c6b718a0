"""The response headers that tell a client what was done: integers, honest in observe mode, never silent.

That docs/reference.md documents each of them, and nothing the proxy does not send, is `test_readme_reference.py`.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.e2e.conftest import MODEL, StartProxy
from tests.support.chat_requests import history, post

ROOT = Path(__file__).resolve().parents[2]

SMALL = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})


async def test_tokens_before_is_an_integer_and_an_upper_bound_says_so(start_proxy: StartProxy) -> None:
    base_url = await start_proxy()
    # A request this small is sized by its bytes, never tokenized: the count is an upper bound.
    status, headers, _ = await post(base_url, SMALL)
    assert status == 200
    assert int(headers["X-Compaction-Tokens-Before"]) > 0
    assert headers["X-Compaction-Tokens-Before-Bound"] == "true"
    status, headers, _ = await post(base_url, history(30))
    assert status == 200 and headers["X-Compaction"] == "compacted"
    assert int(headers["X-Compaction-Tokens-Before"]) > int(headers["X-Compaction-Tokens-After"])
    assert "X-Compaction-Tokens-Before-Bound" not in headers


async def test_observe_mode_never_says_compacted(upstream: OpenAIUpstream, start_proxy: StartProxy) -> None:
    upstream.context_window = 1_000_000
    base_url = await start_proxy(mode="observe")
    body = history(30)
    status, headers, _ = await post(base_url, body)
    assert status == 200
    assert headers["X-Compaction"] == "would-compact"
    assert int(headers["X-Compaction-Tokens-After"]) < int(headers["X-Compaction-Tokens-Before"])
    assert upstream.requests[-1].body == body


async def test_an_invalid_context_window_header_is_ignored_with_a_warning(
    upstream: OpenAIUpstream, start_proxy: StartProxy
) -> None:
    upstream.context_window = 1_000_000
    base_url = await start_proxy()
    for invalid in ("abc", "0", "-5", "4k", "1e6"):
        status, headers, _ = await post(base_url, SMALL, **{"X-Context-Window": invalid})
        assert status == 200, invalid
        assert headers["X-Compaction-Warning"] == "X-Context-Window ignored: not a positive integer", invalid
        assert headers["X-Compaction-Context-Window"] != invalid
    status, headers, _ = await post(base_url, SMALL, **{"X-Context-Window": "3000"})
    assert headers["X-Compaction-Context-Window"] == "3000"
    assert "X-Compaction-Warning" not in headers
    status, headers, _ = await post(base_url, SMALL)
    assert "X-Compaction-Warning" not in headers
