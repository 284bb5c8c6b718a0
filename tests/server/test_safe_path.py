"""`safe_raw_path`: the paths refused are exactly those that could climb above the base path or hide a control
character, whether the check takes its short way (a plain path) or decodes (anything percent-encoded, a backslash)."""

from __future__ import annotations

import re
from urllib.parse import unquote

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.server.routes import safe_raw_path
from tests.support.examples import examples

PIECES = st.sampled_from(["/", "//", ".", "..", "%2e", "%2E", "%2f", "%5c", "\\", "%00", "%7f", "\x01", "\x7f", " "])
PATHS = st.lists(PIECES | st.text(alphabet=st.characters(codec="utf-8"), max_size=4), max_size=12).map("".join)


def expected(raw_path: str) -> str | None:
    """The rule, said plainly: starts with `/`, no `.` or `..` segment once decoded (at `/` or a backslash), no
    control character once decoded; leading slashes collapse to one."""
    if not raw_path.startswith("/"):
        return None
    decoded = unquote(raw_path)
    if any(part in (".", "..") for part in re.split(r"[/\\]", decoded)):
        return None
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in decoded):
        return None
    return "/" + raw_path.lstrip("/")


@settings(max_examples=examples(500), deadline=None)
@given(path=PATHS | PATHS.map(lambda path: "/" + path))
def test_a_path_is_refused_exactly_when_the_rule_says(path: str) -> None:
    assert safe_raw_path(path) == expected(path)


def test_a_plain_path_is_kept_and_a_climbing_one_refused() -> None:
    assert safe_raw_path("//v1/chat/completions") == "/v1/chat/completions"
    assert safe_raw_path("/v1/.well-known/x..y") == "/v1/.well-known/x..y"
    assert safe_raw_path("/v1/../admin") is None
    assert safe_raw_path("/v1/%2e%2e/admin") is None
