"""`Settings`: every setting of the proxy in one validated, immutable model, composed from one group per concern."""

from __future__ import annotations

from typing import Final

from pydantic import ConfigDict, model_validator

from proxy.config.clients import ClientSettings
from proxy.config.compaction import CompactionSettings
from proxy.config.prices import PriceSettings
from proxy.config.routes import RouteSettings
from proxy.config.state import StateSettings
from proxy.config.summaries import SummarySettings
from proxy.config.tracing import TracingSettings
from proxy.config.upstream import UpstreamSettings


class Settings(
    PriceSettings, TracingSettings, StateSettings, SummarySettings, CompactionSettings, ClientSettings, UpstreamSettings
):
    """Everything the proxy can be configured with. Immutable once loaded; see `load_settings` for the sources.

    The fields are declared by concern: `UpstreamSettings` (the provider and its timeouts), `ClientSettings` (the
    listening side and its limits), `CompactionSettings`, `SummarySettings`, `StateSettings`, `TracingSettings` and
    `PriceSettings` (what the bill prices models at).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, use_enum_values=False)

    @model_validator(mode="after")
    def _check_thresholds(self) -> Settings:
        if not self.compact_to < self.compact_at:
            raise ValueError(f"compact_to ({self.compact_to}) must be below compact_at ({self.compact_at})")
        if self.precompact_at is not None and not self.compact_to < self.precompact_at <= self.compact_at:
            raise ValueError(
                f"precompact_at ({self.precompact_at}) must lie between compact_to ({self.compact_to}) and compact_at"
                f" ({self.compact_at})"
            )
        return self

    @model_validator(mode="after")
    def _check_workers(self) -> Settings:
        if self.workers > 1 and self.state_url.startswith("memory://"):
            raise ValueError(
                f"workers ({self.workers}) needs a shared state_url: with memory:// each process would keep its own"
                " share of every conversation's state. Set state_url to a Redis (redis://host:6379/0), or workers to 1"
            )
        return self

    def for_route(self, route: RouteSettings) -> Settings:
        """These settings with the route's own upstream settings in place of the proxy's: what its clients use."""
        update = {field: value for field, value in route.overrides().items() if getattr(self, field) != value}
        return self.model_copy(update=update) if update else self

    @property
    def summary_start_at(self) -> float:
        """The fraction of the window at which a summary starts being written ahead of time."""
        if self.precompact_at is not None:
            return self.precompact_at
        return max(self.compact_at - 0.1, (self.compact_at + self.compact_to) / 2)


FIELDS: Final = tuple(Settings.model_fields)
