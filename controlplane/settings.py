"""Controller settings, read from the environment (``KVWISE_`` prefix) in this one place.

Owns every knob of the controller, grouped by concern and documented where declared.
The Helm chart's ``controller.config`` values mirror these one to one (upper-cased with
the prefix). It must never read files or talk to Redis.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class ControllerSettings(BaseSettings):
    """Settings of ``kvwise controller``."""

    model_config = SettingsConfigDict(env_prefix="KVWISE_", extra="ignore")

    # --- connections -------------------------------------------------------------------
    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        description="Redis URL (redis:// or rediss:// for TLS; user:password@ for ACLs)",
    )
    key_prefix: str = Field(default="kvwise:", description="Prefix of every Redis key")

    # --- HTTP API ----------------------------------------------------------------------
    host: str = Field(default="127.0.0.1", description="Address the REST API binds")
    port: int = Field(default=8080, ge=1, le=65535, description="Port of the REST API")
    api_token: SecretStr | None = Field(
        default=None, description="Bearer token required for mutations; none = open"
    )

    # --- ingest ------------------------------------------------------------------------
    consumer_group: str = Field(default="controller", description="Stream consumer group")
    consumer_name: str = Field(default="", description="This replica's consumer; default host-pid")
    ingest_count: int = Field(default=64, gt=0, description="Stream entries per XREADGROUP")
    ingest_block_ms: int = Field(default=500, ge=0, description="XREADGROUP block time")
    reclaim_idle_ms: int = Field(
        default=30_000, gt=0, description="Pending entries idle this long are reclaimed"
    )

    # --- fitting -----------------------------------------------------------------------
    refit_interval_s: float = Field(default=30.0, gt=0, description="Seconds between refits")
    window_s: float = Field(default=3600.0, gt=0, description="Sliding window of reuse data")
    min_samples: int = Field(default=200, ge=1, description="Fewer accesses: no own fit")
    near_concurrent_s: float = Field(
        default=0.0, ge=0, description="Reuse gaps below this are not reuse observations"
    )
    life_rule: Literal["quantile", "fixed"] = Field(
        default="quantile", description="How each category's life window is chosen"
    )
    life_quantile: float = Field(
        default=0.9, gt=0, lt=1, description="Reuse-time quantile used as the life window"
    )
    life_s_override: float | None = Field(
        default=0.1,
        gt=0,
        description="One life window for every category (seconds); null = life_rule. The "
        "short default ranks blocks by reuse density (measured: docs/policy.md)",
    )
    window_buckets: int = Field(
        default=120, ge=1, le=10_000, description="Time buckets of the window (its slide step)"
    )
    shrinkage_samples: float = Field(
        default=50.0, ge=0, description="Pseudo-samples of the pooled fit in each category fit"
    )
    rate_min: float = Field(default=1e-6, gt=0, description="Lowest fitted reuse rate (1/s)")
    rate_max: float = Field(default=1e3, gt=0, description="Highest fitted reuse rate (1/s)")
    life_min_s: float = Field(default=0.1, gt=0, description="Shortest fitted life window")
    life_max_s: float = Field(default=3600.0, gt=0, description="Longest fitted life window")
    change_threshold: float = Field(
        default=0.05, ge=0, description="Relative change below which no version is published"
    )

    # --- store and leadership ------------------------------------------------------------
    history_size: int = Field(default=100, ge=2, description="Policy versions kept")
    lease_ttl_s: float = Field(default=10.0, gt=0, description="Leader lease time")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="Log level of the controller process"
    )
