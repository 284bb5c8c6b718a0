"""`EditPlan.read_tool` survives everything the proxy does to a remembered plan: extending, composing, the leading
block put back. A conversation once sent the read tool keeps it however its plan is carried forward."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.engine import COMPACTION_META_KEY
from proxy.engine.grouping import with_leading_block
from proxy.engine.plan import Created, EditPlan, Entry, Kept
from tests.support.examples import examples


@st.composite
def plans(draw: st.DrawFn, source_length: int) -> EditPlan:
    """A compaction of `source_length` messages: some kept in order, a note where others went."""
    kept = draw(st.lists(st.booleans(), min_size=source_length, max_size=source_length))
    entries: list[Entry] = [Kept(index) for index, keep in enumerate(kept) if keep]
    if len(entries) < source_length:
        note = Created({"role": "user", "content": "[Earlier messages were removed.]"}, {COMPACTION_META_KEY: {}})
        entries.insert(draw(st.integers(min_value=0, max_value=len(entries))), note)
    return EditPlan(source_length, tuple(entries), draw(st.booleans()))


@st.composite
def composed(draw: st.DrawFn) -> tuple[EditPlan, EditPlan]:
    first = draw(plans(draw(st.integers(min_value=0, max_value=12))))
    return first, draw(plans(len(first.entries)))


@settings(max_examples=examples(100), deadline=None)
@given(pair=composed(), grown=st.integers(min_value=0, max_value=5))
def test_the_read_tool_is_kept_through_every_way_a_plan_is_carried(pair: tuple[EditPlan, EditPlan], grown: int) -> None:
    first, later = pair
    assert first.then(later).read_tool == (first.read_tool or later.read_tool)
    assert first.extended(first.source_length + grown).read_tool == first.read_tool
    messages = [{"role": "system", "content": "Be brief."}] + [
        {"role": "user", "content": f"message {index}"} for index in range(first.source_length - 1)
    ]
    assert with_leading_block(first, messages[: first.source_length]).read_tool == first.read_tool
