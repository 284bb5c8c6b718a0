"""The `openai` SDK through the real proxy to llama-server: a conversation far past the window never overflows.

llama-server counts with SmolLM2's tokenizer, the proxy locally with tiktoken; the proxy's estimate (its response
headers) is compared turn by turn with the server's reported `prompt_tokens`. Uncalibrated, the first request is far
off; once the proxy has learned the ratio from reported usage, it must be within 5%. Between compactions the server's
`cached_tokens` shows it reusing the prefix the proxy forwards unchanged turn after turn.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass
from typing import Any

import openai
import pytest

from tests.real_upstream.conftest import MODEL, N_CTX, LlamaServer, Proxies
from tests.real_upstream.texts import SYSTEM_PROMPT, sensor_log, user_turn

pytestmark = pytest.mark.real_upstream

TURNS = 32
"""Turns alternate between non-streaming and streaming requests, one conversation for both."""
MAX_TOKENS = 16
FIRST_READINGS = 60
"""The first message is big enough (in bytes) that the proxy really counts it instead of bounding it by its bytes."""
READINGS = 6
"""Readings per later user turn (about 140 server tokens): 32 turns are about 2.5 windows."""
CALIBRATION_TURNS = 3
"""Turns after which the proxy must have calibrated (it learns from every usage report)."""
FIRST_ERROR_AT_LEAST = 0.25
CALIBRATED_ERROR_BELOW = 0.05


@dataclass
class Turn:
    """One request of the conversation, as the client saw it.

    :param stream: Whether it was a streaming request.
    :param compaction: The proxy's `X-Compaction` header.
    :param estimate: The proxy's estimate of the prompt it forwarded, or None when it only bounded it.
    :param prompt_tokens: The server's count of that prompt.
    :param cached_tokens: How many of them the server reused from its KV cache.
    """

    stream: bool
    compaction: str
    estimate: int | None
    prompt_tokens: int
    cached_tokens: int | None

    @property
    def error(self) -> float | None:
        """The estimate's relative error against the server's count."""
        return None if self.estimate is None else (self.estimate - self.prompt_tokens) / self.prompt_tokens


def proxy_estimate(headers: Any) -> int | None:
    """The proxy's estimate of what it forwarded: its size after compacting, or before when it did not compact.

    None when it made none, or only an upper bound (`X-Compaction-Tokens-Before-Bound`).
    """
    compacted = headers.get("X-Compaction") == "compacted"
    value = headers.get("X-Compaction-Tokens-After" if compacted else "X-Compaction-Tokens-Before")
    if value is None or (not compacted and headers.get("X-Compaction-Tokens-Before-Bound") == "true"):
        return None
    return int(value)


def cached(usage: Any) -> int | None:
    """`usage.prompt_tokens_details.cached_tokens`, when the server reported it."""
    details = getattr(usage, "prompt_tokens_details", None)
    return getattr(details, "cached_tokens", None) if details is not None else None


async def ask(client: openai.AsyncOpenAI, messages: list[dict[str, Any]], stream: bool) -> tuple[str, Turn]:
    """One chat completion through the proxy: the reply text and what the turn measured."""
    options: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0}
    if stream:
        raw = await client.chat.completions.with_raw_response.create(
            **options, stream=True, stream_options={"include_usage": True}
        )
        parts: list[str] = []
        usage = None
        async for chunk in raw.parse():
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                parts.append(choice.delta.content or "")
        text = "".join(parts)
    else:
        raw = await client.chat.completions.with_raw_response.create(**options)
        completion = raw.parse()
        usage = completion.usage
        text = completion.choices[0].message.content or ""
    assert raw.status_code == 200
    assert usage is not None, "the server reported no usage"
    compaction = raw.headers.get("X-Compaction", "")
    turn = Turn(stream, compaction, proxy_estimate(raw.headers), usage.prompt_tokens, cached(usage))
    return text, turn


def report(label: str, turns: list[Turn]) -> dict[str, Any]:
    """The figures of a run: per-turn estimate errors and the server's prefix reuse between compactions."""
    between = [
        (turn, previous)
        for previous, turn in itertools.pairwise(turns)
        if turn.compaction != "compacted" and turn.cached_tokens is not None
    ]
    reused = sum(turn.cached_tokens or 0 for turn, _ in between)
    prompted = sum(turn.prompt_tokens for turn, _ in between)
    summary = {
        "run": label,
        "turns": [{**asdict(turn), "error": turn.error} for turn in turns],
        "compactions": sum(turn.compaction == "compacted" for turn in turns),
        "cached_share_between_compactions": reused / prompted if prompted else None,
        "cached_share_all": sum(t.cached_tokens or 0 for t in turns) / sum(t.prompt_tokens for t in turns),
    }
    print(f"\nreal_upstream {label}: {json.dumps(summary)}")
    return summary


