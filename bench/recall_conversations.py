"""Seeded agent conversations with planted facts, for `bench.recall`.

A conversation is what an agent's client holds at its end, as OpenAI chat messages (the engine's lingua franca;
`bench.recall_wire` writes it in each wire format): a system prompt; an opening user message stating the task and two
requirements of the final report, each with a code to quote; a second user message adding a third; long ordinary
turns (documents the user pastes, tool results, the assistant's prose: thousands of tokens each); a user message about
halfway through that changes direction (two corrections that supersede the opening's plan); facts in tool results
(in the first lines of some, in the middle of long ones) and decisions in the assistant's prose, spread over the run
from its opening to its last eighth, so that they are of every age when the report is asked for;
and a last user message asking for the report. Every fact is one sentence holding a code of its own, so whether it
reached the model is a substring test.

Three shapes of work (`SHAPES`): coding, research and data work, each with its own tools, results and words. The
same shape, seed and length always give the same conversation.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from proxy.engine import TiktokenCounter

KINDS: Final = ("requirement", "correction", "tool fact", "decision")
"""The kinds of planted facts, in the order reports list them."""

_CODE_PREFIXES: Final = {"requirement": "REQ", "correction": "COR", "tool fact": "TOOL", "decision": "DEC"}

TOOL_FACTS_AT: Final = ((0.1, "head"), (0.5, "middle"), (0.75, "head"), (0.88, "middle"))
"""Where tool facts are planted: the first tool result past this share of the conversation's length, in its first line
(`head`) or in the middle of a long result (`middle`)."""
DECISIONS_AT: Final = (0.3, 0.8)
"""The first assistant prose past each of these shares of the length states a decision."""
CORRECTION_AT: Final = 0.45
"""The first user turn past this share of the length changes direction."""
LONG_RESULT: Final = (2500, 4000)
"""Tokens of a long tool result (one with a fact in its middle, and every eighth or so)."""


@dataclass(frozen=True)
class Fact:
    """One planted fact: its kind (one of `KINDS`) and its sentence, code included."""

    kind: str
    text: str


@dataclass(frozen=True)
class Shape:
    """A kind of agent work: its prompt, task, facts to plant (templates with `{code}`), tools and vocabulary.

    :param tools: Tool name: (what its result looks like: `code`, `log`, `json`, `csv` or `prose`, its argument).
    """

    name: str
    system: str
    task: str
    requirements: tuple[str, str, str]
    corrections: tuple[str, str]
    tool_facts: tuple[str, str, str, str]
    decisions: tuple[str, str]
    tools: dict[str, tuple[str, str]]
    words: tuple[str, ...]


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


SHAPES: Final = (
    Shape(
        name="coding",
        system="You are a coding agent working in the orders service repository. Use the tools; report plainly.",
        task="Migrate the orders export job to the new pipeline and write a final report on the migration.",
        requirements=(
            "The final report must have numbered sections; quote code {code} in its first section.",
            "The final report must close with a risk table; quote code {code} under that table.",
            "The report must cite the deployment region of the service; quote code {code} next to it.",
        ),
        corrections=(
            "Change of direction: move the export job to the streaming pipeline, not the batch one (code {code}).",
            "With that, remove the nightly cron entry instead of rescheduling it (code {code}).",
        ),
        tool_facts=(
            "deployment region of the orders service: eu-west-3 (fact {code})",
            "slowest test: test_refund_rounding takes 41 seconds (fact {code})",
            "configured retry budget of the export client: 7 attempts (fact {code})",
            "migration 0042 holds the lock on the orders table (fact {code})",
        ),
        decisions=(
            "Decision: the legacy export endpoint stays behind a feature flag until the migration ends (code {code}).",
            "Decision: the retry logic moves into the shared client module (code {code}).",
        ),
        tools={"read_file": ("code", "path"), "run_tests": ("log", "selection"), "grep": ("log", "pattern")},
        words=_words(
            "handler export orders batch queue retry client module schema migration lock table test fixture commit"
            " branch config deploy region latency timeout worker record cursor offset payload encoder refund ledger"
            " invoice stream partition checkpoint flag endpoint backoff metric alert dashboard rollback"
        ),
    ),
    Shape(
        name="research",
        system="You are a research assistant. Search, read sources, and keep track of what each source says.",
        task="Review the evidence on recycling lithium-ion batteries at scale and write a final briefing.",
        requirements=(
            "The briefing must have numbered sections; quote code {code} in its first section.",
            "The briefing must end with a table of open questions; quote code {code} under that table.",
            "Every claim must cite its source by title; quote code {code} in the sources list.",
        ),
        corrections=(
            "Change of direction: focus on hydrometallurgical recovery, not pyrometallurgy (code {code}).",
            "Also, drop the sources older than 2019 from the briefing (code {code}).",
        ),
        tool_facts=(
            "recovery rate reported for cobalt in the pilot plant: 96.4 percent (fact {code})",
            "the largest plant surveyed processes 10,000 tonnes a year (fact {code})",
            "the cost estimate per kilogram of black mass: 2.80 dollars (fact {code})",
            "the survey covered 41 facilities in 9 countries (fact {code})",
        ),
        decisions=(
            "Decision: I will treat the industry white papers as secondary sources only (code {code}).",
            "Decision: the briefing compares plants by tonnes processed, not by revenue (code {code}).",
        ),
        tools={"web_search": ("json", "query"), "fetch_page": ("prose", "url")},
        words=_words(
            "battery cathode cobalt nickel lithium recovery leaching smelting plant tonnes yield study survey cost"
            " process solvent precipitation purity grade feedstock black mass shredding regulation policy market"
            " capacity pilot evidence source review sample emissions energy water supply chain estimate"
        ),
    ),
    Shape(
        name="data",
        system="You are a data analyst with SQL access to the subscriptions warehouse. Query, check, and explain.",
        task="Analyse customer churn over the last four quarters and write a final summary for the board.",
        requirements=(
            "The summary must have numbered sections; quote code {code} in its first section.",
            "The summary must end with a table of caveats; quote code {code} under that table.",
            "State the warehouse snapshot date you used; quote code {code} next to it.",
        ),
        corrections=(
            "Change of direction: measure churn by revenue, not by customer count (code {code}).",
            "And exclude the trial accounts from every figure (code {code}).",
        ),
        tool_facts=(
            "warehouse snapshot date: 2026-09-30 (fact {code})",
            "churned customers in Q3: 1,284 of 20,410 (fact {code})",
            "the plan_id column is null for 3.1 percent of rows (fact {code})",
            "median tenure of churned accounts: 7 months (fact {code})",
        ),
        decisions=(
            "Decision: a customer counts as churned after 45 days without an active plan (code {code}).",
            "Decision: currency amounts are converted at the quarter's closing rate (code {code}).",
        ),
        tools={"run_sql": ("csv", "query"), "describe_table": ("json", "table")},
        words=_words(
            "customer churn plan revenue quarter cohort tenure trial invoice subscription region segment retention"
            " upgrade downgrade cancel renewal discount account warehouse table column query join filter window"
            " median mean rate ratio outlier snapshot partition forecast baseline variance"
        ),
    ),
)
"""The shapes of work, by name in `Conversation.name`."""


@dataclass
class Conversation:
    """A generated conversation: its messages (system first, the last user message last), tools and facts."""

    name: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    facts: list[Fact] = field(default_factory=list)

    @property
    def system(self) -> str:
        """The system prompt (the first message's text)."""
        return str(self.messages[0]["content"])

    def calls(self) -> list[int]:
        """Where the client calls the model: before each assistant message, and at the end (the report)."""
        return [index for index, message in enumerate(self.messages) if message["role"] == "assistant"] + [
            len(self.messages)
        ]


class _Writer:
    """Writes one conversation of a shape, turn by turn, planting each fact where the schedule says."""

    def __init__(self, shape: Shape, seed: int, length: int) -> None:
        self.shape = shape
        self.rng = random.Random(f"{shape.name}-{seed}")
        self.length = length
        self.counter = TiktokenCounter()
        self.total = 0
        self.facts: list[Fact] = []
        self.messages: list[dict[str, Any]] = []
        self.calls = 0
        self.tool_facts = list(zip(TOOL_FACTS_AT, shape.tool_facts, strict=True))
        self.decisions = list(zip(DECISIONS_AT, shape.decisions, strict=True))

    def add(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        self.total += self.counter.message_tokens(message)

    def fact(self, kind: str, template: str) -> str:
        code = f"{_CODE_PREFIXES[kind]}-{self.rng.getrandbits(24):06X}"
        text = template.format(code=code)
        self.facts.append(Fact(kind, text))
        return text

    def due(self, share: float) -> bool:
        return self.total >= share * self.length

    def sentence(self) -> str:
        words = [self.rng.choice(self.shape.words) for _ in range(self.rng.randint(8, 22))]
        return " ".join(words).capitalize() + "."

    def prose(self, tokens: int) -> str:
        """Paragraphs of about `tokens` tokens."""
        paragraphs: list[str] = []
        size = 0
        while size < tokens:
            paragraph = " ".join(self.sentence() for _ in range(self.rng.randint(3, 7)))
            paragraphs.append(paragraph)
            size += self.counter.text_tokens(paragraph)
        return "\n\n".join(paragraphs)

    def lines(self, style: str, tokens: int) -> list[str]:
        """Lines of a tool result in `style`, about `tokens` tokens in all."""
        made: list[str] = []
        size = 0
        while size < tokens:
            line = _LINE_STYLES[style](self, len(made))
            made.append(line)
            size += self.counter.text_tokens(line) + 1
        return made

    def user(self, opening: str, paste: int) -> None:
        """A user message: what it asks, then a pasted document of about `paste` tokens (none when 0)."""
        text = opening if not paste else f"{opening}\n\nHere is what I have on it:\n\n{self.prose(paste)}"
        self.add({"role": "user", "content": text})

    def agent(self) -> None:
        """The agent's answer to a user turn: one to three tool steps, then its prose (maybe with a decision)."""
        for _ in range(self.rng.randint(1, 3)):
            names = [self.rng.choice(list(self.shape.tools)) for _ in range(self.rng.choice((1, 1, 2)))]
            calls = [self._call(name) for name in names]
            self.add({"role": "assistant", "content": None, "tool_calls": calls})
            for call in calls:
                self.add({"role": "tool", "tool_call_id": call["id"], "content": self._result(call)})
        text = self.prose(self.rng.randint(600, 1500))
        if self.decisions and self.due(self.decisions[0][0]):
            _share, template = self.decisions.pop(0)
            text = f"{self.prose(120)}\n\n{self.fact('decision', template)}\n\n{text}"
        self.add({"role": "assistant", "content": text})

    def _call(self, name: str) -> dict[str, Any]:
        self.calls += 1
        argument = self.shape.tools[name][1]
        value = f"{self.rng.choice(self.shape.words)}_{self.rng.randrange(40)}"
        function = {"name": name, "arguments": json.dumps({argument: value})}
        return {"id": f"call_{self.calls:04d}", "type": "function", "function": function}

    def _result(self, call: dict[str, Any]) -> str:
        style = self.shape.tools[call["function"]["name"]][0]
        planted = self.tool_facts[0] if self.tool_facts and self.due(self.tool_facts[0][0][0]) else None
        long = (planted is not None and planted[0][1] == "middle") or self.rng.random() < 0.125
        tokens = self.rng.randint(*LONG_RESULT) if long else self.rng.randint(200, 1200)
        lines = self.lines(style, tokens)
        if planted is not None:
            self.tool_facts.pop(0)
            (_share, where), template = planted
            lines.insert(0 if where == "head" else len(lines) // 2, self.fact("tool fact", template))
        return "\n".join(lines)


def _code_line(writer: _Writer, number: int) -> str:
    word, other = writer.rng.choice(writer.shape.words), writer.rng.choice(writer.shape.words)
    return f"{number + 1:4d}    {word}_{number} = {other}.load(retries={number % 5}, timeout={number % 7 + 1})"


def _log_line(writer: _Writer, number: int) -> str:
    word = writer.rng.choice(writer.shape.words)
    verdict = "PASSED" if writer.rng.random() < 0.9 else "FAILED"
    return f"tests/test_{word}.py::test_{word}_{number} {verdict} [{writer.rng.randrange(100):3d}%]"


def _json_line(writer: _Writer, number: int) -> str:
    record = {"id": number, "title": writer.sentence()[:60], "score": round(writer.rng.random(), 3)}
    return json.dumps(record)


def _csv_line(writer: _Writer, number: int) -> str:
    segment = writer.rng.choice(writer.shape.words)
    return f"{number},{segment},{writer.rng.randrange(10_000)},{writer.rng.random():.4f},2026-Q{number % 4 + 1}"


def _prose_line(writer: _Writer, _number: int) -> str:
    return writer.sentence()


_LINE_STYLES: Final[dict[str, Callable[[_Writer, int], str]]] = {
    "code": _code_line,
    "log": _log_line,
    "json": _json_line,
    "csv": _csv_line,
    "prose": _prose_line,
}


def conversation(shape: Shape, seed: int, length: int) -> Conversation:
    """A conversation of `shape` of about `length` tokens, its facts planted as the module docstring says."""
    writer = _Writer(shape, seed, length)
    writer.add({"role": "system", "content": shape.system})
    first, second, third = shape.requirements
    opening = f"{shape.task}\n\n{writer.fact('requirement', first)}\n{writer.fact('requirement', second)}"
    writer.user(f"{opening}\nStart with the batch pipeline.", writer.rng.randint(800, 1500))
    writer.agent()
    writer.user(writer.fact("requirement", third), writer.rng.randint(300, 900))
    writer.agent()
    corrected = False
    while writer.total < length or writer.tool_facts or writer.decisions or not corrected:
        if not corrected and writer.due(CORRECTION_AT):
            corrected = True
            writer.user(" ".join(writer.fact("correction", text) for text in shape.corrections), 0)
        else:
            paste = writer.rng.choice((0, 0, writer.rng.randint(1000, 3000)))
            writer.user(f"Next: {writer.sentence()}", paste)
        writer.agent()
    writer.user("Write the final report now.", 0)
    tools = [
        {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {"type": "object", "properties": {argument: {"type": "string"}}, "required": [argument]},
        }
        for name, (_style, argument) in shape.tools.items()
    ]
    return Conversation(f"{shape.name}-{seed}", writer.messages, tools, writer.facts)
