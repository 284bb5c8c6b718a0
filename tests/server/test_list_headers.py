"""Values the forwarded body needs added to the client's list-valued headers (`anthropic-beta`)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from proxy.server.headers import with_list_values

NAMES = st.text(alphabet="abcdefgh-0123456789", min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(st.lists(NAMES, max_size=3), max_size=3), value=NAMES)
def test_the_value_is_listed_once_after_the_clients_own(lines: list[list[str]], value: str) -> None:
    headers: CIMultiDict[str] = CIMultiDict([("X-Other", "kept")])
    for line in lines:
        headers.add("anthropic-beta", ",".join(line))
    sent = [item for line in lines for item in line]
    with_list_values(headers, {"Anthropic-Beta": value})
    listed = [item for line in headers.getall("anthropic-beta") for item in line.split(",") if item]
    assert listed == (sent if value in sent else [*sent, value])
    again = CIMultiDict(headers)
    with_list_values(again, {"anthropic-beta": value})
    assert again == headers
    assert headers["X-Other"] == "kept"
