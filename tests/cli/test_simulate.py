"""`compaction-proxy simulate` serves the simulated model alone, and `serve --upstream` in front of it just works."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

from tests.support.process_proxy import ProcessProxy

SCRIPT = Path(sys.executable).with_name("compaction-proxy")  # the console script `pip install` made
TOOLS: Any = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]


async def test_the_proxy_serves_an_agent_from_the_simulated_model() -> None:
    model = await asyncio.create_subprocess_exec(
        str(SCRIPT), "simulate", "--port", "0", "--window", "4000", stdout=asyncio.subprocess.PIPE
    )
    try:
        assert model.stdout is not None
        announced = (await asyncio.wait_for(model.stdout.readline(), timeout=30)).decode()
        match = re.search(r"listening on (http://127\.0\.0\.1:\d+) .* 4,000-token window", announced)
        assert match is not None, announced
        upstream = match.group(1)
        assert f"compaction-proxy serve --upstream {upstream}" in announced
        serve = [str(SCRIPT), "serve", "--upstream", upstream]
        async with (
            ProcessProxy(None, command=serve, port=0) as proxy,
            AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-any", max_retries=0) as client,
        ):
            raw = await client.chat.completions.with_raw_response.create(
                model="gpt-4.1-mini", messages=[{"role": "user", "content": "Read it."}], tools=TOOLS
            )
        assert raw.headers["x-compaction"] == "unchanged"
        completion = raw.parse()
        (call,) = completion.choices[0].message.tool_calls or []
        assert call.function.name == "read_file" and json.loads(call.function.arguments) == {}
        assert completion.usage is not None and completion.usage.prompt_tokens > 0
    finally:
        model.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(model.wait(), timeout=30) == 0


async def test_a_port_in_use_is_one_line_and_status_1() -> None:
    taken = await asyncio.start_server(lambda _reader, _writer: None, "127.0.0.1", 0)
    port = taken.sockets[0].getsockname()[1]
    try:
        process = await asyncio.create_subprocess_exec(
            str(SCRIPT), "simulate", "--port", str(port), stderr=asyncio.subprocess.PIPE
        )
        _, stderr = await asyncio.wait_for(process.communicate(), timeout=30)
    finally:
        taken.close()
    assert process.returncode == 1
    assert stderr.decode().splitlines() == [
        f"compaction-proxy: error: cannot listen on 127.0.0.1:{port}: address already in use; pick another port with"
        " --port (0: a free one)"
    ]
