"""The README's client set-ups run as written: the Anthropic SDK with the README's `ANTHROPIC_BASE_URL` (the proxy's
origin, without `/v1`) reaches the upstream's `/v1/messages` through the proxy and reads the `X-Compaction*` headers.

The proxy is the console script, in its own process, in front of the fake Messages API on loopback instead of
api.anthropic.com; the port is a free one instead of the README's.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

from proxy.simulator.anthropic_upstream import AnthropicUpstream
from tests.cli.test_five_minutes import run
from tests.support.process_proxy import ProcessProxy

ROOT = Path(__file__).resolve().parents[2]


def anthropic_section() -> str:
    """The README's Anthropic section."""
    readme = (ROOT / "README.md").read_text()
    return readme[readme.index("## Anthropic: the Messages API") :].split("\n## ", 1)[0]


def block(language: str) -> str:
    match = re.search(rf"```{language}\n(.*?)```", anthropic_section(), re.DOTALL)
    assert match is not None, language
    return match.group(1)


async def test_the_anthropic_sdk_reaches_v1_messages_with_the_readmes_base_url() -> None:
    bash = block("bash")
    serve = re.search(r"^compaction-proxy serve --upstream https://api\.anthropic\.com --port (\d+)$", bash, re.M)
    export = re.search(r"^export ANTHROPIC_BASE_URL=(\S+)$", bash, re.MULTILINE)
    assert serve is not None and export is not None
    origin = f"http://127.0.0.1:{serve.group(1)}"
    assert export.group(1) == origin  # the origin: the SDK appends /v1/messages itself
    script = Path(sys.executable).with_name("compaction-proxy")
    async with AnthropicUpstream() as upstream:
        proxy = ProcessProxy(None, command=[str(script), "serve", "--upstream", upstream.base_url], port=0)
        async with proxy:
            environment = {
                **os.environ,
                "ANTHROPIC_BASE_URL": export.group(1).replace(origin, proxy.url),
                "ANTHROPIC_API_KEY": "sk-ant-readme",
            }
            printed = await run([sys.executable, "-c", block("python")], environment)
            # What the README warns of: with the OpenAI-style /v1 the SDK asks for /v1/v1/messages.
            doubled = {**environment, "ANTHROPIC_BASE_URL": proxy.url + "/v1"}
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-c", block("python"), env=doubled, stderr=asyncio.subprocess.DEVNULL
            )
            assert await process.wait() != 0
            line = await proxy.wait_for_log(lambda record: record.get("path") == "/v1/v1/messages")
    headers, answer = printed.strip().splitlines()
    assert "'x-compaction': 'unchanged'" in headers and "'x-compaction-tokens-before':" in headers
    assert answer
    assert upstream.targets == ["/v1/messages"]
    assert line["upstream_status"] == 404  # forwarded as it came, refused upstream


def test_the_set_up_table_gives_each_sdk_its_base_url() -> None:
    readme = (ROOT / "README.md").read_text()
    rows = {row.split("|")[2].strip(): row.split("|")[3] for row in readme.splitlines() if row.startswith("| ")}
    assert "`http://127.0.0.1:8080/v1`" in rows["`OPENAI_BASE_URL`"]
    assert "`http://127.0.0.1:8080`" in rows["`ANTHROPIC_BASE_URL`"]
