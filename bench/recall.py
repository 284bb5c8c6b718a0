"""What each way of compacting keeps of an agent's conversation, and what it costs, through the real proxy.

    python -m bench.recall [--quick] [--output FILE]

Generated agent conversations (`bench.recall_conversations`: coding, research and data work, each seeded, each
planting 3 requirements, 2 corrections, 4 tool facts and 2 decisions) run turn by turn through the proxy in front of
the test suite's fake upstreams, in the chat completions, Responses and Messages shapes, at each window (2,048 output
tokens reserved by every request), once per row: the proxy's chains by their settings, and simple baselines
(`bench.recall_baselines`) as chains it is given. Each conversation is `FILL` times its window long. Every figure is
read from what the upstream was sent and billed (`bench.recall_scoring`).

Two seeds of each shape; `--quick` runs one, at the 32k window only, on conversations twice the window long.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final

from bench.recall_baselines import BASELINES
from bench.recall_conversations import KINDS, SHAPES, conversation
from bench.recall_runs import Row, run
from bench.recall_scoring import CACHED_PRICES, Score
from bench.recall_wire import WIRES
from proxy.config import Settings

TODAY: Final = (
    "provider_compaction",
    "duplicate_results",
    "superseded_results",
    "json_minify",
    "tool_result_pruning",
    "sliding_window",
    "middle_out",
)
"""The default chain before the user's words were kept (`main` at 0c46f1f): a row of its own, whatever the default."""

TRIGGER: Final = float(Settings.model_fields["compact_at"].default)
TARGET: Final = float(Settings.model_fields["compact_to"].default)
FILL_TO: Final = TRIGGER / TARGET * 0.95
"""How far above the target drop-oldest truncation fills: a little under the trigger."""

TODAY_ROW: Final = "today's default chain (pinned names), offload on"
DEFAULT_ROW: Final = "default chain, offload on"
SHARES: Final = (0.5, 0.6, 1.0)
"""`user_text_share` values tried besides the default's."""
WINDOWS: Final = (32_768, 65_536)
FILL: Final = 2.5
QUICK_FILL: Final = 2.0
SEEDS: Final = (1, 2)
QUICK_SEEDS: Final = (1,)


def rows() -> list[Row]:
    """The rows, in the order the report lists them."""
    return [
        Row(TODAY_ROW, {"strategies": list(TODAY)}),
        Row(DEFAULT_ROW),
        Row("default chain, offload off", {"offload": False}),
        *(Row(f"default chain, offload on, user_text_share {share:g}", {"user_text_share": share}) for share in SHARES),
        *(Row(label, {"offload": False}, partial(chain, FILL_TO)) for label, chain in BASELINES.items()),
    ]


@dataclass(frozen=True)
class Result:
    """One conversation through one row."""

    row: str
    window: int
    shape: str
    format: str
    seed: int
    score: Score


async def measure(
    chosen: Sequence[Row], windows: Sequence[int], fill: float, seeds: Sequence[int] = QUICK_SEEDS
) -> list[Result]:
    """Every row on every conversation: each shape and seed, in each format, at each window."""
    results = []
    for window in windows:
        for shape in SHAPES:
            for seed in seeds:
                generated = conversation(shape, seed, int(fill * window))
                for wire in WIRES:
                    for row in chosen:
                        score = await run(row, generated, wire, window)
                        results.append(Result(row.label, window, shape.name, wire.name, seed, score))
    return results


def _sum(scores: Iterable[Score], field: str) -> dict[str, int]:
    total = dict.fromkeys(KINDS, 0)
    for score in scores:
        for kind, count in getattr(score, field).items():
            total[kind] += count
    return total


def _kept(scores: Sequence[Score], field: str = "in_context") -> str:
    kept, planted = _sum(scores, field), _sum(scores, "facts")
    return f"{sum(kept.values())}/{sum(planted.values())}"


def _user_words_everywhere(scores: Sequence[Score]) -> str:
    """In how many conversations every requirement and every correction reached the model."""
    whole = sum(
        all(score.in_context[kind] == score.facts[kind] for kind in ("requirement", "correction")) for score in scores
    )
    return f"{whole}/{len(scores)}"


