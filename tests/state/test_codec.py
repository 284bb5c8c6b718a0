"""The plan codec: exact round trips, a compact form, refusal of what it cannot read, and the supersede rule."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.engine import COMPACTION_META_KEY
from proxy.engine.plan import Created, EditPlan, Entry, Kept
from proxy.state.codec import (
    FORMAT_VERSION,
    READ_TOOL_FIELD,
    PlanDecodeError,
    decode_plan,
    encode_entry,
    encode_plan,
    supersedes,
)
from tests.support.examples import examples

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=5,
)


@st.composite
def created_entries(draw: st.DrawFn, source_length: int) -> Created:
    message = draw(st.dictionaries(st.text(max_size=8), json_values, max_size=3))
    message = {"role": draw(st.sampled_from(["user", "assistant", "tool", "system"])), **message}
    meta: dict[str, Any] = {
        COMPACTION_META_KEY: {"strategy": draw(st.sampled_from(["sliding_window", "summarization"]))}
    }
    meta.update(draw(st.dictionaries(st.text(max_size=6), json_scalars, max_size=2)))
    replaces = draw(st.none() | st.integers(min_value=0, max_value=source_length - 1)) if source_length else None
    return Created(message=message, meta=meta, replaces=replaces)


@st.composite
def plans(draw: st.DrawFn) -> EditPlan:
    """Arbitrary plans: kept indices in any order (runs, gaps, repeats) mixed with created messages.

    At most `source_length` entries in all, as a compaction never makes a conversation longer (what a reader checks).
    """
    source_length = draw(st.integers(min_value=0, max_value=80))
    entries: list[Entry] = []
    for _ in range(draw(st.integers(min_value=0, max_value=10))):
        room = source_length - len(entries)
        if not room:
            break
        if draw(st.booleans()):
            start = draw(st.integers(min_value=0, max_value=source_length - 1))
            stop = draw(st.integers(min_value=start + 1, max_value=min(source_length, start + room)))
            entries.extend(Kept(index) for index in range(start, stop))
        else:
            entries.append(draw(created_entries(source_length)))
    return EditPlan(source_length, tuple(entries), draw(st.booleans()))


@settings(max_examples=examples(100), deadline=None)
@given(plans())
def test_round_trip_is_exact(plan: EditPlan) -> None:
    decoded = decode_plan(encode_plan(plan), plan.source_length)
    assert decoded == plan
    assert encode_plan(decoded) == encode_plan(plan)


@settings(max_examples=examples(50), deadline=None)
@given(plans())
def test_created_messages_keep_their_key_order(plan: EditPlan) -> None:
    for original, decoded in zip(
        plan.created(), decode_plan(encode_plan(plan), plan.source_length).created(), strict=True
    ):
        assert list(decoded.message) == list(original.message)
        assert orjson.dumps(decoded.message) == orjson.dumps(original.message)


def test_kept_runs_are_start_stop_pairs() -> None:
    note = Created({"role": "user", "content": "[5 earlier messages were removed.]"}, {COMPACTION_META_KEY: {}})
    stub = Created({"role": "tool", "tool_call_id": "c1", "content": "pruned"}, {COMPACTION_META_KEY: {}}, replaces=9)
    entries: tuple[Entry, ...] = (
        Kept(0),
        note,
        *(Kept(i) for i in range(6, 9)),
        stub,
        *(Kept(i) for i in range(10, 500)),
    )
    plan = EditPlan(500, entries)
    document = orjson.loads(encode_plan(plan))
    assert document[0] == FORMAT_VERSION
    assert document[1] == 500
    assert document[2][0] == [0, 1]
    assert document[2][2] == [6, 9]
    assert document[2][3] == {"m": stub.message, "t": stub.meta, "r": 9}
    assert document[2][4] == [10, 500]
    assert "r" not in document[2][1]
    assert len(encode_plan(plan)) < 250, "490 kept messages must cost a few bytes"
    assert len(encode_plan(EditPlan.identity(100_000))) < 30


def test_mapping_proxies_in_meta_are_encoded() -> None:
    entry = Created({"role": "user", "content": "x"}, MappingProxyType({COMPACTION_META_KEY: {"strategy": "s"}}))
    decoded = decode_plan(encode_plan(EditPlan(1, (entry,))), 1)
    assert decoded.entries[0] == Created({"role": "user", "content": "x"}, {COMPACTION_META_KEY: {"strategy": "s"}})


@settings(max_examples=examples(50), deadline=None)
@given(plans())
def test_a_record_written_before_the_read_tool_was_remembered_loads_without_it(plan: EditPlan) -> None:
    """A plan without the fourth element (every record before it existed) says its conversation had no read tool."""
    old = orjson.loads(encode_plan(plan))[:3]
    decoded = decode_plan(orjson.dumps(old), plan.source_length)
    assert decoded.read_tool is False
    assert decoded.entries == plan.entries
    assert encode_plan(replace(plan, read_tool=False)) == orjson.dumps(old), (
        "a plan without the tool is written as before"
    )


def test_the_read_tool_is_a_fourth_element_only_when_kept() -> None:
    assert orjson.loads(encode_plan(EditPlan.identity(2)))[3:] == []
    assert orjson.loads(encode_plan(EditPlan(2, (Kept(0), Kept(1)), read_tool=True)))[3] == {READ_TOOL_FIELD: True}


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"[1, 3, [[0, 3]], 7]",  # options that are not an object
        b"[1, 3, [[0, 3]], {}, {}]",
        b"not json",
        b"{}",
        b"[2, 3, []]",  # a format version this build does not know
        b"[1, -1, []]",
        b"[1, 3, [[2, 1]]]",
        b"[1, 3, [[0, 4]]]",
        b"[1, 3, [[0, true]]]",
        b"[1, 3, [7]]",
        b'[1, 3, [{"m": "text", "t": {}}]]',
        b'[1, 3, [{"m": {}, "t": {}, "r": 3}]]',
        b"[1, 3]",
        b"[1, 4, [[0, 3]]]",  # a plan over another prefix than the three messages its key names
        b"[1, 5000000, [[0, 5000000]]]",
        b"[1, 3, [[0, 3], [0, 3]]]",  # more kept messages than the prefix holds
        b"[1, 3, [[0, 2], [1, 3]]]",
        b'[1, 3, [[0, 3], {"m": {}, "t": {}}]]',  # more entries than the prefix holds messages
    ],
)
def test_unreadable_bytes_raise(data: bytes) -> None:
    with pytest.raises(PlanDecodeError):
        decode_plan(data, 3)


def _note(text: str, replaces: int | None = None) -> Created:
    return Created({"role": "user", "content": text}, {COMPACTION_META_KEY: {"strategy": "test"}}, replaces)


def test_a_later_compaction_supersedes_its_base_and_nothing_else() -> None:
    base = EditPlan.identity(10)
    first = base.then(EditPlan(10, (Kept(0), _note("[4 removed]"), *(Kept(i) for i in range(5, 10)))))
    later = first.then(EditPlan(7, (Kept(0), _note("[6 removed]"), *(Kept(i) for i in range(4, 7)))))
    pruned = first.then(EditPlan(7, (*(Kept(i) for i in range(6)), _note("pruned", replaces=6))))
    summary_cut = later.then(EditPlan(5, (Kept(0), _note("[6 rm]"), *(Kept(i) for i in range(2, 5)))))

    assert supersedes(first, base)
    assert supersedes(later, first)
    assert supersedes(later, base)
    assert supersedes(pruned, first)
    assert supersedes(summary_cut, later), "reworking only a created message, smaller, is a later compaction"
    # An older plan carried forward never replaces a compaction of it, nor does a plan replace itself.
    assert not supersedes(base, first)
    assert not supersedes(first, later)
    assert not supersedes(later, summary_cut), "the longer note is the older one"
    assert not supersedes(first, first)
    # A plan over a longer source (never under one key in practice) wins over a shorter one.
    assert supersedes(base.extended(11), first)
    assert not supersedes(first, base.extended(11))


def test_siblings_converge_whatever_order_they_land_in() -> None:
    base = EditPlan.identity(10)
    drop_four = base.then(EditPlan(10, (Kept(0), _note("[4 removed]"), *(Kept(i) for i in range(5, 10)))))
    drop_three = base.then(EditPlan(10, (Kept(0), _note("[3 removed]"), *(Kept(i) for i in range(4, 10)))))
    prune_seven = base.then(EditPlan(10, (*(Kept(i) for i in range(7)), _note("pruned", 7), Kept(8), Kept(9))))
    # One is a further compaction of the other: it wins, in either order.
    assert supersedes(drop_four, drop_three)
    assert not supersedes(drop_three, drop_four)
    # Incomparable: neither replaces the other, so whichever was stored first stays.
    assert not supersedes(prune_seven, drop_four)
    assert not supersedes(drop_four, prune_seven)


@settings(max_examples=examples(100), deadline=None)
@given(plans(), st.data())
def test_composing_a_shrinking_compaction_always_supersedes(plan: EditPlan, data: Any) -> None:
    """Whatever the stored plan, a compaction that drops one of its entries, or replaces it with something smaller,
    supersedes it; and the stored plan never supersedes its compaction back."""
    if not plan.entries:
        return
    outputs = len(plan.entries)
    dropped = data.draw(st.integers(min_value=0, max_value=outputs - 1))
    later_entries: list[Entry] = [Kept(i) for i in range(outputs) if i != dropped]
    replacement = Created({"role": "user"}, {}, replaces=dropped)
    original = plan.entries[dropped]
    if data.draw(st.booleans()) and (
        isinstance(original, Kept) or len(encode_entry(replacement)) < len(encode_entry(original))
    ):
        later_entries.insert(dropped, replacement)
    later = plan.then(EditPlan(outputs, tuple(later_entries)))
    assert supersedes(later, plan)
    assert not supersedes(plan, later)


def builds_on(new: EditPlan, stored: EditPlan) -> bool:
    """The reading `supersedes` starts with, by its definition: each of `new`'s entries matched to the first equal
    entry of `stored` after the previous match, created ones allowed to be missing, kept ones not."""
    stored_wire = [encode_entry(entry) for entry in stored.entries]
    position = 0
    for entry in new.entries:
        wire = encode_entry(entry)
        match = next((at for at in range(position, len(stored_wire)) if stored_wire[at] == wire), None)
        if match is not None:
            position = match + 1
        elif isinstance(entry, Kept):
            return False
    return True


@settings(max_examples=examples(200), deadline=None)
@given(plans(), plans())
def test_a_plan_that_does_not_build_on_the_stored_one_never_supersedes_it(new: EditPlan, stored: EditPlan) -> None:
    """The entries are matched by a search per entry (not a scan, which was quadratic), with the scan's answer."""
    stored = EditPlan(new.source_length, stored.entries) if stored.source_length >= new.source_length else stored
    if new.source_length == stored.source_length and not builds_on(new, stored):
        assert not supersedes(new, stored)
    if builds_on(new, stored) and builds_on(stored, new) and new.source_length == stored.source_length:
        assert not (supersedes(new, stored) and supersedes(stored, new))


def test_the_same_plan_saying_the_read_tool_was_sent_supersedes_it_and_not_the_other_way() -> None:
    stored = EditPlan(3, (Kept(0), _note("[1 message was removed.]"), Kept(2)))
    kept = replace(stored, read_tool=True)
    assert supersedes(kept, stored)
    assert not supersedes(stored, kept)
    assert not supersedes(kept, kept)
