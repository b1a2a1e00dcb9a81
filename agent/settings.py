"""Agent settings, read from the environment (``KVWISE_`` prefix) in this one place.

Owns every knob of the agent inside an inference worker. Helm values under ``workers``
mirror these one to one. It must never read anything but the environment.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Annotated, Final, Self

from pydantic import (
    BaseModel,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent.wire import BatchLimits, Keys

log = logging.getLogger(__name__)

MIN_WAIT_S = 0.01
"""The shortest wait of an agent thread (flush, poll, backoff, Redis timeout) a setting may
ask: shorter, the thread spins on Redis round trips and takes the engine process's CPU."""
MIN_HEARTBEAT_S = 0.1
"""The shortest heartbeat period: a beat is a write the controller reads at its own pace."""

Wait = Annotated[float, Field(ge=MIN_WAIT_S)]
"""An agent thread's wait (seconds), ``MIN_WAIT_S`` at least."""

DEVICE_TYPES: Final = ("cpu", "cuda", "xpu", "hpu", "mps")
"""The torch device types the device evictor may be put on, by torch's names: a device is
one of them, or one with ``:N`` (the index of one of its kind), as ``torch.device`` reads
it. Checked here without torch (the agent runs without it); whether this machine's torch
can use the device is found when the evictor is built (``agent.device_evictor``)."""
_DEVICE: Final = re.compile(rf"(?:{'|'.join(DEVICE_TYPES)})(?::[0-9]+)?")


class RedisSettings(BaseModel):
    """Where kvwise's Redis is: the same three settings for agents and the controller."""

    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        description="Redis URL (redis:// or rediss:// for TLS; user:password@ for ACLs)",
    )
    redis_cluster: bool = Field(
        default=False, description="The URL names a node of a Redis Cluster (cluster client)"
    )
    key_prefix: str = Field(
        default="kvwise:",
        description="Prefix of every Redis key; no braces (kvwise adds the hash tags)",
    )

    @field_validator("key_prefix")
    @classmethod
    def _keys_take_the_prefix(cls, prefix: str) -> str:
        """Refused here, as a setting, what the key builder would refuse at start."""
        Keys(prefix)  # raises WireError, a ValueError, e.g. on braces (hash tags)
        return prefix


class AgentSettings(BaseSettings, RedisSettings):
    """What an engine process needs to join kvwise."""

    model_config = SettingsConfigDict(env_prefix="KVWISE_", extra="ignore", allow_inf_nan=False)

    enable: bool = Field(default=False, description="Turn the agent (and engine plugin) on")
    worker_id: str = Field(default="", description="This worker's id; default host-pid")
    evictor: str = Field(default="wa", description="Policy name: wa, lru, ... or 'device'")
    device: str = Field(
        default="cpu",
        description="Device of the torch evictor: cpu, cuda or cuda:N (N the GPU's index); "
        "also xpu, hpu, mps, each with :N",
    )
    buffer_events: PositiveInt = Field(
        default=1 << 18, description="Events held before the publisher drops"
    )
    batch_events: PositiveInt = Field(default=8192, description="Events per stream entry")
    flush_interval_s: Wait = Field(
        default=0.2, description="Longest wait to send (s, at least 0.01)"
    )
    stream_maxlen: PositiveInt = Field(default=10_000, description="XADD MAXLEN ~ per worker")
    poll_interval_s: Wait = Field(
        default=2.0,
        description="Polling of the current policy (s, at least 0.01; pub/sub is a hint)",
    )
    heartbeat_interval_s: float = Field(
        default=5.0, ge=MIN_HEARTBEAT_S, description="Heartbeat period (s, at least 0.1)"
    )
    heartbeat_ttl_s: PositiveFloat = Field(
        default=30.0, description="Heartbeat key TTL; more than heartbeat_interval_s"
    )
    redis_timeout_s: Wait = Field(
        default=2.0, description="Connect and socket timeout of every Redis call (s, at least 0.01)"
    )
    reconnect_max_s: Wait = Field(
        default=5.0, description="Longest wait between reconnection attempts (s, at least 0.01)"
    )
    ghost_blocks: NonNegativeInt = Field(
        default=0, description="Evicted blocks whose last access is still remembered (0 = capacity)"
    )
    reuse_classes: bool = Field(
        default=False,
        description="Split each category in two reuse classes: blocks a request found "
        "cached or re-inserts after a recent eviction (name/re) and the others, each with "
        "its own fitted curve",
    )
    reuse_ghost_blocks: NonNegativeInt = Field(
        default=0,
        description="Evicted blocks that reuse classes count as returns when inserted again "
        "(0 = 16 x capacity)",
    )
    max_policy_bytes: int = Field(
        default=2 << 20,
        ge=1024,
        description="Largest policy document accepted (bytes, at least 1024); it bounds the "
        "GIL the subscriber holds to parse one (the engine's thread waits meanwhile)",
    )
    max_policy_categories: PositiveInt = Field(
        default=4096, description="Most categories a policy document may hold"
    )
    max_tracked_categories: int = Field(
        default=BatchLimits.max_categories,
        gt=1,
        description="Distinct categories tracked; later ones share 'other'. At most the "
        "controller's KVWISE_MAX_CATEGORIES_PER_WORKER. Unset, KVWISE_MAX_CATEGORIES is read "
        "in its place (deprecated: that name is the controller's window)",
    )

    @model_validator(mode="before")
    @classmethod
    def _the_deprecated_name_of_the_category_limit(cls, data: object) -> object:
        """``KVWISE_MAX_CATEGORIES`` where ``KVWISE_MAX_TRACKED_CATEGORIES`` is not set (the
        name both sides once shared), said as deprecated."""
        old = category_limit_by_deprecated_name()
        if old is None or not isinstance(data, dict) or "max_tracked_categories" in data:
            return data
        log.warning(
            "%s (%s) set the agent's category limit: deprecated, the name is the controller's "
            "window; set KVWISE_MAX_TRACKED_CATEGORIES",
            DEPRECATED_CATEGORY_LIMIT,
            old,
        )
        return {**data, "max_tracked_categories": old}

    @field_validator("device")
    @classmethod
    def _a_torch_device_kvwise_runs_on(cls, device: str) -> str:
        if not _DEVICE.fullmatch(device):
            kinds = ", ".join(DEVICE_TYPES[2:])
            raise ValueError(
                f"not a device the torch evictor runs on: cpu, cuda or cuda:N (N the GPU's "
                f"index); also {kinds}, each with :N"
            )
        return device

    @model_validator(mode="after")
    def _heartbeat_outlives_its_interval(self) -> Self:
        """A key that expires before the next beat takes the worker in and out of view."""
        if self.heartbeat_ttl_s <= self.heartbeat_interval_s:
            raise ValueError(
                f"KVWISE_HEARTBEAT_TTL_S ({self.heartbeat_ttl_s}) must exceed "
                f"KVWISE_HEARTBEAT_INTERVAL_S ({self.heartbeat_interval_s}): the heartbeat "
                "would expire between beats"
            )
        return self


