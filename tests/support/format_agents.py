"""Each format's tool-using agent behind one interface, so a long-run test is written once for every format.

A `FormatAgent` puts its model on the format's fake upstream (answering the proxy's summary calls with a summary the
test chooses), runs its client (the official SDK of the format) through a proxy for a number of turns, streamed where
told, and reads what the upstream billed. The agents themselves live in `agent_run` (chat completions),
`responses_agent` and `anthropic_agent`; each outgrows `window` within a few dozen turns.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Final

import openai
from anthropic import AsyncAnthropic

from proxy.pipeline.summary_text import IN_CONTEXT_PREAMBLE
from proxy.simulator.anthropic_upstream import AnthropicUpstream, tool_loop_responder
from proxy.simulator.openai_upstream import OpenAIUpstream, Reply
from proxy.simulator.responses_api import ResponsesReply, responses_tool_loop_responder
from tests.support import agent_run, anthropic_agent, responses_agent
from tests.support.proxies import RunningProxy
from tests.support.wire_formats import CHAT_COMPLETIONS, MESSAGES, RESPONSES, FormatCase, Upstream

Streamed = Callable[[int], bool]
"""Whether the turn of this index is streamed."""

SUMMARY_MARK: Final = IN_CONTEXT_PREAMBLE.split(":", 1)[0]


def is_summary_request(wire: FormatCase, body: Mapping[str, Any]) -> bool:
    """Whether a body the upstream received is the proxy's summary call: its last entry is the instruction."""
    last = body[wire.entries][-1]
    return last.get("role") == "user" and str(last.get("content", "")).startswith(SUMMARY_MARK)


def answering_summaries(wire: FormatCase, agent: Callable[[Any], Any], summary: Any) -> Callable[[Any], Any]:
    """A responder that answers the proxy's summary calls with `summary`, and the agent's turns as `agent` does."""

    def respond(body: Any) -> Any:
        return summary if is_summary_request(wire, body) else agent(body)

    return respond


class FormatAgent:
    """One format's agent (see the module docstring)."""

    wire: FormatCase
    window: int
    """A window the run outgrows within a few dozen turns."""
    tools: list[Any]
    """The client's tools, as the format declares them."""
    cached_share: float
    """The share of prompt tokens a 200-turn run through the proxy reads from the provider's cache, at least."""
    compactions_share: float
    """The share of a 200-turn run's turns compacted, at most."""

    def install(self, upstream: Upstream, summary: str) -> None:
        """Put the agent's model on `upstream`, answering the proxy's summary calls with `summary`."""
        raise NotImplementedError

    async def run(self, proxy: RunningProxy, turns: int, streamed: Streamed) -> list[str]:
        """`turns` model calls through `proxy`: each one's `X-Compaction` header."""
        raise NotImplementedError

    def cached_tokens(self, upstream: Upstream) -> list[int]:
        """The prompt tokens the upstream served from its cache, request by request."""
        raise NotImplementedError


class ChatAgent(FormatAgent):
    wire = CHAT_COMPLETIONS
    window = 4096
    tools = agent_run.TOOLS
    cached_share = 0.5
    compactions_share = 1 / 4
    steps: Final = 20

    def install(self, upstream: Upstream, summary: str) -> None:
        assert isinstance(upstream, OpenAIUpstream)
        upstream.responder = answering_summaries(self.wire, agent_run.agent_responder(), Reply(content=summary))

    async def run(self, proxy: RunningProxy, turns: int, streamed: Streamed) -> list[str]:
        async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-test", max_retries=0) as client:
            done = 0

            async def turn(messages: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
                nonlocal done
                stream, done = streamed(done), done + 1
                raw = await client.chat.completions.with_raw_response.create(
                    model=self.wire.model,
                    messages=messages,  # type: ignore[arg-type]
                    tools=self.tools,  # type: ignore[arg-type]
                    stream=stream,
                )
                parsed: Any = raw.parse()  # a completion or its chunks: `stream` is not a literal, the SDK cannot tell
                if stream:
                    message = await agent_run.collect_stream(parsed)
                else:
                    message = parsed.choices[0].message.model_dump(exclude_none=True)
                return message, raw.headers.get("x-compaction", "")

            # Every task takes `steps + 1` turns: `steps` tool rounds and the answer.
            return await agent_run.run_agent(turn, math.ceil(turns / (self.steps + 1)), self.steps, turns=turns)

    def cached_tokens(self, upstream: Upstream) -> list[int]:
        assert isinstance(upstream, OpenAIUpstream)
        return [usage["prompt_tokens_details"]["cached_tokens"] for usage in upstream.usages]


class ResponsesAgent(FormatAgent):
    wire = RESPONSES
    window = 32_000
    tools = responses_agent.TOOLS
    cached_share = 0.8
    compactions_share = 1 / 10

    def install(self, upstream: Upstream, summary: str) -> None:
        assert isinstance(upstream, OpenAIUpstream)
        agent = responses_tool_loop_responder("read_file", steps=20, arguments=lambda step, _k: {"path": f"f{step}"})
        upstream.responses_responder = answering_summaries(self.wire, agent, ResponsesReply(text=summary))

    async def run(self, proxy: RunningProxy, turns: int, streamed: Streamed) -> list[str]:
        async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-test", max_retries=0) as client:
            return await responses_agent.run_agent(client, turns, streamed)

    def cached_tokens(self, upstream: Upstream) -> list[int]:
        assert isinstance(upstream, OpenAIUpstream)
        return [usage["input_tokens_details"]["cached_tokens"] for usage in upstream.responses_usages]


class MessagesAgent(FormatAgent):
    wire = MESSAGES
    window = 32_000
    tools = anthropic_agent.TOOLS
    cached_share = 0.8
    compactions_share = 1 / 10

    def install(self, upstream: Upstream, summary: str) -> None:
        assert isinstance(upstream, AnthropicUpstream)
        agent = tool_loop_responder("search", steps=2, words=60)
        upstream.responder = answering_summaries(self.wire, agent, [{"type": "text", "text": summary}])

    async def run(self, proxy: RunningProxy, turns: int, streamed: Streamed) -> list[str]:
        base_url = f"http://127.0.0.1:{proxy.server.port}"
        async with AsyncAnthropic(base_url=base_url, api_key="sk-ant-test", max_retries=0) as client:
            return (await anthropic_agent.run_agent(client, self.wire.model, turns, streamed)).decisions

    def cached_tokens(self, upstream: Upstream) -> list[int]:
        assert isinstance(upstream, AnthropicUpstream)
        return [usage["cache_read_input_tokens"] for usage in upstream.usages]


AGENTS: Final[dict[FormatCase, FormatAgent]] = {
    agent.wire: agent for agent in (ChatAgent(), ResponsesAgent(), MessagesAgent())
}
"""Each format's agent, by its case."""
