"""What an end-to-end test needs to know of a wire format (`FormatCase`), and what an answer gave the client."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import aiohttp
import orjson

from proxy.simulator.anthropic_upstream import AnthropicUpstream
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.support.proxies import RunningProxy

Upstream = OpenAIUpstream | AnthropicUpstream
"""A fake upstream serving one of the formats."""

SYSTEM: Final = "You are terse."
PARAGRAPH: Final = "The deploy failed because the migration locked the orders table for eleven minutes. "
"""About 16 tokens: a turn of `conversation(turns, paragraphs)` holds three times `paragraphs` of them."""
QUESTION: Final = "What went wrong, in one line?"
TOOL: Final = "lookup"


@dataclass(frozen=True)
class Answer:
    """What an answer gave the client: its text, the tools it calls, its prompt tokens (None if not reported), and
    the kinds of its parts in the format's words (`FormatCase.text_part` for each text)."""

    text: str
    calls: list[str]
    prompt_tokens: int | None
    parts: list[str]


def sse_data(raw: bytes) -> list[dict[str, Any]]:
    """The JSON `data` of each event of a server-sent event stream (`[DONE]` left out)."""
    lines = (line for frame in raw.split(b"\n\n") for line in frame.split(b"\n"))
    return [orjson.loads(line[6:]) for line in lines if line.startswith(b"data: ") and line != b"data: [DONE]"]


class FormatCase:
    """What an end-to-end test needs to know of one wire format (see the module docstring)."""

    name: str = ""
    """The format's name, as the proxy's metrics label it (`api`) and as the test's id."""
    path: str = ""
    model: str = ""
    upstream_fixture: str = ""
    """The conftest fixture that starts this format's fake upstream."""
    entries: str = ""
    """The body's key that holds the conversation."""
    text_part: str = ""
    """What the format calls the part of an answer that holds its text (see `Answer.parts`)."""
    no_tools: ClassVar[Any] = "none"
    """The `tool_choice` that lets the model call no tool."""
    moving_breakpoints: bool = False
    """Whether the client marks cache breakpoints in the body and moves them as the conversation grows (Anthropic's
    `cache_control`): a call that repeats a forwarded request's entries then repeats them, not their bytes."""
    overflow_states_window: bool = True
    """Whether the upstream's overflow error says how large the window is (the Responses API's does not: the proxy
    learns an estimate from it)."""

    def __repr__(self) -> str:
        return self.name

    def comparable_entries(self, entries: Sequence[Any]) -> list[Any]:
        """Entries as a call that repeats them must repeat them: as they are, where breakpoints do not move."""
        return list(entries)

    def credentials(self, key: str) -> dict[str, str]:
        """The headers a client of this format sends its API key in (and whatever else the API requires)."""
        return {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def conversation(self, turns: int, paragraphs: int = 8, model: str = "", tools: bool = True) -> dict[str, Any]:
        """A request: a system prompt, `turns` turns and a last question.

        A turn is a question, a call of the `lookup` tool, its result and an answer, each `paragraphs` long (about 16
        tokens each); without `tools`, a question and an answer only, and no tool offered.
        """
        raise NotImplementedError

    def tool_conversation(self, task: str, results: Sequence[tuple[str, str]], question: str) -> dict[str, Any]:
        """A request: a system prompt, the `task`, one call of each tool named in `results` answered with its text
        (in order), and the `question`; the request offers those tools."""
        raise NotImplementedError

    def next_turn(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The conversation's next request: the model's short answer and one more question appended."""
        raise NotImplementedError

    def use_reading_model(self, upstream: Upstream) -> None:
        """Make the upstream's model of this format read offloaded results back (`tests.support.reading_model`)."""
        raise NotImplementedError

    def reply_text(self, answer: Mapping[str, Any]) -> str:
        """The text of a JSON answer."""
        return self.read(answer).text

    def read(self, answer: Mapping[str, Any] | bytes) -> Answer:
        """What a JSON answer, or a streamed one (its bytes), gave the client."""
        raise NotImplementedError

    def read_result(self, text: str) -> dict[str, Any]:
        """The entry the proxy appends with the text its read tool's first call (by the reading model) returned."""
        raise NotImplementedError

    def entries_of(self, raw: bytes) -> list[Any]:
        """The conversation of a body (its `entries`)."""
        conversation: list[Any] = orjson.loads(raw)[self.entries]
        return conversation

    def entries_bytes(self, raw: bytes) -> bytes:
        """The exact bytes of the conversation (the `entries` array) inside a body."""
        text = raw.decode()
        start = text.index("[", text.index(f'"{self.entries}"'))
        _value, end = json.JSONDecoder().raw_decode(text, start)
        return raw[start:end] if text.isascii() else text[start:end].encode()

    def tool_names(self, raw: bytes) -> list[str]:
        """The names of the tools a forwarded body offers."""
        return [tool.get("name") or tool["function"]["name"] for tool in orjson.loads(raw).get("tools") or ()]

    def prompt_tokens(self, answer: Mapping[str, Any]) -> int:
        """The prompt tokens a JSON answer reports (cached or not)."""
        raise NotImplementedError

    def forwarded(self, upstream: Upstream) -> list[bytes]:
        """The bodies of this format's requests the upstream received, byte for byte, in order (rejected ones too)."""
        raise NotImplementedError

    def streamed(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """`body` asked to be streamed, with its usage."""
        return {**body, "stream": True}

    def upstream_prompt_tokens(self, upstream: Upstream) -> list[int]:
        """The prompt tokens of each request of this format the upstream answered."""
        raise NotImplementedError

    def forwarded_headers(self, upstream: Upstream) -> list[dict[str, str]]:
        """The headers of each request of this format the upstream received, names in lower case."""
        raise NotImplementedError

    def url(self, proxy: RunningProxy) -> str:
        """Where a client of this format posts through `proxy`."""
        return f"http://127.0.0.1:{proxy.server.port}{self.path}"

    async def post(
        self, proxy: RunningProxy, body: Mapping[str, Any] | bytes, key: str = "sk-alice", **headers: str
    ) -> tuple[int, dict[str, str], Any]:
        """POST `body` (bytes as they are) through `proxy` with plain aiohttp: the status, headers and parsed answer.

        A streamed answer is read whole and returned as its bytes.
        """
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with (
            aiohttp.ClientSession() as http,
            http.post(self.url(proxy), data=data, headers={**self.credentials(key), **headers}) as response,
        ):
            raw = await response.read()
            streamed = response.content_type == "text/event-stream"
            return response.status, dict(response.headers), raw if streamed else json.loads(raw)
