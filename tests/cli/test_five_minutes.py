"""The README's five-minute path runs as written: `compaction-proxy serve`, then its `openai` snippet and its curl
command show the `X-Compaction*` headers of an answer that went through the proxy.

The proxy is the console script `pip install` made, in its own process; only its upstream (the OpenAI-like one on
loopback instead of api.openai.com) and its port (a free one) differ from the README's command.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.support.process_proxy import ProcessProxy

ROOT = Path(__file__).resolve().parents[2]


def section(heading: str) -> str:
    """The README's section under `heading` (`## ...`), up to the next one."""
    readme = (ROOT / "README.md").read_text()
    return readme[readme.index(heading) :].split("\n## ", 1)[0]


def five_minutes() -> str:
    """The README's "Five minutes" section."""
    return section("## Five minutes")


def block(language: str, heading: str = "## Five minutes") -> str:
    """The first fenced block of `language` in the section under `heading`."""
    match = re.search(rf"```{language}\n(.*?)```", section(heading), re.DOTALL)
    assert match is not None, language
    return match.group(1)


async def run(command: list[str], environment: dict[str, str]) -> str:
    """Run `command`; its standard output, once it exits 0."""
    process = await asyncio.create_subprocess_exec(
        *command, env=environment, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode == 0, stderr.decode()
    return stdout.decode()


async def test_the_snippet_and_the_curl_command_show_the_headers() -> None:
    bash = block("bash")
    # The package itself, in a venv of its own: not the contributor set, not a name the package index lacks.
    assert "python3 -m venv .venv" in bash and re.search(r"^pip install \.\s", bash, re.MULTILINE)
    assert re.search(r"^compaction-proxy serve\b", bash, re.MULTILINE)
    script = Path(sys.executable).with_name("compaction-proxy")
    async with OpenAIUpstream() as upstream:
        proxy = ProcessProxy(None, command=[str(script), "serve", "--upstream", upstream.base_url], port=0)
        async with proxy:
            export = re.search(r"^export OPENAI_BASE_URL=(\S+)$", five_minutes(), re.MULTILINE)
            assert export is not None and export.group(1) == "http://127.0.0.1:8080/v1"  # with /v1, as the SDK wants
            environment = {
                **os.environ,
                "OPENAI_BASE_URL": export.group(1).replace("http://127.0.0.1:8080", proxy.url),
                "OPENAI_API_KEY": "sk-five-minutes",
            }
            printed = await run([sys.executable, "-c", block("python")], environment)
            headers, answer = printed.strip().splitlines()
            assert "'x-compaction': 'unchanged'" in headers and "'x-compaction-tokens-before':" in headers
            assert answer  # the completion's text, parsed from the same raw response

            if shutil.which("curl") is None:
                pytest.skip("curl is not installed: apt-get install curl")
            curl = next(
                block for block in re.findall(r"```bash\n(.*?)```", five_minutes(), re.DOTALL) if "curl" in block
            )
            curl = curl.replace("http://127.0.0.1:8080", proxy.url).replace("\\\n", " ")
            shown = await run(["bash", "-c", curl], environment)
    lines = shown.strip().splitlines()
    assert lines and all(line.lower().startswith("x-compaction") for line in lines)
    documented = block("text").strip().splitlines()
    assert {line.split(":")[0] for line in lines} == {line.split(":")[0] for line in documented}


def test_ci_runs_the_contributor_commands_the_readme_gives() -> None:
    readme = (ROOT / "README.md").read_text()
    installing = readme[readme.index("## Installing") :].split("\n## ", 1)[0]
    match = re.search(r"```bash\n\s*(pip install .*?)\n\s*(python -m pytest .*?)\n", installing)
    assert match is not None
    install, test = match.groups()
    ci = (ROOT / ".ci" / "run").read_text()
    assert install.replace("pip install", "python -m pip install --quiet") in ci
    assert ci.rstrip().endswith(test)
