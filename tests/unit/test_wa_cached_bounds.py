"""``wa``'s cost-only shortcuts, against the naive O(N) evictor of ``test_wa_policy``:
many categories whose rates span six orders of magnitude, small evictions while the clock
moves a little at a time, so heads are compared against bounds computed several calls
earlier (never refreshed when ``REFRESH_AFTER_HEADS`` is huge, refreshed at every call
when it is 0), on a clock from 0 and on an epoch-second clock (where the margins of the
bulk takes matter most). The victims must not depend on any of it.
"""

from __future__ import annotations

import random

import pytest

from agent.policies import wa_core
from agent.policies.wa import WAPolicy
from agent.policy_document import CategoryParams, PolicyDocument
from tests.unit.test_wa_policy import NaiveWA, Op, _differential

NAMES = [f"c{i}" for i in range(12)]


def spread_document(rng: random.Random) -> PolicyDocument:
    """Rates from 1e-4 to 100 per second, some categories never reused (``-inf``)."""
    categories = {
        name: CategoryParams(
            rate=10 ** rng.uniform(-4, 2),
            p_reuse=rng.choice([0.0, 0.01, 0.2, 0.9]),
            life_s=rng.choice([0.5, 10.0, 600.0]),
        )
        for name in NAMES
    }
    return PolicyDocument(version=1, categories=categories)


def script(rng: random.Random, steps: int, epoch: float) -> list[Op]:
    """From ``epoch`` on (an empty release sets the clock): releases of a few blocks into
    random categories, hits, and evictions of 1-3 blocks, the clock moving 0-0.3 s between
    operations."""
    ops: list[Op] = [("free", [], True, [0] * 8, epoch, 0)]
    next_block = 0
    for _ in range(steps):
        roll = rng.random()
        dt = rng.choice([0.0, 0.01, 0.05, 0.3])
        if roll < 0.45:
            blocks = list(range(next_block, next_block + rng.randint(1, 6)))
            next_block += len(blocks)
            if rng.random() < 0.3 and next_block > 10:  # a hit, re-released
                blocks = rng.sample(range(next_block - 10, next_block), 3)
            offsets = [rng.randint(0, 6) for _ in range(8)]
            ops.append(("free", blocks, rng.random() < 0.7, offsets, dt, rng.randint(0, 11)))
        elif roll < 0.55:
            ops.append(("touch", [rng.randrange(next_block + 1) for _ in range(2)], dt))
        else:
            ops.append(("evict", rng.randint(1, 3)))
    return ops


@pytest.mark.parametrize("epoch", [0.0, 1.7e9])
@pytest.mark.parametrize("refresh_after", [0, 6, 10**9])
@pytest.mark.parametrize("seed", range(6))
def test_victims_do_not_depend_on_shortcuts(refresh_after: int, seed: int, epoch: float) -> None:
    rng = random.Random(seed)
    document = spread_document(rng)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(wa_core, "REFRESH_AFTER_HEADS", refresh_after)
        fast = WAPolicy(0, category_names=NAMES, doc=document)
        _differential(fast, NaiveWA(NAMES, document, "last"), script(rng, 400, epoch))
