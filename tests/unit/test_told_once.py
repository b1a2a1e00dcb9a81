"""ToldOnce: a key is told the first time it comes, again only once forgotten, and a full
memory tells (and remembers) no new key."""

from __future__ import annotations

from controlplane.told_once import ToldOnce


def test_a_key_is_told_once_until_forgotten() -> None:
    told: ToldOnce[str] = ToldOnce()
    assert told.first("w1") and not told.first("w1")
    told.forget("w1")
    assert told.first("w1")


def test_keep_only_forgets_the_keys_gone() -> None:
    told: ToldOnce[str] = ToldOnce()
    assert told.first("w1") and told.first("w2")
    told.keep_only(["w2", "w3"])
    assert sorted(told) == ["w2"] and "w1" not in told and told.first("w1")


def test_a_full_memory_neither_tells_nor_remembers_a_new_key() -> None:
    told: ToldOnce[str] = ToldOnce(cap=2)
    assert told.first("a") and told.first("b")
    assert not told.first("c") and "c" not in told and len(told) == 2
    told.forget("a")
    assert told.first("c")
