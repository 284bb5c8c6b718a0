"""A long chat-completions conversation and a plain POST of it, for the end-to-end tests that are about chat.

Tests written once for every format build their requests with `tests.support.wire_formats` instead.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from tests.support.wire_formats import PARAGRAPH, SYSTEM

MODEL = "gpt-4o-mini"


def history(turns: int, model: str = MODEL) -> bytes:
    """A system prompt, `turns` long questions and answers (about 130 tokens each), and a last short question."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn}: " + PARAGRAPH * 8})
        messages.append({"role": "assistant", "content": PARAGRAPH * 8})
    messages.append({"role": "user", "content": "What went wrong, in one line?"})
    return json.dumps({"model": model, "messages": messages}).encode()


async def post(base_url: str, body: bytes, key: str = "sk-alice", **headers: str) -> tuple[int, dict[str, str], Any]:
    """POST a chat completion to `base_url` (`.../v1`) with `key`: the status, the headers and the parsed answer."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{base_url}/chat/completions", data=body, headers={"Authorization": f"Bearer {key}", **headers}
        ) as response,
    ):
        return response.status, dict(response.headers), await response.json()
