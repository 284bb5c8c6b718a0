"""What Claude reads, counted as Anthropic documents it; the Claude models' windows, the 1M-token beta included."""

from __future__ import annotations

import base64
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.engine import ApproximateCounter, Transcript
from proxy.formats.anthropic.request import MessagesRequest
from proxy.formats.anthropic.tokens import (
    CONTEXT_1M_BETA,
    UNKNOWN_IMAGE_TOKENS,
    betas,
    count_tokens_body,
    document_tokens,
    image_block_tokens,
    image_size_tokens,
    tool_prompt_tokens,
    window_for,
)
from proxy.simulator.anthropic_upstream import AnthropicUpstream
from tests.support.anthropic_conversations import png


def image(width: int, height: int) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png(width, height)}}


@pytest.mark.parametrize(
    ("width", "height", "tokens"),
    [(200, 200, 54), (1000, 1000, 1334), (1092, 1092, 1590), (4000, 3000, 1639), (3000, 100, 109)],
)
def test_images_cost_width_times_height_over_750_after_scaling(width: int, height: int, tokens: int) -> None:
    assert image_block_tokens(image(width, height)) == tokens == image_size_tokens(width, height)


def test_an_image_of_unknown_size_costs_the_most_an_image_can() -> None:
    assert (
        image_block_tokens({"type": "image", "source": {"type": "url", "url": "https://x/y.png"}})
        == UNKNOWN_IMAGE_TOKENS
    )
    assert max(image_size_tokens(w, h) for w, h in [(1568, 735), (1092, 1092), (8000, 8000)]) <= UNKNOWN_IMAGE_TOKENS


def test_an_image_is_not_counted_as_its_base64() -> None:
    big = image(800, 600)
    big["source"]["data"] += "A" * 4_000_000
    request = MessagesRequest.parse(
        b'{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":[%b]}]}' % orjson.dumps(big)
    )
    assert Transcript(request.messages, ApproximateCounter()).total() < 1000


def pdf_document(pdf: bytes) -> dict[str, Any]:
    source = {"type": "base64", "media_type": "application/pdf", "data": base64.b64encode(pdf).decode()}
    return {"type": "document", "source": source}


def test_documents_are_counted_conservatively() -> None:
    text = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x" * 3000}}
    assert document_tokens(text) >= 1000
    one_page = document_tokens(pdf_document(b"<< /Type /Page >>"))
    assert document_tokens(pdf_document(b"%PDF " + b"<< /Type /Page >> " * 3 + b"<< /Type /Pages >>")) == 3 * one_page
    assert one_page >= 3000
    assert document_tokens({"type": "document", "source": {"type": "file", "file_id": "f"}}) >= 20 * one_page


def test_tools_are_counted_as_schemas_and_the_tool_prompt_on_top() -> None:
    tools = [
        {
            "name": "search",
            "description": "Search the web.",
            "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
        }
    ]
    request = MessagesRequest.parse(orjson.dumps({"model": "m", "max_tokens": 1, "tools": tools, "messages": []}))
    assert request.overhead_fields["tools"][0]["function"]["parameters"] == tools[0]["input_schema"]
    assert ApproximateCounter().overhead_tokens(request.overhead_fields) > ApproximateCounter().overhead_tokens({})
    assert request.tool_prompt_tokens == 346
    assert tool_prompt_tokens({"tools": tools, "tool_choice": {"type": "any"}}) == 313
    assert tool_prompt_tokens({"messages": []}) == 0


@pytest.mark.parametrize(
    ("model", "headers", "window"),
    [
        ("claude-sonnet-4-5-20250929", {}, 200_000),
        ("claude-sonnet-4-5-20250929", {"anthropic-beta": f"other-beta, {CONTEXT_1M_BETA}"}, 1_000_000),
        ("claude-sonnet-4-20250514", [("Anthropic-Beta", CONTEXT_1M_BETA)], 1_000_000),
        ("claude-haiku-4-5", {"anthropic-beta": CONTEXT_1M_BETA}, 200_000),
        ("claude-opus-4-6", {}, 1_000_000),
        ("claude-opus-4-5-20251101", {}, 200_000),
        ("claude-fable-5-1", {}, 1_000_000),
        ("anthropic/claude-sonnet-4-6", {}, 1_000_000),
        ("claude-3-5-haiku-20241022", {}, 200_000),
    ],
)
def test_the_window_of_a_claude_model_for_a_request(model: str, headers: Any, window: int) -> None:
    assert window_for(model, headers) == window


def test_betas_are_read_from_every_header() -> None:
    assert betas([("anthropic-beta", "a,b"), ("x", "c"), ("ANTHROPIC-BETA", " d ")]) == {"a", "b", "d"}


async def test_the_count_tokens_body_counts_what_the_request_sends() -> None:
    body = {"model": "claude-sonnet-4-5", "max_tokens": 10, "stream": True, "tools": TOOLS_COUNTED, "messages": [
        {"role": "user", "content": "How long is this?"}]}  # fmt: skip
    async with AnthropicUpstream() as upstream, aiohttp.ClientSession() as http:
        url = upstream.base_url + "/v1/messages/count_tokens"
        async with http.post(url, data=count_tokens_body(body), headers={"content-type": "application/json"}) as answer:
            counted = (await answer.json())["input_tokens"]
    message = AnthropicUpstream().answer({**body, "stream": False}, {})
    assert counted == message["usage"]["input_tokens"] > 0


TOOLS_COUNTED: list[Any] = [{"name": "search", "input_schema": {"type": "object"}}]
