"""Controller settings, read from the environment (``KVWISE_`` prefix) in this one place.

Owns every knob of the controller, grouped by concern and documented where declared.
The Helm chart's ``controller.config`` values mirror these one to one (upper-cased with
the prefix). It must never read files or talk to Redis.
"""

from __future__ import annotations

from typing import Final, Literal, Self

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent.policy_document import DEFAULT_SUPERSEDE, SupersedeRule
from agent.settings import RedisSettings
from agent.wire import BatchLimits
from controlplane.fit.reuse_window import category_capacity, counter_bytes
from controlplane.fit.settings import FitSettings
from controlplane.service.store_terms import MAX_FITTED_CATEGORIES
from controlplane.shadow.settings import ShadowSettings

MAX_CONSUMER_NAME_CHARS: Final = 253
"""Longest ``consumer_name`` (a Kubernetes pod name's bound): it also names the writer in
the header of each checkpoint, whose size the controller bounds when it reads one back."""


class ControllerSettings(BaseSettings, RedisSettings, FitSettings, ShadowSettings):
    """Settings of ``kvwise controller``; Redis's are ``RedisSettings``'s (shared with the
    agents), the fitting knobs ``FitSettings``'s, the shadow evaluation's and the refit
    guard's ``ShadowSettings``'s."""

    model_config = SettingsConfigDict(
        env_prefix="KVWISE_", extra="ignore", frozen=False, allow_inf_nan=False
    )

    # --- HTTP API ----------------------------------------------------------------------
    host: str = Field(default="127.0.0.1", description="Address the REST API binds")
    port: int = Field(default=8080, ge=1, le=65535, description="Port of the REST API")
    api_token: SecretStr | None = Field(
        default=None,
        description="Bearer token required for mutations (and accepted for reads); none = open",
    )
    api_read_token: SecretStr | None = Field(
        default=None,
        description="Bearer token required for reads (GET /v1/*, /metrics); none = reads open",
    )
    allow_open_api: bool = Field(
        default=False,
        description="Start without KVWISE_API_TOKEN on a non-loopback address (open mutations)",
    )
    max_overrides: int = Field(default=256, ge=1, description="Categories pinned at most")

    # --- ingest ------------------------------------------------------------------------
    consumer_group: str = Field(default="controller", description="Stream consumer group")
    consumer_name: str = Field(
        default="",
        max_length=MAX_CONSUMER_NAME_CHARS,
        description=f"This replica's consumer, {MAX_CONSUMER_NAME_CHARS} characters at most; "
        "default host-pid",
    )
    ingest_count: int = Field(
        default=64,
        gt=0,
        le=4096,
        description="Entries read per stream per ingest pass, at most (up to 4096: one Lua "
        "call acknowledges them, and Lua's stack takes about 8000)",
    )
    ingest_block_ms: NonNegativeInt = Field(
        default=500, description="Wait after an ingest pass that found nothing (ms)"
    )
    reclaim_idle_ms: PositiveInt = Field(
        default=30_000, description="Pending entries idle this long are reclaimed"
    )
    ingest_max_events: PositiveInt = Field(
        default=BatchLimits.max_events,
        description="Events one stream entry may hold; more: dead-lettered",
    )
    ingest_max_read_bytes: int = Field(
        default=32 << 20, ge=1 << 20, description="Bytes one ingest pass may read, about"
    )
    clock_tolerance_s: PositiveFloat = Field(
        default=60.0,
        description="Events further than this from the controller's clock are dropped, counted",
    )
    stream_trim_grace_s: NonNegativeFloat = Field(
        default=30.0,
        description="While kvwise trace record runs, acknowledged stream entries are trimmed "
        "only once this old, so that it reads them too (else at once)",
    )
    max_categories: int = Field(
        default=MAX_FITTED_CATEGORIES,
        ge=2,
        description="Categories the statistics window holds, in all",
    )
    max_window_bytes: int = Field(
        default=1 << 30,
        ge=1 << 20,
        description="Largest statistics window the controller starts with: its counters, "
        "window_buckets x max_categories (room rounded up to a power of two) x (16 + 4 per "
        "gap bin) bytes (docs/fitting.md); a snapshot or checkpoint briefly copies as much again",
    )
    max_categories_per_worker: int = Field(
        default=BatchLimits.max_categories,
        ge=2,
        description="Categories one worker may name (the agents' KVWISE_MAX_TRACKED_CATEGORIES) "
        "and bring in",
    )

    max_workers: int = Field(
        default=1024,
        ge=1,
        description="Worker streams ingested and shadowed, and heartbeats read, at most; a "
        "stream found past this is not read (counted in kvwise_ingest_streams_refused) until "
        "one ingested expires, a heartbeat past it not listed (kvwise_agents_not_listed)",
    )

    # --- housekeeping and checkpoints -----------------------------------------------------
    housekeeping_interval_s: PositiveFloat = Field(
        default=60.0, description="Seconds between sweeps of dead workers and consumers"
    )
    worker_expire_s: PositiveFloat = Field(
        default=3600.0,
        description="A worker with no entry and no heartbeat this long: its stream is deleted",
    )
    stale_consumer_s: PositiveFloat = Field(
        default=600.0, description="A consumer idle this long with nothing pending is removed"
    )
    checkpoint_interval_s: PositiveFloat = Field(
        default=60.0, description="Seconds between checkpoints of the statistics window"
    )
    max_checkpoint_bytes: int = Field(
        default=64 << 20,
        ge=1 << 16,
        description="Largest checkpoint written, or read back (compressed; a larger one "
        "stored is not read)",
    )

    # --- fitting (and every field of FitSettings) -------------------------------------
    refit_interval_s: PositiveFloat = Field(
        default=30.0, description="Seconds between refits (none published while no access arrives)"
    )

    # --- store and leadership ------------------------------------------------------------
    history_size: int = Field(default=100, ge=2, description="Policy versions kept")
    supersede: SupersedeRule = Field(
        default=DEFAULT_SUPERSEDE,
        description="The supersede rule each published document carries: tree (vLLM agents "
        "under wa and SGLang agents evict first the cached branches newer requests left) or off",
    )
    lease_ttl_s: PositiveFloat = Field(default=10.0, description="Leader lease time")
    restore_wait_s: NonNegativeFloat = Field(
        default=6.0,
        description="Seconds the leader waits, once Redis has lost the policy (restarted "
        "empty), before restoring it: the workers' heartbeats come back meanwhile, and the "
        "restored version is numbered after any version they hold (at least the agents' "
        "heartbeat interval)",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="Log level of the controller process"
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _any_case(cls, level: object) -> object:
        """``DEBUG`` as ``debug``: logging and uvicorn take either case, and so do most
        deployments' ``LOG_LEVEL`` values."""
        return level.lower() if isinstance(level, str) else level

    @field_validator("api_token", "api_read_token")
    @classmethod
    def _no_blank_token(cls, token: SecretStr | None) -> SecretStr | None:
        if token is not None and not token.get_secret_value().strip():
            raise ValueError("a token must not be empty or blank; unset it to run without one")
        return token

    @field_validator("api_read_token")
    @classmethod
    def _read_token_beside_api_token(
        cls, read: SecretStr | None, info: ValidationInfo
    ) -> SecretStr | None:
        write = info.data.get("api_token")
        if read is None:
            return read
        if write is None:
            raise ValueError("needs KVWISE_API_TOKEN too (else reads are closed, writes open)")
        if read.get_secret_value() == write.get_secret_value():
            raise ValueError("must differ from KVWISE_API_TOKEN")
        return read

    @model_validator(mode="after")
    def _one_worker_fits_the_window(self) -> Self:
        """A worker may bring in no more categories than the window holds in all."""
        if self.max_categories_per_worker > self.max_categories:
            raise ValueError(
                f"KVWISE_MAX_CATEGORIES_PER_WORKER ({self.max_categories_per_worker}) must "
                f"not exceed KVWISE_MAX_CATEGORIES ({self.max_categories})"
            )
        return self

    @model_validator(mode="after")
    def _window_fits_its_bound(self) -> Self:
        """The window's counters, sized by these settings, within ``max_window_bytes``:
        refused at start, not found out as an out-of-memory kill under load."""
        size = counter_bytes(self.window_s, self.window_buckets, self.max_categories)
        if size > self.max_window_bytes:
            room = category_capacity(self.max_categories)
            raise ValueError(
                f"KVWISE_WINDOW_BUCKETS ({self.window_buckets}) x KVWISE_MAX_CATEGORIES "
                f"({self.max_categories}, room for {room}) = {self.window_buckets * room:,} "
                f"counter rows would size the statistics window at {size:,} bytes "
                f"({size / 2**30:.2f} GiB) with KVWISE_WINDOW_S={self.window_s:g}, more than "
                f"KVWISE_MAX_WINDOW_BYTES ({self.max_window_bytes:,})"
            )
        return self