async def test_conversation_far_past_the_window(
    proxies: Proxies, llama_server: LlamaServer, record_property: Any
) -> None:
    """32 turns, streamed and not, growing past the window: all succeed, estimates calibrate, prefixes are reused.

    Offloading is off: it would add the read tool, which the proxy counts on the safe side (the larger of two
    renderings) and which SmolLM2's chat template renders its own way, so a compaction's fresh count would measure the
    tool's rendering, not the calibration of the messages that this test is about.
    """
    base_url, _service = await proxies.start(offload=False)
    client = openai.AsyncOpenAI(api_key="sk-local", base_url=base_url, max_retries=0, timeout=120)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"{sensor_log(0, FIRST_READINGS)} Acknowledge the baseline."},
    ]
    turns: list[Turn] = []
    try:
        for batch in range(1, TURNS + 1):
            reply, turn = await ask(client, messages, stream=batch % 2 == 0)
            turns.append(turn)
            messages += [
                {"role": "assistant", "content": reply},
                {"role": "user", "content": user_turn(batch, READINGS)},
            ]
    finally:
        await client.close()
    summary = report("sdk-conversation", turns)
    record_property("real_upstream", summary)

    # The conversation the client holds is several windows long, so the proxy had to compact, repeatedly.
    history = sum(len(llama_server.tokenize(str(message["content"]))) for message in messages)
    assert history > 2 * N_CTX
    assert summary["compactions"] >= 3
    assert all(turn.prompt_tokens < N_CTX for turn in turns)

    # Uncalibrated, the local tokenizer is far off the server's; calibrated, within 5%.
    first = turns[0]
    assert first.error is not None, "the first request was only bounded, not counted"
    assert abs(first.error) >= FIRST_ERROR_AT_LEAST, f"first-request error {first.error:.1%} is not large"
    # Well under the trigger the proxy only bounds a request by its bytes; the turns it really estimates are those
    # nearing the trigger and those it compacts, both streamed and not.
    calibrated = list(enumerate(turns))[CALIBRATION_TURNS:]
    measured = [(index, turn) for index, turn in calibrated if turn.error is not None]
    off = [(index, f"{turn.error:.1%}") for index, turn in measured if abs(turn.error or 0) >= CALIBRATED_ERROR_BELOW]
    assert not off, f"estimate errors of 5% or more once calibrated (turn, error): {off}"
    assert len(measured) >= 6, f"only {len(measured)} turns were estimated rather than bounded"
    assert {turn.stream for _, turn in measured} == {False, True}

    # Between compactions the forwarded prefix is unchanged, and the server reuses it from its KV cache.
    for index in range(1, len(turns)):
        turn, previous = turns[index], turns[index - 1]
        if turn.compaction == "compacted":
            continue
        assert turn.cached_tokens is not None, "the server reported no cached_tokens"
        assert turn.cached_tokens >= 0.9 * previous.prompt_tokens, f"turn {index} reused too little of its prefix"