DEPRECATED_CATEGORY_LIMIT: Final = "KVWISE_MAX_CATEGORIES"
"""The agent's category limit as it was once named, the controller's window's name too."""


def environment_value(name: str) -> str | None:
    """The environment's value of ``name``, read as the settings read it (any case)."""
    names = {key.upper(): value for key, value in os.environ.items()}
    return names.get(name.upper())


def category_limit_by_deprecated_name() -> str | None:
    """``KVWISE_MAX_CATEGORIES`` where it sets the agent's category limit: where
    ``KVWISE_MAX_TRACKED_CATEGORIES`` is not set."""
    if environment_value("KVWISE_MAX_TRACKED_CATEGORIES") is not None:
        return None
    return environment_value(DEPRECATED_CATEGORY_LIMIT)


def agent_enabled() -> bool:
    """Whether ``KVWISE_ENABLE`` turns the agent on, read alone.

    An engine plugin asks this before reading ``AgentSettings``: a bad value of another
    ``KVWISE_*`` setting must not stop an engine that runs without kvwise. A bad value of
    ``KVWISE_ENABLE`` itself is an error naming it.
    """
    prefix = AgentSettings.model_config.get("env_prefix", "")
    raw = environment_value(f"{prefix}ENABLE")
    if raw is None:
        return bool(AgentSettings.model_fields["enable"].default)
    try:
        return TypeAdapter(bool).validate_python(raw)
    except ValueError:
        raise ValueError(f"{prefix}ENABLE: {raw!r} is not a boolean (1/0, true/false)") from None


def read_agent_settings() -> AgentSettings:
    """``AgentSettings`` from the environment, for an engine plugin: a bad value is a
    ``ValueError`` of one line naming its ``KVWISE_*`` variable and why (not the value,
    which may hold a password), rather than pydantic's report naming a field."""
    try:
        return AgentSettings()
    except ValidationError as exc:
        error = exc.errors()[0]
        reason = error["msg"].removeprefix("Value error, ")
        if not error["loc"]:  # a check across settings names them itself
            raise ValueError(f"kvwise: bad agent settings: {reason}") from None
        raise bad_agent_setting(str(error["loc"][0]), reason) from None


def bad_agent_setting(field: str, reason: str) -> ValueError:
    """The one-line error an engine plugin stops on for a bad value of the setting
    ``field``: it names the ``KVWISE_*`` variable and why (``reason`` shows no secret)."""
    prefix = AgentSettings.model_config.get("env_prefix", "")
    variable = f"{prefix}{field}".upper()
    return ValueError(f"kvwise: bad agent setting {variable}: {reason}")
