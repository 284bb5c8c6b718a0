"""The reference's tables hold what the proxy does: every header and value it documents is one a running proxy
sends, every metric it lists is one `/metrics` exports (and the other way round), and every setting has its row.

The tables are read from docs/reference.md (the README links there) as a user reads them; the proxy is the real one
on loopback in front of the OpenAI-like upstream, driven by traffic that makes each header appear.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from proxy.config import Settings, env_name
from proxy.settings_flags import SECRET_FIELDS, flag_of
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.e2e.conftest import MODEL, WINDOW, StartProxy
from tests.e2e.test_one_decision import tool_conversation
from tests.support.chat_requests import history, post

ROOT = Path(__file__).resolve().parents[2]


def hello(model: str) -> bytes:
    return orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})


SMALL = hello(MODEL)

NOT_PRODUCED_HERE = {
    ("X-Compaction", "error"): "tests/e2e/test_store_outage.py (a state store that does not answer)",
    ("X-Compaction", "provider-compaction"): "tests/e2e/test_controls.py (provider_state: compaction)",
    ("X-Compaction", "provider-truncation"): "tests/e2e/test_controls.py (provider_state: truncation)",
    ("X-Compaction-Count", "exact"): "tests/e2e/test_exact_counts.py (an upstream that counts)",
    **{
        ("X-Compaction-Deferred", signal): "tests/e2e/test_client_compaction.py (each signal)"
        for signal in ("compaction-request", "compaction-items", "context-management", "codex-cli", "header", "setting")
    },
    ("X-Compaction-Provider-Clears", None): "tests/e2e/messages/test_provider_edits.py (the API's own edits)",
    ("X-Compaction-Provider-Tokens", None): "tests/e2e/messages/test_provider_edits.py (the API's own edits)",
    ("X-Compaction-Reads", None): "tests/e2e/test_offload_reads.py (a model that reads back)",
    ("X-Compaction-Reads-Not-Held", None): "tests/e2e/test_offload_reads.py (a model that reads back)",
}
"""Header values whose traffic is another test's subject (named here); this test checks the proxy's code sends them."""


REFERENCE = ROOT / "docs" / "reference.md"


def readme_table(heading: str) -> list[list[str]]:
    """The rows of the first table under `## heading` of the reference, as cells with their backticks, header and rule
    left out."""
    reference = REFERENCE.read_text()
    section = reference[reference.index(f"\n## {heading}\n") :].split("\n## ", 2)[1]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in re.split(r"(?<!\\)\|", row.strip().strip("|"))] for row in rows[2:]]


def names(cell: str) -> list[str]:
    """The backticked names in a cell."""
    return re.findall(r"`([^`]+)`", cell)


def documented_headers() -> dict[str, set[str]]:
    """Each documented response header, with its enumerated values (empty for integers, sentences, lists)."""
    documented: dict[str, set[str]] = {}
    current = ""
    for header, values, _ in readme_table("Response headers"):
        current = names(header)[0] if header else current
        documented.setdefault(current, set()).update(names(values))
    return documented


async def send(base_url: str, body: bytes, path: str = "/chat/completions", **headers: str) -> dict[str, str]:
    """The response headers of one request (any status)."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(base_url + path, data=body, headers={"Authorization": "Bearer sk-readme", **headers}) as response,
    ):
        await response.read()
        return dict(response.headers)


async def traffic(upstream: OpenAIUpstream, start_proxy: StartProxy) -> list[dict[str, str]]:
    """The headers of requests chosen so that every documented header and value is sent at least once."""
    upstream.context_window = 1_000_000
    enforce = await start_proxy()
    observe = await start_proxy(mode="observe")
    # The proxy believes the window is larger than the upstream's: the upstream refuses, the proxy learns and retries.
    believing = await start_proxy(context_windows={MODEL: 400_000})
    reserved = orjson.loads(history(25))  # a conversation of its own: no rewrite of an earlier request replays
    reserved["max_tokens"] = WINDOW // 2  # more than the 30% compact_at leaves: the reservation decides
    over_target = {"model": MODEL, "messages": [{"role": "system", "content": "Rule. " * 2_000}]}
    over_target["messages"] += orjson.loads(history(4))["messages"][1:]
    over_window = {"model": MODEL, "messages": [{"role": "system", "content": "Rule. " * 6_000}]}
    over_window["messages"] += orjson.loads(history(3))["messages"][1:]
    answers = [
        await send(enforce, SMALL),
        await send(enforce, hello("gpt-4o")),
        await send(enforce, SMALL, **{"X-Context-Window": "abc"}),
        await send(enforce, SMALL, **{"X-Compaction": "off"}),
        await send(enforce, hello("a-model-nobody-knows")),
        await send(enforce, history(30), **{"X-Context-Window": str(WINDOW)}),
        await send(enforce, tool_conversation(30), **{"X-Context-Window": str(4 * WINDOW)}),
        await send(enforce, orjson.dumps(reserved), **{"X-Context-Window": str(WINDOW)}),
        await send(enforce, orjson.dumps(over_target), **{"X-Context-Window": str(WINDOW)}),
        await send(enforce, orjson.dumps(over_window), **{"X-Context-Window": str(WINDOW)}),
        await send(enforce, history(30), **{"X-Context-Window": str(WINDOW), "User-Agent": "claude-cli/1.0.0"}),
        await send(enforce, SMALL, **{"User-Agent": "claude-cli/1.0.0"}),
        await send(
            enforce,
            orjson.dumps({"model": MODEL, "input": "hi", "previous_response_id": "resp_earlier"}),
            "/responses",
        ),
        await send(observe, history(30), **{"X-Context-Window": str(WINDOW)}),
    ]
    upstream.context_window = WINDOW
    answers.append(await send(believing, history(30)))
    return answers


