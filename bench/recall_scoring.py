"""What one run of `bench.recall` kept and what it cost, from what the fake upstream was sent and billed.

- **Facts in context**: a planted fact counts when its whole sentence is in the last request forwarded (the one asking
  for the report), in any of its texts.
- **Facts readable back**: a fact not in context that an offloaded result held, where that request quotes the
  result's reference and the proxy's store still holds it for the caller: the model can read it back with the
  proxy's read tool.
- **Prefix reuse**: for each forwarded request after the first, the share of its conversation (in bytes of its
  entries, cache breakpoints left out) that opens with the previous request's entries unchanged, averaged.
- **Bill**: the prompt tokens the upstream counted, uncached at 1 and those its simulated prompt cache served at
  `CACHED_PRICES`, output apart (the same in every row: the model's script).
"""

from __future__ import annotations

import itertools
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from bench import billing
from bench.recall_conversations import KINDS, Fact
from proxy.engine.strategies.offload import REFERENCE_PREFIX
from tests.support.wire_formats import FormatCase

CACHED_PRICES: Final = (0.1, 0.25)
"""Prices of a cached input token, as a share of an uncached one."""

REFERENCE: Final = re.compile(re.escape(REFERENCE_PREFIX) + r"[0-9a-f]{32}")


def texts(value: Any) -> Iterable[str]:
    """Every string inside a parsed JSON value, at any depth."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from texts(item)
    elif isinstance(value, list):
        for item in value:
            yield from texts(item)


def references(body: bytes) -> list[str]:
    """The offloaded results a forwarded body quotes, in order of first mention."""
    return list(dict.fromkeys(REFERENCE.findall(body.decode())))


def prefix_reuse(case: FormatCase, bodies: Sequence[bytes]) -> float:
    """The mean share of each request's entries that repeats the previous request's opening entries unchanged."""
    serialized = [[orjson.dumps(entry) for entry in case.comparable_entries(case.entries_of(body))] for body in bodies]
    shares = []
    for before, after in itertools.pairwise(serialized):
        same = sum(1 for _ in itertools.takewhile(lambda pair: pair[0] == pair[1], zip(before, after, strict=False)))
        shares.append(sum(map(len, after[:same])) / max(sum(map(len, after)), 1))
    return statistics.fmean(shares) if shares else 1.0


@dataclass(frozen=True)
class Score:
    """One conversation run through one row: facts by kind (of `KINDS`), tokens and reuse."""

    facts: dict[str, int]
    in_context: dict[str, int]
    readable_back: dict[str, int]
    requests: int
    compactions: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    prefix_reuse: float

    def billed(self, cached_price: float) -> float:
        """The input bill in uncached-token equivalents with cached tokens at `cached_price`."""
        return self.prompt_tokens - self.cached_tokens + cached_price * self.cached_tokens

    def as_dict(self) -> dict[str, Any]:
        """The figures, and the bill at each of `CACHED_PRICES`, for the JSON output."""
        bills = {f"{price:g}x": round(self.billed(price)) for price in CACHED_PRICES}
        return {**self.__dict__, "billed": bills}


def by_kind(facts: Iterable[Fact]) -> dict[str, int]:
    """How many of `facts` there are of each kind."""
    facts = list(facts)
    return {kind: sum(1 for fact in facts if fact.kind == kind) for kind in KINDS}


def score(
    case: FormatCase,
    *,
    facts: Sequence[Fact],
    bodies: Sequence[bytes],
    usages: Sequence[Mapping[str, Any]],
    decisions: Sequence[str],
    offloaded: Iterable[str],
) -> Score:
    """Score a run from the bodies the upstream received, its usages, the proxy's decisions and the offloaded texts.

    :param offloaded: The texts the proxy's store holds for the references the last body quotes.
    """
    last = "\n".join(texts(orjson.loads(bodies[-1])))
    present = [fact for fact in facts if fact.text in last]
    held = "\n".join(offloaded)
    readable = [fact for fact in facts if fact not in present and fact.text in held]
    billed = billing.usage_charge(usages)
    return Score(
        facts=by_kind(facts),
        in_context=by_kind(present),
        readable_back=by_kind(readable),
        requests=len(bodies),
        compactions=sum(decision.startswith("compacted") for decision in decisions),
        prompt_tokens=billed.input,
        cached_tokens=billed.cached,
        output_tokens=billed.output,
        prefix_reuse=prefix_reuse(case, bodies),
    )
