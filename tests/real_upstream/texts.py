"""Deterministic conversation material for the real-upstream tier.

Sensor logs are mostly numbers: SmolLM2's tokenizer spells numbers digit by digit where tiktoken's o200k_base takes
up to three digits per token, so the proxy's local (tiktoken) counts fall far short of the server's until it
calibrates. That is the situation self-calibration exists for: a provider whose tokenizer is not the local one.
"""

from __future__ import annotations

SYSTEM_PROMPT = "You are a terse plant operator. Answer in one short sentence."


def sensor_log(batch: int, readings: int = 12) -> str:
    """A batch of sensor readings: numbers, times and short labels, about 25 bytes a reading."""
    rows = []
    for n in range(readings):
        seed = (batch * 7919 + n * 104729) % 1_000_003
        rows.append(
            f"s{n:02d} t={(seed % 86400) // 3600:02d}:{(seed % 3600) // 60:02d} v={seed % 100000}.{seed % 97:02d}"
        )
    return f"Batch {batch} readings: " + "; ".join(rows) + "."


def user_turn(batch: int, readings: int = 12) -> str:
    """A user message carrying one batch of readings and a short question about it."""
    return f"{sensor_log(batch, readings)} Which sensor reads highest in batch {batch}?"


def prose(paragraph: int, sentences: int = 12) -> str:
    """English prose, tokenized much alike by tiktoken and SmolLM2 (for tests about something else than counts)."""
    topics = ("the pump", "the valve", "the boiler", "the conveyor", "the cooling tower", "the generator")
    parts = []
    for n in range(sentences):
        topic = topics[(paragraph + n) % len(topics)]
        parts.append(
            f"During shift {paragraph}, the inspector noted that {topic} was running smoothly after the morning "
            f"check, although the night crew had reported some unusual noise near section {n}."
        )
    return " ".join(parts)