def source_sends(header: str, value: str | None) -> bool:
    """Whether the proxy's code names `header` (with `value`, when given) as something it sends."""
    code = "\n".join(source.read_text() for source in (ROOT / "proxy").rglob("*.py"))
    if value is None:
        return f'"{header}"' in code
    return f'"{value}"' in code or value.upper().replace("-", "_") in code


async def test_every_documented_header_and_value_is_sent(upstream: OpenAIUpstream, start_proxy: StartProxy) -> None:
    answers = await traffic(upstream, start_proxy)
    sent: dict[str, set[str]] = {}
    for headers in answers:
        for name, value in headers.items():
            if name.lower().startswith("x-compaction"):
                sent.setdefault(name, set()).add(value)
    documented = documented_headers()
    assert set(sent) <= set(documented), f"sent but not in the reference's table: {set(sent) - set(documented)}"
    for header, values in documented.items():
        elsewhere = [value for (name, value) in NOT_PRODUCED_HERE if name == header]
        if None in elsewhere:
            assert source_sends(header, None), header
            continue
        if not values or not values <= set(elsewhere):
            assert header in sent, f"{header} is documented but no answer carried it"
        for value in values:
            if value in elsewhere:
                assert source_sends(header, value), (header, value)
            elif header != "X-Compaction-Window-Source" or value in ("request", "learned", "configured", "table"):
                assert value in sent[header], f"{header}: {value} is documented but never sent; sent {sent[header]}"
    assert sent["X-Compaction-Warning"] == {"X-Context-Window ignored: not a positive integer"}
    for integer in ("X-Compaction-Tokens-Before", "X-Compaction-Tokens-After", "X-Compaction-Context-Window"):
        assert all(value.isdigit() for value in sent[integer]), integer
    strategies = {name for value in sent["X-Compaction-Strategies"] for name in value.split(",")}
    assert strategies <= set(Settings.model_fields["strategies"].default_factory()) | {"tool_result_offloading"}  # type: ignore[misc]


def exported(exposition: str) -> dict[str, tuple[str, set[str]]]:
    """Each metric family's name as its `# TYPE` line gives it (counters with `_total`), its type, and its samples'
    label names."""
    families: dict[str, tuple[str, set[str]]] = {}
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(" ")
            if not family.endswith("_created"):  # each counter's and histogram's start time, not a metric of ours
                families[family] = (kind, set())
    for line in exposition.splitlines():
        match = re.match(r"([a-z_]+)\{(.*)\} ", line)
        if match is None:
            continue
        labels = set(re.findall(r'([a-z_]+)="', match.group(2))) - {"le"}
        family = re.sub(r"_(bucket|sum|count|created)$", "", match.group(1))
        for name in (family, family + "_total", match.group(1)):
            if name in families:
                families[name][1].update(labels)
    return families


async def test_every_documented_metric_is_exported_and_every_exported_one_documented(
    upstream: OpenAIUpstream, start_proxy: StartProxy
) -> None:
    await traffic(upstream, start_proxy)
    base_url = await start_proxy()
    await post(base_url, tool_conversation(30), **{"X-Context-Window": str(WINDOW)})
    async with aiohttp.ClientSession() as http, http.get(base_url.removesuffix("/v1") + "/metrics") as response:
        scraped = exported(await response.text())
    documented = {names(name)[0]: (kind, set(names(labels))) for name, kind, labels, _ in readme_table("Metrics")}
    ours = {name: found for name, found in scraped.items() if name.startswith("compaction_proxy_")}
    assert set(ours) == set(documented), (set(ours) - set(documented), set(documented) - set(ours))
    for name, (kind, labels) in ours.items():
        assert documented[name][0] == kind, name
        assert labels <= documented[name][1], (name, labels)


def test_every_setting_has_its_row_with_flag_environment_and_default() -> None:
    rows: dict[str, Any] = {names(row[0])[0]: row for row in readme_table("Settings")}
    assert set(rows) == set(Settings.model_fields)
    for name, (_, flag, environment, default, meaning) in rows.items():
        assert environment == f"`{env_name(name)}`", name
        assert flag == ("(environment or file only)" if name in SECRET_FIELDS else f"`{flag_of(name)}`"), name
        assert default and meaning, name
    for name, info in Settings.model_fields.items():
        if isinstance(info.default, int | float | str) and not isinstance(info.default, bool) and info.default:
            shown = str(
                int(info.default) if isinstance(info.default, float) and info.default.is_integer() else info.default
            )
            assert f"`{shown}`" in rows[name][3], (name, rows[name][3])
