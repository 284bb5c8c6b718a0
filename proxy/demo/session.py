"""The demo's run: the simulated model and the proxy on loopback, the agent through the proxy, then the wait.

The proxy is the one `serve` runs (the same app and compaction pipeline), configured from the same flags,
environment and config file, except that its upstream is the simulated model and the demo's model has the model's
window. The agent's requests go through the proxy as any client's would; the model counts what it was sent, and the
agent counts its own history to show what going direct would send.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TextIO

import aiohttp
from aiohttp import web

from proxy.config import Settings
from proxy.demo.conversations import Conversation, conversation
from proxy.demo.view import Turn, View
from proxy.pipeline.routed import build_pipeline
from proxy.server import create_app
from proxy.simulator.model import Simulator
from proxy.simulator.serving import cannot_listen, until_signalled


class DemoError(Exception):
    """The run could not go on: the message says what happened and what to do."""


@dataclass(frozen=True)
class Plan:
    """What `compaction-proxy demo` was asked to do."""

    settings: Settings
    """The proxy's settings, upstream and port included (the upstream is replaced by the model's URL)."""
    window: int
    turns: int
    wire_format: str
    wait: bool


async def run(plan: Plan, out: TextIO = sys.stdout) -> None:
    """Start the model and the proxy, drive the agent, print the addresses and wait for a signal if asked to."""
    async with Simulator(context_window=plan.window) as model:
        started = conversation(plan.wire_format)
        windows = {**plan.settings.context_windows, started.model: plan.window}
        settings = plan.settings.model_copy(
            update={"upstream": model.base_url, "context_windows": windows, "dashboard": True}
        )
        runner = web.AppRunner(create_app(settings, build_pipeline(settings)), handle_signals=False, access_log=None)
        await runner.setup()
        try:
            try:
                await web.TCPSite(runner, settings.host, settings.port).start()
            except OSError as exc:
                raise DemoError(cannot_listen(settings.host, settings.port, exc)) from None
            host, port = runner.addresses[0][:2]
            base = f"http://{host}:{port}"
            view = View(out, plan.window)
            view.header(plan.wire_format, started.model)
            await _drive(base, started, plan.turns, view)
            view.summary()
            if plan.wait:
                _print_addresses(out, base, plan.window)
                await until_signalled()
        finally:
            await runner.cleanup()


async def _drive(base: str, agent: Conversation, turns: int, view: View) -> None:
    """`turns` model calls of the agent through the proxy at `base`, each shown as it is answered."""
    async with aiohttp.ClientSession() as http:
        for number in range(1, turns + 1):
            body = agent.body()
            async with http.post(base + agent.path, json=body, headers=agent.headers()) as response:
                answer = await response.json(content_type=None)
                headers: Mapping[str, str] = response.headers
                if response.status != 200:
                    raise DemoError(f"turn {number}: the proxy answered {response.status}: {_error_text(answer)}")
            direct = agent.direct_tokens(body)
            read = agent.absorb(answer)
            view.turn(Turn.read(number, read.prompt_tokens, read.cached_tokens, direct, headers))


def _error_text(answer: object) -> str:
    error = answer.get("error") if isinstance(answer, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return str(message or answer)[:300]


def _print_addresses(out: TextIO, base: str, window: int) -> None:
    lines = [
        "",
        "The proxy and the simulated model keep running for your client (any API key; every model has a"
        f" {window:,}-token window):",
        f"  export OPENAI_BASE_URL={base}/v1",
        f"  export ANTHROPIC_BASE_URL={base}",
        f"  dashboard: {base}/dashboard",
        "Ctrl-C stops them.",
    ]
    print("\n".join(lines), file=out, flush=True)
