"""Which ``KVWISE_*`` variables kvwise reads, and the ones of an environment nothing reads.

Owns the one list of names both sides check an environment against: the agent's settings
(``AgentSettings``), the controller's by name (``CONTROLLER_SETTINGS``: the agent may not
import the controller) and the test suite's own prefixes. The CLI warns on stderr
(``controlplane.cli.common.warn_unknown_variables``), the agent inside an engine in the
engine's log (``warn_of_unread_variables``), in the same words (``agent.unknown_names``). A
controller setting in an engine's environment (one environment for both, a shared
ConfigMap) is no slip and is never warned of. It must never read anything but the
environment.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Final

from agent.settings import AgentSettings
from agent.unknown_names import not_a_setting, unknown_variables

log = logging.getLogger(__name__)

CONTROLLER_SETTINGS: Final = frozenset(
    {
        # ControllerSettings' own: the API, ingest, leases, checkpoints, the window's bounds
        *("host", "port", "api_token", "api_read_token", "allow_open_api", "log_level"),
        *("consumer_group", "consumer_name", "ingest_block_ms", "ingest_count"),
        *("ingest_max_events", "ingest_max_read_bytes", "reclaim_idle_ms", "lease_ttl_s"),
        *("housekeeping_interval_s", "checkpoint_interval_s", "max_checkpoint_bytes"),
        *("restore_wait_s", "stale_consumer_s", "stream_trim_grace_s", "worker_expire_s"),
        *("max_workers", "max_overrides", "history_size", "clock_tolerance_s", "supersede"),
        *("max_categories", "max_categories_per_worker", "max_window_bytes", "refit_interval_s"),
        # FitSettings
        *("window_s", "window_buckets", "min_samples", "change_threshold", "shrinkage_samples"),
        *("near_concurrent_s", "rate_min", "rate_max", "life_rule", "life_quantile"),
        *("life_min_s", "life_max_s", "life_s_override"),
        # ShadowSettings: the shadow, the refit guard, the family selection
        *("shadow_enabled", "shadow_rate", "shadow_window_s", "shadow_buckets"),
        *("shadow_ladder", "shadow_policies", "shadow_key_depth", "shadow_max_capacity"),
        *("shadow_max_kept_blocks", "shadow_max_requests", "guard_margin"),
        *("guard_min_accesses", "guard_max_accesses", "select_enabled", "select_margin"),
        *("select_min_accesses", "select_windows"),
    }
)
"""The controller's settings beyond ``RedisSettings``'s (which the agent has too), by field
name. A test keeps it equal to ``ControllerSettings``'s fields."""
NOT_SETTINGS: Final = ("KVWISE_TEST_", "KVWISE_VLLM_VENV", "KVWISE_SGLANG_VENV", "KVWISE_DOCS_")
"""``KVWISE_*`` names (prefixes) the test suite and its tools read, not settings: never
warned of."""
PREFIX: Final = str(AgentSettings.model_config.get("env_prefix", "")).upper()
"""The settings' prefix, ``KVWISE_``; the controller's is the same."""


def variables_read() -> frozenset[str]:
    """Every ``KVWISE_*`` variable a setting of the agent or the controller reads."""
    fields = CONTROLLER_SETTINGS | set(AgentSettings.model_fields)
    return frozenset(f"{PREFIX}{field}".upper() for field in fields)


def unread_variables(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """Each ``KVWISE_*`` variable of ``environ`` that no setting of the agent or the
    controller reads (names matched ignoring case, as the settings read them), with the
    variable it was surely meant as (``agent.unknown_names.meant``), if one is; in name
    order."""
    return unknown_variables(environ, variables_read(), prefix=PREFIX, not_settings=NOT_SETTINGS)


def warn_of_unread_variables() -> None:
    """Log a warning for each ``KVWISE_*`` variable of this process's environment that
    nothing reads: a misspelt one (``KVWISE_EVICTER=lru``) leaves its setting at the
    default, and the engine would run on without a word of it."""
    for name, close in unread_variables(os.environ):
        log.warning("kvwise: %s", not_a_setting(name, close))
