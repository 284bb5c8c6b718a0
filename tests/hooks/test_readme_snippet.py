"""The README's Haystack snippet runs as written, in its own process, against the OpenAI-like upstream on loopback."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

from proxy.simulator.openai_upstream import OpenAIUpstream, tool_loop_responder

ROOT = Path(__file__).resolve().parents[2]


def readme_snippet() -> str:
    """The Python block of the README's Haystack section."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Haystack: the in-process hook") :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None
    return match.group(1)


async def test_the_readme_haystack_snippet_runs_as_written() -> None:
    async with OpenAIUpstream(tool_loop_responder(tool_name="search", steps=2, final_text="rotate them")) as upstream:
        # The user's environment: the OpenAI SDK reads its base URL and key from it; nothing in the snippet changes.
        environment = {
            **os.environ,
            "OPENAI_BASE_URL": upstream.base_url + "/v1",
            "OPENAI_API_KEY": "sk-readme",
            "PYTHONPATH": str(ROOT),
            "HAYSTACK_TELEMETRY_ENABLED": "False",
        }
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            readme_snippet(),
            cwd=ROOT,
            env=environment,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode == 0, stderr.decode()
    assert stdout.decode().strip() == "rotate them"
    chats = [request for request in upstream.requests if request.path.endswith("/chat/completions")]
    assert len(chats) == 3  # two rounds of tool calls, then the answer
    assert chats[-1].json["tools"][0]["function"]["name"] == "search"