def summary(results: Sequence[Result], row: str) -> dict[str, Any]:
    """One row's figures over all its conversations (the `rows` of the JSON output)."""
    scores = [result.score for result in results if result.row == row]
    return {
        "row": row,
        "conversations": len(scores),
        "facts": _sum(scores, "facts"),
        "in_context": _sum(scores, "in_context"),
        "readable_back": _sum(scores, "readable_back"),
        "requirements_and_corrections_everywhere": _user_words_everywhere(scores),
        "prompt_tokens": sum(score.prompt_tokens for score in scores),
        "cached_tokens": sum(score.cached_tokens for score in scores),
        "output_tokens": sum(score.output_tokens for score in scores),
        "prefix_reuse": statistics.fmean(score.prefix_reuse for score in scores),
        "billed": {f"{price:g}x": round(sum(score.billed(price) for score in scores)) for price in CACHED_PRICES},
    }


def table(results: Sequence[Result]) -> list[str]:
    """The markdown tables: the rows over every conversation, then facts in context by window, shape and format."""
    labels = list(dict.fromkeys(result.row for result in results))
    kinds = " | ".join(f"{kind}s" for kind in KINDS)
    prices = " | ".join(f"billed, cached at {price:g}x" for price in CACHED_PRICES)
    lines = [
        f"| row | facts in context | {kinds} | requirements and corrections all kept | readable back "
        f"| prompt tokens | prefix reuse | {prices} | output tokens |",
        "| --- |" + " ---: |" * (len(KINDS) + 6 + len(CACHED_PRICES)),
    ]
    for label in labels:
        figures = summary(results, label)
        scores = [result.score for result in results if result.row == label]
        by_kind = " | ".join(f"{figures['in_context'][kind]}/{figures['facts'][kind]}" for kind in KINDS)
        bills = " | ".join(f"{figures['billed'][f'{price:g}x']:,}" for price in CACHED_PRICES)
        lines.append(
            f"| {label} | {_kept(scores)} | {by_kind} | {figures['requirements_and_corrections_everywhere']} "
            f"| {_kept(scores, 'readable_back')} | {figures['prompt_tokens']:,} | {figures['prefix_reuse']:.1%} "
            f"| {bills} | {figures['output_tokens']:,} |"
        )
    for column in ("window", "shape", "format"):
        lines += ["", *_by(results, labels, column)]
    return lines


def _by(results: Sequence[Result], labels: Sequence[str], column: str) -> list[str]:
    """Facts in context, per row, in one column per value of `column`."""
    values = list(dict.fromkeys(getattr(result, column) for result in results))
    lines = [f"| facts in context, by {column} | {' | '.join(map(str, values))} |", "| --- |" + " ---: |" * len(values)]
    for label in labels:
        cells = [
            _kept([r.score for r in results if r.row == label and getattr(r, column) == value]) for value in values
        ]
        lines.append(f"| {label} | {' | '.join(cells)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run the rows, print the tables, write the JSON results when asked."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one seed, the 32k window, twice its length")
    parser.add_argument("--output", type=Path, help="write the JSON results here")
    args = parser.parse_args(argv)
    windows, fill, seeds = (WINDOWS[:1], QUICK_FILL, QUICK_SEEDS) if args.quick else (WINDOWS, FILL, SEEDS)
    started = time.perf_counter()
    results = asyncio.run(measure(rows(), windows, fill, seeds))
    print(
        f"`python -m bench.recall{' --quick' * args.quick}` ({time.perf_counter() - started:.0f} s): "
        f"windows {', '.join(map(str, windows))} tokens, conversations {fill:g} times the window, compacted at "
        f"{TRIGGER:.0%} to {TARGET:.0%}; cached tokens as the fake "
        "upstreams reported them.\n"
    )
    print("\n".join(table(results)))
    if args.output:
        labels = dict.fromkeys(result.row for result in results)
        document = {
            "settings": {"windows": list(windows), "fill": fill, "seeds": list(seeds)},
            "rows": [summary(results, label) for label in labels],
            "runs": [{**result.__dict__, "score": result.score.as_dict()} for result in results],
        }
        args.output.write_text(json.dumps(document, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
