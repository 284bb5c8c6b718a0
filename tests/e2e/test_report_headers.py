"""The response headers that tell a client what was done: integers, honest in observe mode, never silent, documented."""

from __future__ import annotations

import re
from pathlib import Path

import orjson

from tests.e2e.conftest import MODEL, StartProxy
from tests.e2e.test_controls import history, post
from tests.support.openai_upstream import OpenAIUpstream

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


def test_the_readme_documents_every_value_and_header() -> None:
    readme = (ROOT / "README.md").read_text()
    answered = {"compacted", "would-compact", "unchanged", "deferred"}  # what `report_headers` answers
    for source in (ROOT / "proxy").rglob("*.py"):
        answered.update(re.findall(r'"X-Compaction": "([a-z-]+)"', source.read_text()))
    documented = readme[readme.index("- **What was done.**") : readme.index("- **Observability.**")]
    assert answered <= set(re.findall(r"^    - `([a-z-]+)`:", documented, re.MULTILINE)), documented
    for header in (
        "X-Compaction-Tokens-Before-Bound",
        "X-Compaction-Warning",
        "X-Compaction-Tokens-After",
        "X-Compaction-Offloaded",
        "X-Compaction-Reads",
        "X-Compaction-Reads-Not-Held",
        "X-Compaction-Offload: off",
        "X-Compaction-Deferred",
        "X-Compaction-Client: auto | defer | ignore",
        "X-Compaction-Instructions",
    ):
        assert f"`{header}" in readme
