"""Offloading lands in the chain exactly where the configured strategies name it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.engine import STRATEGY_NAMES, ToolResultOffload
from proxy.pipeline.compacting import chain_names
from proxy.pipeline.offload.offloading import offload_position

NAMED = st.permutations([*STRATEGY_NAMES, ToolResultOffload.name]).flatmap(
    lambda names: st.integers(0, len(names)).map(lambda kept: names[:kept])
)


@given(strategies=NAMED)
def test_offloading_keeps_its_place_among_the_steps_the_chain_runs(strategies: list[str]) -> None:
    chain = chain_names(strategies)
    position = offload_position(strategies, chain)
    if ToolResultOffload.name not in strategies:
        assert position is None
        return
    assert position is not None
    placed = [*chain[:position], ToolResultOffload.name, *chain[position:]]
    assert [name for name in strategies if name in placed] == [name for name in placed if name in strategies]
