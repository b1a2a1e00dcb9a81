"""``wa``'s hits retire the stale tails of the runs that released their blocks last
(``agent.policies.wa_queue.retire_tails``): on requests that share system prompts and
continue conversations, hits touched in prompt order (a prefix, sometimes with blocks in
use before it, sometimes out of order), released tail first or not, twice in one release,
at one stamp (runs merged at the head), under both attributions and with compaction
forced, the victims are the naive evictor's and the count of stale positions held stays
exact.
"""

from __future__ import annotations

import random

import pytest

from agent.policies import wa_core
from agent.policies.wa import WAPolicy
from agent.policies.wa_core import Attribution
from agent.policy_document import CategoryParams, PolicyDocument
from tests.unit.test_wa_policy import NaiveWA
from tests.unit.test_wa_stale_count import stale_counted, stale_held

NAMES = ["a", "b", "c", "d"]
CAPACITY = 60


def document(rng: random.Random) -> PolicyDocument:
    categories = {
        name: CategoryParams(
            rate=rng.uniform(0.01, 1.0), p_reuse=rng.uniform(0.1, 0.9), life_s=60.0
        )
        for name in NAMES
    }
    return PolicyDocument(version=1, categories=categories)


class Requests:
    """Prompts behind one of three system prompts, half of them next turns."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.systems = [list(range(-4 * (i + 1), -4 * i)) for i in range(3)]
        self.recent: list[list[int]] = []
        self.next_block = 0

    def prompt(self) -> list[int]:
        rng = self.rng
        grow = rng.randint(1, 12)
        new = list(range(self.next_block, self.next_block + grow))
        self.next_block += grow
        if self.recent and rng.random() < 0.5:
            prompt = rng.choice(self.recent) + new
        else:
            prompt = rng.choice(self.systems) + new
        self.recent = [*self.recent[-20:], prompt]
        return prompt


def hits_of(rng: random.Random, policy: WAPolicy, prompt: list[int]) -> list[int]:
    """The cached blocks of ``prompt`` in prompt order, sometimes shuffled or cut."""
    hits = [block for block in prompt if block in policy]
    roll = rng.random()
    if roll < 0.1:
        rng.shuffle(hits)
    elif roll < 0.2 and hits:
        hits = hits[rng.randrange(len(hits)) :]
    return hits


@pytest.mark.parametrize("attribution", ["last", "creator"])
@pytest.mark.parametrize("slack", [0, 1 << 16])
@pytest.mark.parametrize("seed", range(4))
def test_retired_tails_keep_the_victims_and_the_stale_count(
    attribution: Attribution, slack: int, seed: int
) -> None:
    rng = random.Random(seed)
    doc = document(rng)
    requests = Requests(rng)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(wa_core, "COMPACT_SLACK", slack)
        fast = WAPolicy(0, category_names=NAMES, doc=doc, attribution=attribution)
        naive = NaiveWA(NAMES, doc, attribution)
        now = 0.0
        for _ in range(600):
            now += rng.choice([0.0, 0.0, 0.5, 2.0])
            prompt = requests.prompt()
            hits = hits_of(rng, fast, prompt)
            if rng.random() < 0.1 and hits:  # some of the hits stay in use a while
                fast.touch(hits[:2], now)
                naive.touch(hits[:2], now)
            fast.touch(hits, now)
            naive.touch(hits, now)
            released = prompt[::-1]
            if rng.random() < 0.05:
                released = [*released, released[0]]  # a block named twice
            if rng.random() < 0.1:
                offsets = list(range(len(released)))  # head first: sorted when filed
            else:
                offsets = list(range(len(released) - 1, -1, -1))
            code = rng.randrange(len(NAMES))
            fast.free(released, offsets, now, code)
            naive.free(released, offsets, now, code)
            excess = len(fast) - CAPACITY
            if excess > 0:
                assert fast.evict(excess) == naive.evict(excess)
            assert stale_counted(fast) == stale_held(fast)
        held = len(fast)
        assert fast.evict(held) == naive.evict(held)
        assert not fast._tails  # every run left, and its entry with it
