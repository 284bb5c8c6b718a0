"""The proxy's own control headers are read and kept here: the upstream never sees them; `X-Conversation-Id` passes."""

from __future__ import annotations

import json

import aiohttp
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict

from proxy.config import Settings
from proxy.pipeline.caller import CONTEXT_WINDOW_HEADER
from proxy.pipeline.client_compaction import POLICY_HEADER
from proxy.pipeline.offload.offloading import OFFLOAD_HEADER
from proxy.pipeline.service import COMPACTION_HEADER, CompactionPipeline
from proxy.server.headers import CONTROL_HEADERS, HOP_BY_HOP, REQUEST_ONLY_DROPS, upstream_request_headers
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.server.helpers import MakeProxy

CONTROLS = {
    "X-Compaction": "off",
    "X-Compaction-Client": "ignore",
    "X-Compaction-Offload": "off",
    "X-Context-Window": "100000",
}


def test_every_header_the_proxy_reads_as_an_instruction_is_a_control_header() -> None:
    read = {COMPACTION_HEADER, POLICY_HEADER, CONTEXT_WINDOW_HEADER, OFFLOAD_HEADER}
    assert {name.lower() for name in read} == CONTROL_HEADERS
    assert {name.lower() for name in CONTROLS} == CONTROL_HEADERS


async def test_a_chat_request_reaches_the_upstream_without_the_control_headers(
    upstream: OpenAIUpstream, make_proxy: MakeProxy
) -> None:
    settings = Settings(upstream=upstream.base_url, window_probes=[], count_probes=[])
    proxy = await make_proxy(upstream.base_url, CompactionPipeline(settings), window_probes=[], count_probes=[])
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}]}
    headers = {**CONTROLS, "X-Conversation-Id": "conv-7", "Authorization": "Bearer sk-test"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(proxy.url + "/v1/chat/completions", json=body, headers=headers) as response,
    ):
        assert response.status == 200
        assert response.headers["X-Compaction"] == "skipped"  # the instruction was read here
    received = upstream.requests[-1].headers
    assert not CONTROL_HEADERS & {name.lower() for name in received}
    assert received["X-Conversation-Id"] == "conv-7"
    assert received["Authorization"] == "Bearer sk-test"


async def test_a_forwarded_request_reaches_the_upstream_without_the_control_headers(
    upstream: OpenAIUpstream, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(upstream.base_url)
    async with (
        aiohttp.ClientSession() as http,
        http.get(proxy.url + "/echo/h", headers={**CONTROLS, "X-Conversation-Id": "conv-8"}) as response,
    ):
        assert response.status == 200
        received = {name.lower(): value for name, value in json.loads(await response.read())["headers"]}
    assert not CONTROL_HEADERS & set(received)
    assert received["x-conversation-id"] == "conv-8"


_NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=24)


_FLIPS = st.lists(st.booleans(), min_size=24, max_size=24)


@given(control=st.sampled_from(sorted(CONTROL_HEADERS)), flips=_FLIPS, other=_NAME)
def test_control_headers_are_dropped_in_any_case_and_other_headers_kept(
    control: str, flips: list[bool], other: str
) -> None:
    spelled = "".join(char.upper() if flip else char for char, flip in zip(control, flips, strict=False))
    headers = CIMultiDict({spelled: "1", other: "2"})
    sent = {name.lower() for name in upstream_request_headers(headers)}
    assert control not in sent
    kept = other not in REQUEST_ONLY_DROPS | HOP_BY_HOP and not other.startswith("proxy-")
    assert (other in sent) == kept
