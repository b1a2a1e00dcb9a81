"""Fitting and controller settings: words from the environment that mean unset, and
bounds that must be in order, numbers that must be finite, ranges that must agree."""

from __future__ import annotations

import pytest
import typer

from agent.settings import AgentSettings, read_agent_settings
from controlplane.cli.common import agent_settings_or_fail
from controlplane.fit.settings import FitSettings
from controlplane.service.settings import MAX_CONSUMER_NAME_CHARS, ControllerSettings
from controlplane.shadow.selection import SelectionSettings


@pytest.mark.parametrize("word", ["", "none", "None", "NULL", "null", " none "])
def test_a_none_word_selects_the_per_category_life_window(
    word: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVWISE_LIFE_S_OVERRIDE", word)
    assert ControllerSettings().life_s_override is None


def test_a_life_window_override_from_the_environment_is_a_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KVWISE_LIFE_S_OVERRIDE", "2.5")
    assert ControllerSettings().life_s_override == 2.5
    monkeypatch.setenv("KVWISE_LIFE_S_OVERRIDE", "nothing")
    with pytest.raises(ValueError, match="life_s_override"):
        ControllerSettings()


@pytest.mark.parametrize(("low", "high"), [("rate_min", "rate_max"), ("life_min_s", "life_max_s")])
def test_inverted_bounds_are_refused_naming_both(low: str, high: str) -> None:
    with pytest.raises(ValueError, match=rf"{low} \(10\) must not exceed {high} \(1\)"):
        FitSettings(**{low: 10, high: 1})
    with pytest.raises(ValueError, match=f"KVWISE_{low.upper()} .* KVWISE_{high.upper()} "):
        ControllerSettings(**{low: 10, high: 1})


@pytest.mark.parametrize(("low", "high"), [("rate_min", "rate_max"), ("life_min_s", "life_max_s")])
def test_equal_bounds_pin_the_fitted_value(low: str, high: str) -> None:
    assert getattr(FitSettings(**{low: 2, high: 2}), high) == 2


def test_ingest_count_stops_where_one_commit_can_still_acknowledge_the_entries() -> None:
    """The commit script acknowledges a pass's entries with ``unpack``, which fails past
    Lua's stack (about 8000): a larger ``ingest_count`` wedged every pass."""
    assert ControllerSettings(ingest_count=4096).ingest_count == 4096
    with pytest.raises(ValueError, match="ingest_count"):
        ControllerSettings(ingest_count=8001)


def test_a_consumer_name_past_a_pod_names_bound_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The consumer name had no bound, and it names the writer in each checkpoint's header:
    one of 70,000 characters made the controller refuse its own checkpoint."""
    longest = "c" * MAX_CONSUMER_NAME_CHARS
    assert ControllerSettings(consumer_name=longest).consumer_name == longest
    monkeypatch.setenv("KVWISE_CONSUMER_NAME", "c" * 70_000)
    with pytest.raises(ValueError, match=r"consumer_name\n.* at most 253 characters"):
        ControllerSettings()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("KVWISE_LEASE_TTL_S", "inf"),  # crashed the lease's first tick
        ("KVWISE_CLOCK_TOLERANCE_S", "inf"),  # kept every event, however far off its clock
        ("KVWISE_REFIT_INTERVAL_S", "nan"),
        ("KVWISE_GUARD_MARGIN", "nan"),
        ("KVWISE_RATE_MAX", "inf"),
    ],
)
def test_a_setting_that_is_not_a_finite_number_is_refused(
    name: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match="finite number"):
        ControllerSettings()


def test_an_agent_setting_that_is_not_a_finite_number_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KVWISE_POLL_INTERVAL_S", "inf")
    with pytest.raises(ValueError, match="finite number"):
        AgentSettings()


def test_one_worker_may_not_bring_in_more_categories_than_the_window_holds() -> None:
    assert ControllerSettings(max_categories=64, max_categories_per_worker=64)
    with pytest.raises(
        ValueError, match=r"PER_WORKER \(1024\) must not exceed KVWISE_MAX_CATEGORIES \(10\)"
    ):
        ControllerSettings(max_categories=10)


def test_a_window_past_max_window_bytes_is_refused_naming_the_settings_and_its_size() -> None:
    """window_buckets x max_categories x gap bins once sized a window of 10.5 GiB (up to
    10,000 buckets were accepted) with nothing refusing it at start."""
    assert ControllerSettings(window_buckets=900)  # 1,017,460,800 bytes: within 1 GiB
    with pytest.raises(ValueError) as refused:
        ControllerSettings(window_buckets=10_000)
    said = str(refused.value)
    assert (
        "KVWISE_WINDOW_BUCKETS (10000) x KVWISE_MAX_CATEGORIES (2048, room for 2048) = "
        "20,480,000 counter rows would size the statistics window at 11,305,120,000 bytes "
        "(10.53 GiB) with KVWISE_WINDOW_S=3600, more than KVWISE_MAX_WINDOW_BYTES "
        "(1,073,741,824)"
    ) in said
    assert ControllerSettings(window_buckets=10_000, max_window_bytes=12 << 30)


@pytest.mark.parametrize(
    ("rule", "variable", "refused", "accepted"),
    [
        ("margin", "KVWISE_SELECT_MARGIN", ["-0.001", "1.001"], ["0", "1"]),
        ("windows", "KVWISE_SELECT_WINDOWS", ["0", "1001"], ["1", "1000"]),
        ("min_accesses", "KVWISE_SELECT_MIN_ACCESSES", ["-1"], ["0"]),
    ],
)
def test_the_family_selection_takes_the_same_range_from_the_environment_as_its_rule(
    rule: str,
    variable: str,
    refused: list[str],
    accepted: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for value in refused:
        monkeypatch.setenv(variable, value)
        with pytest.raises(ValueError, match=f"select_{rule}"):
            ControllerSettings()
        with pytest.raises(ValueError, match=rule):
            SelectionSettings.model_validate({rule: value})
    for value in accepted:
        monkeypatch.setenv(variable, value)
        from_environment = getattr(ControllerSettings().selection, rule)
        assert from_environment == getattr(SelectionSettings.model_validate({rule: value}), rule)


@pytest.mark.parametrize("ttl", ["5", "2"])
def test_a_heartbeat_that_expires_before_the_next_beat_is_refused_naming_both(
    ttl: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TTL not above the interval: the worker's key expired between beats, so it went
    in and out of the controller's view, and nothing said why."""
    monkeypatch.setenv("KVWISE_HEARTBEAT_INTERVAL_S", "5")
    monkeypatch.setenv("KVWISE_HEARTBEAT_TTL_S", ttl)
    with pytest.raises(
        ValueError, match=rf"KVWISE_HEARTBEAT_TTL_S \({ttl}.0\) must exceed KVWISE_HEARTBEAT_INT"
    ):
        AgentSettings()
    monkeypatch.setenv("KVWISE_HEARTBEAT_TTL_S", "5.5")
    assert AgentSettings().heartbeat_ttl_s == 5.5


@pytest.mark.parametrize(
    ("variable", "too_short", "least"),
    [
        ("KVWISE_FLUSH_INTERVAL_S", "1e-6", "0.01"),
        ("KVWISE_POLL_INTERVAL_S", "0.009", "0.01"),
        ("KVWISE_HEARTBEAT_INTERVAL_S", "0.09", "0.1"),
        ("KVWISE_REDIS_TIMEOUT_S", "1e-6", "0.01"),
        ("KVWISE_RECONNECT_MAX_S", "1e-6", "0.01"),
    ],
)
def test_an_agent_wait_too_short_to_leave_the_engine_its_cpu_is_refused_naming_it(
    variable: str,
    too_short: str,
    least: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Any wait above 0 was taken: at 1e-6 s a thread of the agent spun, making a round
    trip to Redis without pause and taking CPU from the engine's process."""
    monkeypatch.setenv(variable, too_short)
    field = variable.removeprefix("KVWISE_").lower()
    with pytest.raises(ValueError, match=rf"{field}\n.*greater than or equal to {least}"):
        AgentSettings()
    with pytest.raises(typer.Exit):
        agent_settings_or_fail({}, {})
    said = " ".join(capsys.readouterr().err.split())
    assert f"bad agent setting {variable}='{too_short}': Input should be greater than" in said
    monkeypatch.setenv(variable, least)
    assert getattr(AgentSettings(), field) == float(least)


def test_an_engine_reads_a_check_across_settings_as_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KVWISE_HEARTBEAT_INTERVAL_S", "5")
    monkeypatch.setenv("KVWISE_HEARTBEAT_TTL_S", "5")
    with pytest.raises(ValueError, match=r"^kvwise: bad agent settings: KVWISE_HEARTBEAT_TTL_S"):
        read_agent_settings()


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:0", "cuda:12", "xpu:1", "mps"])
def test_a_torch_device_kvwise_runs_on_is_taken(device: str) -> None:
    assert AgentSettings(device=device).device == device


@pytest.mark.parametrize("device", ["tpu", "CUDA", "cuda:x", "cuda:-1", "cuda 0", " cpu", ""])
def test_a_device_that_is_not_one_is_refused_at_settings_naming_the_forms(
    device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``KVWISE_DEVICE=tpu`` passed ``kvwise config``; the evictor refused it at start."""
    monkeypatch.setenv("KVWISE_DEVICE", device)
    with pytest.raises(ValueError, match="bad agent setting KVWISE_DEVICE: ") as err:
        read_agent_settings()
    assert "cpu, cuda or cuda:N" in str(err.value)


def test_the_agents_category_limit_has_its_own_name_apart_from_the_controllers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``KVWISE_MAX_CATEGORIES`` set both the controller's window (2048) and the agent's
    limit (1024): one environment could not give each its own."""
    monkeypatch.setenv("KVWISE_MAX_CATEGORIES", "4096")
    monkeypatch.setenv("KVWISE_MAX_TRACKED_CATEGORIES", "512")
    assert ControllerSettings().max_categories == 4096
    assert read_agent_settings().max_tracked_categories == 512


def test_the_old_name_still_sets_an_agent_without_the_new_one_and_says_it_is_deprecated(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("kvwise_max_categories", "300")  # names are read in any case
    assert read_agent_settings().max_tracked_categories == 300
    (said,) = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert said.startswith("KVWISE_MAX_CATEGORIES (300) set the agent's category limit: ")
    assert "set KVWISE_MAX_TRACKED_CATEGORIES" in said
    monkeypatch.setenv("KVWISE_MAX_CATEGORIES", "many")
    with pytest.raises(ValueError, match="KVWISE_MAX_TRACKED_CATEGORIES: "):
        read_agent_settings()


@pytest.mark.parametrize(("given", "level"), [("DEBUG", "debug"), ("Warning", "warning")])
def test_the_log_level_is_taken_in_any_case(
    given: str, level: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``KVWISE_LOG_LEVEL=DEBUG``, as deployments write log levels, stopped the controller
    at start; logging and uvicorn take either case."""
    monkeypatch.setenv("KVWISE_LOG_LEVEL", given)
    assert ControllerSettings().log_level == level
    monkeypatch.setenv("KVWISE_LOG_LEVEL", "verbose")
    with pytest.raises(ValueError, match="log_level"):
        ControllerSettings()
