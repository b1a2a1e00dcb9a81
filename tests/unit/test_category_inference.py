"""``agent.category_inference``: categories inferred from block hashes and prompt length,
on hand-made request streams whose right answers are derived in the comments."""

from __future__ import annotations

import pytest

from agent.category_inference import CategoryInferrer, InferSettings

S = [100, 101]  # a system prompt: two blocks every user's first turn starts with


def turns(inf: CategoryInferrer, *requests: list[int]) -> list[int]:
    """Inferred turn of each request, in order."""
    out = []
    for req in requests:
        name = inf.infer(req)
        out.append(int(name[1 : name.index("_")]))
    return out


def test_turn_follows_a_shared_prefix() -> None:
    inf = CategoryInferrer()
    # A: nothing seen -> turn 1. B extends A's four blocks (a next turn): its prefix ends
    # where A ended, after a block nobody diverged from -> turn(A) + 1 = 2. C extends B:
    # block 4 is now common (B diverged after it), but 5, 6 (B's) are not -> turn(6) + 1.
    # D extends C: the cap (3) holds.
    a = [1, 2, 3, 4]
    b = [*a, 5, 6]
    c = [*b, 7, 8]
    d = [*c, 9]
    assert turns(inf, a, b, c, d) == [1, 2, 3, 3]


def test_a_shared_system_prompt_alone_is_not_a_next_turn() -> None:
    inf = CategoryInferrer()
    # U1 creates S. U2 is the one mistake (documented): nobody has diverged after S yet, so
    # its shared S looks like U1's conversation. From then on S's last block is common:
    # users U3..U6 share only common blocks -> turn 1, however many of them.
    users = [[*S, 200 + 10 * u, 201 + 10 * u] for u in range(6)]
    assert turns(inf, *users) == [1, 2, 1, 1, 1, 1]
    # U4's next turn shares S (common) and U4's own blocks (private) -> turn 2.
    u4_next = [*users[3], 999]
    assert turns(inf, u4_next) == [2]
    # A long document shared by many, after S: common once two requests diverged past it.
    doc = list(range(500, 540))
    readers = [[*S, *doc, 1000 + r] for r in range(4)]
    assert turns(inf, *readers) == [1, 2, 1, 1]


def test_an_exact_repeat_continues_its_creator_and_a_branch_is_not_common() -> None:
    inf = CategoryInferrer()
    a = [1, 2, 3]
    # A again (a regenerated answer): the whole prompt is shared and private -> turn 2.
    assert turns(inf, a, a) == [1, 2]
    # A branch of A's conversation: it shares A, diverges after 3 -> turn 2; a second
    # branch now finds 3 common (one divergence) and only common blocks -> turn 1.
    assert turns(inf, [*a, 4], [*a, 5]) == [2, 1]


def test_new_token_buckets_and_names() -> None:
    s = InferSettings(new_token_edges=(1024, 4096))
    inf = CategoryInferrer(s)
    assert inf.infer([1, 2]) == "t1_n0"  # 2 blocks x 16 tokens, all new
    assert inf.infer([10, 11], n_tokens=1024) == "t1_n1"
    assert inf.infer([20, 21], n_tokens=5000) == "t1_n2"
    # Shares [20, 21] (32 tokens): 5010 - 32 = 4978 new tokens -> bucket 2; turn 2.
    assert inf.infer([20, 21, 22], n_tokens=5010) == "t2_n2"
    # Shares all three blocks (48 tokens) and adds 1000: bucket 0.
    assert inf.infer([20, 21, 22, 23], n_tokens=1048) == "t3_n0"
    assert set(s.names()) == {f"t{t}_n{b}" for t in (1, 2, 3) for b in (0, 1, 2)}


def test_block_size_sets_the_shared_tokens() -> None:
    # Mooncake-sized blocks: a follow-up sharing 4 blocks of 512 tokens adds 300 tokens.
    inf = CategoryInferrer(InferSettings(block_tokens=512, new_token_edges=(128, 1024)))
    assert inf.infer([1, 2, 3, 4], n_tokens=2000) == "t1_n2"
    assert inf.infer([1, 2, 3, 4, 5], n_tokens=2348) == "t2_n1"


def test_memory_is_bounded_and_forgetting_makes_a_first_turn() -> None:
    inf = CategoryInferrer(InferSettings(max_blocks=4))
    assert turns(inf, [1, 2, 3]) == [1]
    assert turns(inf, [7, 8, 9]) == [1]
    assert len(inf) == 4  # 1 and 2 forgotten: least recently seen first
    # [1, 2, 3] again: block 1 was forgotten, so nothing is shared -> turn 1.
    assert turns(inf, [1, 2, 3]) == [1]
    assert len(inf) <= 4


@pytest.mark.parametrize(
    "bad",
    [
        {"max_blocks": 0},
        {"common_branches": 0},
        {"max_turn": 0},
        {"max_turn": 16},
        {"new_token_edges": (10, 5)},
    ],
)
def test_settings_are_checked(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        InferSettings(**bad)  # type: ignore[arg-type]
