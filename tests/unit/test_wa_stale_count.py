"""``wa``'s count of the stale positions its queues hold, which decides when they are
compacted: it must stay exact (positions held less evictable blocks) through touches,
second releases, blocks named twice in one release, evictions that pass over stale
positions, and compactions, so that the queues stay bounded and are not compacted while
their stale positions have already been passed over.
"""

from __future__ import annotations

import random

import pytest

from agent.policies import wa_core
from agent.policies.wa import WAPolicy
from agent.policy_document import CategoryParams, PolicyDocument

NAMES = ["a", "b", "c"]


def stale_held(policy: WAPolicy) -> int:
    """Positions the queues hold (from each run's read position on) less the live ones."""
    held = sum(len(run.blocks) - run.at for lane in policy._lanes.values() for run in lane.runs)
    return held - len(policy._ev)


def stale_counted(policy: WAPolicy) -> int:
    return policy._stale - sum(lane.stale_dropped for lane in policy._lanes.values())


@pytest.mark.parametrize("slack", [0, 8, 1 << 16])
@pytest.mark.parametrize("seed", range(4))
def test_the_stale_count_is_exact_and_bounds_the_queues(slack: int, seed: int) -> None:
    rng = random.Random(seed)
    document = PolicyDocument(
        version=1,
        categories={
            name: CategoryParams(rate=rng.uniform(0.01, 1.0), p_reuse=0.5, life_s=60.0)
            for name in NAMES
        },
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(wa_core, "COMPACT_SLACK", slack)
        policy = WAPolicy(0, category_names=NAMES, doc=document)
        now = 0.0
        for _ in range(3000):
            now += rng.choice([0.0, 0.1, 1.0])
            roll = rng.random()
            if roll < 0.5:
                blocks = [rng.randrange(200) for _ in range(rng.randint(1, 12))]
                offsets = range(len(blocks) - 1, -1, -1)
                policy.free(blocks, offsets, now, rng.randrange(len(NAMES)))
                assert stale_held(policy) <= len(policy._ev) + slack  # checked at a release
            elif roll < 0.8:
                policy.touch([rng.randrange(200) for _ in range(rng.randint(1, 8))], now)
            else:
                policy.evict(rng.randint(1, 10))
            assert stale_counted(policy) == stale_held(policy)
