"""`ContextWindows` looks each model name up in its tables once, and answers exactly as walking the tables does."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.windows import KNOWN_CONTEXT_WINDOWS, MAX_CACHED_NAME, ContextWindows, WindowSource, table_window

CONFIGURED = {"my-org/": 32_768, "gpt-4o-mini": 4096}
NAMES = st.one_of(
    st.sampled_from([*KNOWN_CONTEXT_WINDOWS, *CONFIGURED, "openai/gpt-4.1-2025", "GPT-4O-MINI", "unknown"]),
    st.text(max_size=40),
)


def uncached(model: str | None) -> tuple[int | None, int | None]:
    return table_window(model, CONFIGURED), table_window(model)


@given(st.lists(st.one_of(st.none(), NAMES), max_size=20), st.one_of(st.none(), st.integers(1, 10**6)))
def test_repeated_lookups_answer_as_the_tables_do(models: list[str | None], discovered: int | None) -> None:
    windows = ContextWindows(CONFIGURED, default=1000)
    for model in [*models, *models]:
        configured, shipped = uncached(model)
        expected = next(
            (
                (tokens, source)
                for tokens, source in (
                    (configured, WindowSource.CONFIGURED),
                    (discovered, WindowSource.DISCOVERED),
                    (shipped, WindowSource.TABLE),
                    (1000, WindowSource.DEFAULT),
                )
                if tokens
            ),
        )
        found = windows.resolve_window(model, discovered=discovered)
        assert found is not None
        assert (found.tokens, found.source) == expected


def test_huge_model_names_are_not_remembered() -> None:
    windows = ContextWindows(CONFIGURED)
    windows.resolve_window("gpt-4o" + "x" * MAX_CACHED_NAME)
    assert len(windows._tables) == 0
    windows.resolve_window("gpt-4o")
    assert len(windows._tables) == 1
