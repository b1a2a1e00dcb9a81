"""The device evictor's device step, the pass over every category's bound, against the
numpy pass of ``wa`` on the same state, and against the naive O(N) evictor with a fresh
device pass on every eviction (so every call's heads are chosen by device bounds). The
scripts are ``test_wa_cached_bounds``'s: many categories with rates over six orders of
magnitude, categories never reused (``-inf``), a clock from 0 and an epoch clock.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from agent.device_evictor import DeviceEvictor
from agent.policies import wa_core
from agent.policies.wa import WAPolicy
from tests.unit.test_device_evictor import _one_torch_thread  # noqa: F401 (autouse: one thread)
from tests.unit.test_wa_cached_bounds import NAMES, script, spread_document
from tests.unit.test_wa_policy import NaiveWA, _differential


@pytest.mark.parametrize("epoch", [0.0, 1.7e9])
@pytest.mark.parametrize("seed", range(4))
def test_a_device_pass_on_every_eviction_keeps_the_victims(seed: int, epoch: float) -> None:
    rng = random.Random(seed)
    document = spread_document(rng)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(wa_core, "REFRESH_AFTER_HEADS", 0)
        device = DeviceEvictor.simulated(64, category_names=NAMES, doc=document)
        _differential(device, NaiveWA(NAMES, document, "last"), script(rng, 400, epoch))


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("seed", range(3))
def test_device_bounds_are_the_numpy_bounds(seed: int) -> None:
    """Bit for bit, NaN rows (categories found empty) last, and each row's own bound."""
    check_bounds(seed, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("seed", range(3))
def test_device_bounds_are_the_numpy_bounds_on_cuda(seed: int) -> None:
    """The same on the GPU: no fused multiply-add may change a bound."""
    check_bounds(seed, "cuda")


def check_bounds(seed: int, device_name: str) -> None:
    rng = random.Random(seed)
    document = spread_document(rng)
    device = DeviceEvictor(64, device=device_name, category_names=NAMES, doc=document)
    now = 1.7e9
    for block in range(200):
        now += rng.choice([0.0, 0.01, 0.3, 5.0])
        device.free([block], [rng.randint(0, 5)], now, rng.randrange(len(NAMES)))
        if rng.random() < 0.3:
            device.evict(rng.randint(1, 4))
        if block % 20 == 19:
            got, rows = device._sorted_bounds(now)
            want, want_rows = WAPolicy._sorted_bounds(device, now)
            assert all(map(same, got, want))
            assert sorted(rows) == sorted(want_rows) == list(range(len(rows)))
            unsorted = dict(zip(want_rows, want, strict=True))
            assert all(same(bound, unsorted[row]) for bound, row in zip(got, rows, strict=True))
