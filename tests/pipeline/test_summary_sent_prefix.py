"""What a summary call repeats: the prompt the provider answered before, never the turn's new messages after it.

The turn's own prompt is not in the provider's cache yet (a summary written ahead goes out beside it; one written
on the turn that compacts, before it). A summary call repeats the prefix the provider reported usage for (the
anchor), less the reply that closed it, when the span lies within; all of the transcript otherwise (nothing
answered before, or a span reaching past it).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.engine.messages import Message
from proxy.pipeline.summaries import sent_prefix

ROLES = st.sampled_from(["system", "user", "assistant", "tool"])


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[Message], list[int], int | None]:
    """A transcript, a span of it, and how many of its messages were answered before (possibly none or all)."""
    messages: list[Message] = [{"role": role, "content": "x"} for role in draw(st.lists(ROLES, min_size=1))]
    indices = sorted(draw(st.sets(st.integers(0, len(messages) - 1), min_size=1)))
    answered = draw(st.none() | st.integers(0, len(messages) + 2))
    return messages, indices, answered


@given(cases())
def test_the_call_repeats_what_was_answered_when_the_span_lies_within(
    case: tuple[list[Message], list[int], int | None],
) -> None:
    messages, indices, answered = case
    cut = sent_prefix(messages, indices, answered)
    assert 0 < cut <= len(messages)
    sent = min(answered or 0, len(messages))
    if cut < len(messages):
        assert max(indices) < cut <= sent
        # Only the reply that closed the answered prefix is left out with the turn's new messages.
        assert cut == sent or (cut == sent - 1 and messages[cut]["role"] == "assistant")
    elif sent < len(messages):
        within = sent - (messages[sent - 1]["role"] == "assistant") if sent else 0
        assert max(indices) >= within, "the span lay within what was answered, yet the call repeats it all"
