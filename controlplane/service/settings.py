"""Controller settings, read from the environment (``KVWISE_`` prefix) in this one place.

Owns every knob of the controller, grouped by concern and documented where declared.
The Helm chart's ``controller.config`` values mirror these one to one (upper-cased with
the prefix). It must never read files or talk to Redis.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from controlplane.fit.settings import FitSettings


class ControllerSettings(BaseSettings, FitSettings):
    """Settings of ``kvwise controller``; the fitting knobs are ``FitSettings``'s."""

    model_config = SettingsConfigDict(env_prefix="KVWISE_", extra="ignore", frozen=False)

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
    consumer_name: str = Field(default="", description="This replica's consumer; default host-pid")
    ingest_count: int = Field(default=64, gt=0, description="Stream entries per XREADGROUP")
    ingest_block_ms: int = Field(default=500, ge=0, description="XREADGROUP block time")
    reclaim_idle_ms: int = Field(
        default=30_000, gt=0, description="Pending entries idle this long are reclaimed"
    )

    # --- fitting (and every field of FitSettings) -------------------------------------
    refit_interval_s: float = Field(default=30.0, gt=0, description="Seconds between refits")
    change_threshold: float = Field(
        default=0.05, ge=0, description="Relative change below which no version is published"
    )

    # --- store and leadership ------------------------------------------------------------
    history_size: int = Field(default=100, ge=2, description="Policy versions kept")
    lease_ttl_s: float = Field(default=10.0, gt=0, description="Leader lease time")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="Log level of the controller process"
    )

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
