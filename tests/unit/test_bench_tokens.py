"""Where ``kvwise bench serve`` reads its two bearer tokens from."""

from __future__ import annotations

import pytest

from controlplane.cli.bench_tokens import CONTROLLER_TOKEN, SERVER_KEY, option_help, read_token


def test_a_variable_of_white_space_is_passed_over_for_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KVWISE_API_READ_TOKEN", " \n")
    monkeypatch.setenv("KVWISE_API_TOKEN", "s3cret\n")
    token = read_token(CONTROLLER_TOKEN, None)
    assert (token.value, token.source) == ("s3cret", "KVWISE_API_TOKEN")
    assert "s3cret" not in repr(token)


def test_the_option_wins_and_an_empty_one_means_no_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KVWISE_API_READ_TOKEN", "r3ad")
    assert read_token(CONTROLLER_TOKEN, "given").source == "--controller-token"
    assert read_token(CONTROLLER_TOKEN, "").value is None


def test_each_options_help_names_the_variables_it_reads_in_order() -> None:
    assert option_help(CONTROLLER_TOKEN, "x") == (
        "Bearer token for x (default: $KVWISE_API_READ_TOKEN, else $KVWISE_API_TOKEN)"
    )
    assert option_help(SERVER_KEY, "y").endswith("(default: $OPENAI_API_KEY)")
