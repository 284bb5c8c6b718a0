"""One test adapter per wire format, so an end-to-end test is written once and run for every format.

A `FormatCase` (`case.py`) knows what a client of its format sends and reads: the path, a conversation request of N
turns with a system prompt and tool calls, the next turn of one, the credentials headers, the text, calls and prompt
tokens of an answer (JSON or streamed), and which fake upstream (`upstream_fixture`) serves the format and records
what the proxy forwarded. One module per format, like `proxy/formats/`. A test takes the case as its `wire`
parameter (`by_format()`); a new format inherits every such test with its module and one entry in `CASES`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import pytest

from tests.support.wire_formats.case import PARAGRAPH, SYSTEM, Answer, FormatCase, Upstream
from tests.support.wire_formats.chat_completions import CHAT_COMPLETIONS
from tests.support.wire_formats.messages import MESSAGES
from tests.support.wire_formats.responses import RESPONSES

__all__ = [
    "CASES",
    "CHAT_COMPLETIONS",
    "MESSAGES",
    "PARAGRAPH",
    "RESPONSES",
    "SYSTEM",
    "Answer",
    "FormatCase",
    "Upstream",
    "by_format",
]

CASES: Final[tuple[FormatCase, ...]] = (CHAT_COMPLETIONS, RESPONSES, MESSAGES)
"""Every format the end-to-end tests run for; a new format's case added here inherits them."""


def by_format(*cases: FormatCase, xfail: Mapping[FormatCase, str] | None = None) -> pytest.MarkDecorator:
    """Parametrize a test's `wire` over `cases` (all of `CASES` if none), with a strict xfail for each format in
    `xfail` (the reason: what the proxy cannot yet do for it)."""
    failing = xfail or {}
    params = [
        pytest.param(case, id=case.name, marks=[pytest.mark.xfail(strict=True, reason=failing[case])])
        if case in failing
        else pytest.param(case, id=case.name)
        for case in cases or CASES
    ]
    return pytest.mark.parametrize("wire", params)
