"""Haystack Agents finish a long conversation at llama-server's small window: through the proxy, and with our hook.

One Agent's `OpenAIChatGenerator` points at the real proxy; the other talks to llama-server directly with our
`CompactionHook` (sliding window, the server's window) in process. Each gets many user turns with bulky readings and
a tool returning more of them; whether the tiny model calls the tool properly or not, `max_agent_steps` bounds every
run, so the point is only that no request ever overflows the server's window.
"""

from __future__ import annotations

import openai
import pytest
from haystack.components.agents import Agent
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.hooks.protocol import Hook
from haystack.tools import Tool
from haystack.utils import Secret

from hooks.compaction import CompactionHook, SlidingWindowCompactor
from tests.real_upstream.conftest import MODEL, N_CTX, LlamaServer, Proxies
from tests.real_upstream.texts import SYSTEM_PROMPT, sensor_log, user_turn

pytestmark = pytest.mark.real_upstream

API_KEY_VAR = "REAL_UPSTREAM_TEST_OPENAI_KEY"
TURNS = 12
MAX_AGENT_STEPS = 3
GENERATION = {"max_tokens": 24, "temperature": 0}


def read_batch(batch: int) -> str:
    """The full readings of a batch (a bulky tool result)."""
    return sensor_log(int(batch), readings=10)


READ_BATCH = Tool(
    name="read_batch",
    description="Read the readings of a batch.",
    parameters={"type": "object", "properties": {"batch": {"type": "integer"}}, "required": ["batch"]},
    function=read_batch,
)


@pytest.fixture(autouse=True)
def _api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A key from the environment for the generators (llama-server ignores it)."""
    monkeypatch.setenv(API_KEY_VAR, "sk-local")


def agent_at(base_url: str, hooks: dict[str, list[Hook]] | None = None) -> Agent:
    """An Agent with the `read_batch` tool, its generator at `base_url`, each run bounded in steps."""
    generator = OpenAIChatGenerator(
        api_key=Secret.from_env_var(API_KEY_VAR),
        model=MODEL,
        api_base_url=base_url,
        generation_kwargs=GENERATION,
        max_retries=0,
        timeout=120,
    )
    return Agent(chat_generator=generator, tools=[READ_BATCH], hooks=hooks or {}, max_agent_steps=MAX_AGENT_STEPS)


def earlier_lookup(batch: int) -> list[ChatMessage]:
    """A tool exchange as if the Agent had looked a batch up earlier: the call and its bulky result, a pair."""
    call = ToolCall(tool_name=READ_BATCH.name, arguments={"batch": batch}, id=f"call_{batch}")
    return [ChatMessage.from_assistant(tool_calls=[call]), ChatMessage.from_tool(read_batch(batch), origin=call)]


def text_of(message: ChatMessage) -> str:
    """A message's text, or its tool result."""
    result = message.tool_call_result
    return message.text or (result.result if result is not None else "")


async def converse(agent: Agent, llama_server: LlamaServer) -> tuple[int, list[int]]:
    """Run `TURNS` user turns, the client keeping the history the Agent hands back.

    Every third turn also carries an earlier tool exchange: SmolLM2's chat template has no tools, so the model never
    calls one itself, but the server still gets tool calls and results, which compaction must keep in pairs.

    :returns: How many server tokens of text the conversation added up to, and each reply's prompt size.
    """
    agent.warm_up()
    messages = [ChatMessage.from_system(SYSTEM_PROMPT)]
    texts: list[str] = []
    prompt_sizes: list[int] = []
    for batch in range(TURNS):
        new = earlier_lookup(batch + 100) if batch % 3 == 2 else []
        new.append(ChatMessage.from_user(user_turn(batch)))
        try:
            result = await agent.run_async(messages=[*messages, *new])
        except openai.BadRequestError as error:
            pytest.fail(f"turn {batch} of {TURNS} overflowed the server's window: {error}", pytrace=False)
        messages = result["messages"]
        last_user = max(index for index, message in enumerate(messages) if message.is_from("user"))
        replies = messages[last_user + 1 :]
        assert replies, f"the Agent did not answer turn {batch}"
        texts += [text_of(message) for message in [*new, *replies]]
        prompt_sizes += [
            int(message.meta["usage"]["prompt_tokens"])
            for message in replies
            if message.is_from("assistant") and (message.meta.get("usage") or {}).get("prompt_tokens")
        ]
    return sum(len(llama_server.tokenize(text)) for text in texts if text), prompt_sizes


async def test_agent_through_the_proxy(proxies: Proxies, llama_server: LlamaServer) -> None:
    """The Agent, knowing nothing of compaction, finishes every turn: the proxy keeps each request in the window."""
    base_url, _service = await proxies.start()
    size, prompt_sizes = await converse(agent_at(base_url), llama_server)
    print(f"\nreal_upstream agent via proxy: conversation {size} tokens, prompts {prompt_sizes}")
    assert size > 2 * N_CTX
    assert len(prompt_sizes) >= TURNS
    assert max(prompt_sizes) < N_CTX


async def test_agent_with_the_hook(llama_server: LlamaServer) -> None:
    """The Agent with our hook in process, talking to llama-server directly, finishes every turn too."""
    hook = CompactionHook(SlidingWindowCompactor(), context_window=N_CTX)
    agent = agent_at(llama_server.base_url + "/v1", {"before_llm": [hook]})
    size, prompt_sizes = await converse(agent, llama_server)
    print(f"\nreal_upstream agent with hook: conversation {size} tokens, prompts {prompt_sizes}")
    assert size > 2 * N_CTX
    assert len(prompt_sizes) >= TURNS
    assert max(prompt_sizes) < N_CTX
