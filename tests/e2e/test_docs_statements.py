"""What the README and the docs say in prose, borne out by a running proxy: which answers carry the report headers,
which metrics exist (with which labels), and the rules a setting's value must follow."""

from __future__ import annotations

import re

import aiohttp
import orjson
import pytest
from pydantic import ValidationError

from proxy.config import Settings
from proxy.engine import TiktokenCounter
from proxy.pipeline.offload.tool import READ_TOOL
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.e2e.conftest import StartProxy
from tests.e2e.test_readme_reference import REFERENCE, names, readme_table, send
from tests.support.chat_requests import history, post
from tests.support.exported_metrics import declared_names
from tests.test_docs import PAGES, prose

UNREADABLE = (b"{not json", b'{"model": "gpt-4o-mini", "messages": "oops"}')


async def test_a_body_the_proxy_cannot_read_is_answered_without_report_headers_as_documented(
    upstream: OpenAIUpstream, start_proxy: StartProxy
) -> None:
    base_url = await start_proxy()
    for body in UNREADABLE:
        headers = await send(base_url, body)
        assert [name for name in headers if name.lower().startswith("x-compaction")] == []
    reference = REFERENCE.read_text()
    intro = reference[reference.index("\n## Response headers\n") :].split("\n| header |", 1)[0]
    assert '`"messages": "oops"`' in intro and "carries none of them" in intro


async def test_every_metric_the_pages_name_is_exported_with_the_labels_they_give_it(
    upstream: OpenAIUpstream, start_proxy: StartProxy
) -> None:
    base_url = await start_proxy()
    async with aiohttp.ClientSession() as http, http.get(base_url.removesuffix("/v1") + "/metrics") as response:
        exported = declared_names(await response.text())
    labels = {names(name)[0]: set(names(cells)) for name, _, cells, _ in readme_table("Metrics")}
    wrong: list[str] = []
    for page in PAGES:
        text = prose(page.read_text())
        for name, label in re.findall(r"`(\w+)\{(\w+)=", text):
            if name not in exported or label not in labels.get(name, set()):
                wrong.append(f"{page.name}: {name}{{{label}=...}}")
        metrics = set(re.findall(r"`(compaction_proxy_\w+)", text)) - {READ_TOOL}  # the read tool's name is no metric
        wrong += [f"{page.name}: {name}" for name in sorted(metrics - exported)]
    assert wrong == []


@pytest.mark.parametrize(("setting", "short"), [("proxy_keys", ["k" * 15]), ("tenant_key", "k" * 15)])
def test_a_settings_minimum_length_is_in_its_row(setting: str, short: object) -> None:
    with pytest.raises(ValidationError, match="at least 16 characters"):
        Settings(**{setting: short})
    rows = {names(row[0])[0]: row for row in readme_table("Settings")}
    assert "at least 16 characters" in rows[setting][4]


async def test_tokens_before_of_a_resent_conversation_is_counted_with_the_rewrite_replayed_as_documented(
    upstream: OpenAIUpstream, start_proxy: StartProxy
) -> None:
    base_url = await start_proxy()
    first = orjson.loads(history(30))
    status, headers, answer = await post(base_url, orjson.dumps(first))
    assert status == 200 and headers["X-Compaction"] == "compacted"
    resent = {**first, "messages": [*first["messages"], answer["choices"][0]["message"], USER_AGAIN]}
    status, headers, _ = await post(base_url, orjson.dumps(resent))
    as_sent = TiktokenCounter().messages_tokens(resent["messages"])
    assert status == 200 and int(headers["X-Compaction-Tokens-Before"]) < as_sent / 2  # the replayed conversation's
    rows = {names(row[0])[0]: row[2] for row in readme_table("Response headers") if row[0]}
    assert "rewrite replayed" in rows["X-Compaction-Tokens-Before"]
    assert "(any size)" in rows["X-Compaction-Tokens-Before-Bound"]


USER_AGAIN = {"role": "user", "content": "And the fix?"}
