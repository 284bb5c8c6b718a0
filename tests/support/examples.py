"""How many examples a property test runs, by the Hypothesis profile loaded (see `tests/conftest.py`).

Two profiles: `quick`, the default, for the README's test command on a developer's machine, and `thorough`, which CI
loads (`HYPOTHESIS_PROFILE=thorough`). A test states the examples it runs under `thorough`; `quick` runs a fifth of
them, never fewer than `FLOOR`.
"""

from __future__ import annotations

from typing import Final

from hypothesis import HealthCheck, settings

THOROUGH_EXAMPLES: Final = 100
"""The `thorough` profile's default example count, against which a test's own count is scaled."""

QUICK_EXAMPLES: Final = 20
"""The `quick` profile's default example count."""

FLOOR: Final = 10
"""The fewest examples a property test runs under any profile."""


def load_profile(name: str) -> None:
    """Register both profiles and load `name` (`quick` or `thorough`)."""
    for profile, count in (("thorough", THOROUGH_EXAMPLES), ("quick", QUICK_EXAMPLES)):
        settings.register_profile(
            profile, max_examples=count, deadline=None, suppress_health_check=[HealthCheck.too_slow]
        )
    settings.load_profile(name)


def examples(thorough: int) -> int:
    """The examples to run for a test that runs `thorough` of them under the `thorough` profile."""
    return max(FLOOR, round(thorough * settings.default.max_examples / THOROUGH_EXAMPLES))
