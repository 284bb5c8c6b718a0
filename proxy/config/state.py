"""Settings of per-conversation state: where it lives, how long, how much, and the key that scopes it by tenant."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping, Sequence
from typing import Final

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator

from proxy.config.kinds import CABundle

CREDENTIAL_HEADERS: Final = ("authorization", "api-key", "x-api-key")
"""Request headers that carry the caller's credentials (OpenAI bearer token, Azure `api-key`, others' `x-api-key`)."""

TENANT_HEADERS: Final = (*CREDENTIAL_HEADERS, "x-proxy-key", "proxy-authorization")
"""Request headers that tell callers apart: their provider credentials and, on a gateway, their proxy key (which may
be the only credential a caller sends when the gateway holds the provider's)."""


PLACEHOLDERS: Final = ("replace-me", "replace_me", "changeme", "change-me")
"""Text that marks a tenant key copied from an example without being replaced: every deployment would share it."""


def _random_tenant_key() -> SecretStr:
    return SecretStr(secrets.token_urlsafe(32))


class StateSettings(BaseModel):
    """The state store, its bounds, and the tenant key."""

    state_url: str = Field(
        default="memory://",
        description="Where per-conversation state lives: `memory://` (in-process LRU) or `redis://host:port/db`.",
    )
    state_ca_bundle: CABundle | None = Field(
        default=None,
        description=(
            "PEM file of CA certificates trusted for TLS to a `rediss://` state_url in addition to the system's default"
            " trust, for a Redis whose certificate a private CA signed. Only with a rediss:// state_url."
        ),
    )
    state_ttl_seconds: int = Field(
        default=86400, gt=0, description="How long an idle conversation's state (anchors, plans) is kept."
    )
    state_max_conversations: int = Field(
        default=100_000, gt=0, description="Bound on conversations kept by the in-memory store (least recent go)."
    )
    prefix_memory_bytes: int = Field(
        default=64 * 2**20,
        gt=0,
        description=(
            "Memory, in bytes, for what is kept of each conversation's last request so that its next one costs only"
            " its new messages. Half holds the last request as the proxy handled it (its raw body, parsed messages"
            " and the body it forwarded, charged twice the body plus what it serialized), so a request that extends"
            " it is recognized from its bytes and spliced; the other half holds parsed messages and their keys for"
            " requests that are not (each charged its body size), shared by the original requests and their"
            " compacted views. Both are charged about 400 bytes per message besides; the least recently seen"
            " conversations are forgotten first, and a request costing more than a quarter of its half is not kept"
            " at all (it is parsed and hashed in full each time it comes)."
        ),
    )
    forwarded_memory_bytes: int = Field(
        default=32 * 2**20,
        gt=0,
        description=(
            "Memory, in bytes, for what each conversation's latest request was forwarded as, on the Messages API"
            " models that bind thinking to everything before it (a 16-byte digest per message sent): its next"
            " request keeps the thinking produced since only where that prefix is unchanged. The least recently"
            " forwarded conversations are forgotten first (at most 4,096 are kept), and one costing more than a"
            " quarter of this is not kept; a conversation forgotten is forwarded as if the proxy had not seen it"
            " before, which the format keeps valid."
        ),
    )
    state_max_bytes: int = Field(
        default=256 * 2**20,
        gt=0,
        description=(
            "Bound, in bytes, on what the in-memory store's remembered rewrites hold (about 64 bytes per message of"
            " each conversation, plus the messages compaction created); the least recently used go first."
        ),
    )
    state_offload_max_bytes: int = Field(
        default=64 * 2**20,
        gt=0,
        description=(
            "Bound, in bytes, on the offloaded tool results the in-memory store holds for the proxy's read tool"
            " (`offload`), shared fairly between tenants: a tenant holding more than an even share evicts its own"
            " least recently used first. A read of a result let go is answered from the re-sent original."
        ),
    )
    tenant_key: SecretStr = Field(
        default_factory=_random_tenant_key,
        description=(
            "Secret keying the hash of each caller's credentials that scopes all state, so callers never see each"
            " other's. Random per process when unset; set it (same value everywhere) when replicas share Redis."
            " Never logged."
        ),
    )

    @field_validator("state_url")
    @classmethod
    def _check_state_url(cls, value: str) -> str:
        if not value.startswith(("memory://", "redis://", "rediss://", "unix://")):
            raise ValueError("must be memory:// or a redis:// / rediss:// / unix:// URL")
        return value

    @model_validator(mode="after")
    def _check_state_ca_bundle(self) -> StateSettings:
        if self.state_ca_bundle is not None and not self.state_url.startswith("rediss://"):
            raise ValueError("state_ca_bundle applies only to a rediss:// state_url (Redis over TLS)")
        return self

    @field_validator("tenant_key")
    @classmethod
    def _check_tenant_key(cls, value: SecretStr) -> SecretStr:
        key = value.get_secret_value()
        if len(key) < 16:
            raise ValueError("must be at least 16 characters")
        if any(placeholder in key.lower() for placeholder in PLACEHOLDERS):
            raise ValueError(
                "is still the example's placeholder; generate one with `openssl rand -hex 32` and set it everywhere"
            )
        return value

    def tenant_of(self, headers: Mapping[str, str]) -> str:
        """Return the caller's tenant id: a keyed hash (HMAC-SHA256 under `tenant_key`) of its `TENANT_HEADERS`.

        The compaction side scopes every state key with this, so one caller can never match, read or poison another's
        state, and nothing stored or logged reveals a credential. Callers without credentials share one tenant.

        :param headers: The request headers (any mapping; names are matched case-insensitively).
        """
        lowered = {name.lower(): value for name, value in headers.items()}
        return tenant_id(self.tenant_key.get_secret_value(), [lowered.get(name, "") for name in TENANT_HEADERS])


def tenant_id(tenant_key: str, credentials: Sequence[str]) -> str:
    """The tenant id (see `StateSettings.tenant_of`) of a caller sending `credentials` under `tenant_key`.

    The compaction side remembers it per caller (`proxy.pipeline.caller.Caller.of`), so it is computed once per
    caller, not per request.

    :param credentials: The values of its `TENANT_HEADERS`, in their order; "" for a header it does not send.
    """
    material = "\n".join(f"{name}:{value}" for name, value in zip(TENANT_HEADERS, credentials, strict=True))
    return hmac.new(tenant_key.encode(), material.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()[:32]
