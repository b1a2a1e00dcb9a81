"""Controller settings read from the environment: words that mean unset, and bounds that
must be in order."""

from __future__ import annotations

import pytest

from controlplane.service.settings import ControllerSettings


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
