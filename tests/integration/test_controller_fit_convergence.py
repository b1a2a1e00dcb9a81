"""A refit whose fits did not converge says so: counted in a gauge, named in its outcome
and in the published version's note. It failed before its fix."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
import redis

from agent.wire import Keys
from controlplane.fit.reuse_window import ReuseStats
from controlplane.service.checkpoint import encode as encode_checkpoint
from controlplane.service.settings import ControllerSettings
from tests.integration.controller_fixtures import controller

pytestmark = pytest.mark.integration

BUCKETS = 3600
"""One-second buckets: the open exposures' ages fall in one age bin, as the checkpoint
puts them."""


def ridge_checkpoint() -> bytes:
    """A window of one category whose fit stops on its iteration cap: 200 reuses 300 s
    after their access (the reusing accesses open again 600 s ago) and 99,800 accesses
    opened 590 s ago, all still open (gap bin 110, age bin 116: a slow ridge)."""
    settings = ControllerSettings()
    stats = ReuseStats(settings.window_s, n_buckets=BUCKETS)
    now, reused, still_open = time.time(), 200, 99_800
    first = np.full(reused, now - 900.0)
    none = np.full(reused, np.nan)
    stats.ingest(first, np.zeros(reused, np.int32), none, np.full(reused, -1), names=["ridge"])
    stats.ingest(
        first + 300.0,
        np.zeros(reused, np.int32),
        first,
        np.zeros(reused, np.int32),
        names=["ridge"],
    )
    ts = np.full(still_open, now - 590.0)
    stats.ingest(ts, np.zeros(still_open, np.int32), np.full(still_open, np.nan),
                 np.full(still_open, -1), names=["ridge"])  # fmt: skip
    return encode_checkpoint(stats.state(), writer="an-older-leader", process="older")


def test_a_refit_says_how_many_fits_did_not_converge(redis_url: str, key_prefix: str) -> None:
    """``MixtureFit.converged`` was read by nothing: such a fit was published like any
    other, with no count or word of it."""
    r = redis.Redis.from_url(redis_url)
    r.set(Keys(key_prefix).checkpoint, ridge_checkpoint())
    small = {"window_buckets": BUCKETS, "max_categories": 64, "max_categories_per_worker": 64}
    with controller(redis_url, key_prefix, **small) as c:
        outcome = c.refit(manual=True)
        gauge = c.metrics.registry.get_sample_value("kvwise_fit_not_converged")
        doc = c.store.current()
    said = "2 fits did not converge (the pooled fit, 'ridge')"
    assert outcome.published, outcome
    assert outcome.reason == f"published version {outcome.version}; {said}"
    assert gauge == 2
    assert doc is not None and doc.note.endswith(f"; {said}")
    assert doc.categories["ridge"].source == "fit"  # published all the same


def test_the_refit_note_and_checkpoint_line_write_counts_with_separators(
    redis_url: str, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The note said ``refit of 100200 accesses`` and the log ``..., 13675 bytes`` beside
    ``checkpoint written (13,675 bytes)``: counts for people are written one way."""
    r = redis.Redis.from_url(redis_url)
    r.set(Keys(key_prefix).checkpoint, ridge_checkpoint())
    small = {"window_buckets": BUCKETS, "max_categories": 64, "max_categories_per_worker": 64}
    logged = caplog.at_level("INFO", logger="controlplane.service.controller")
    with logged, controller(redis_url, key_prefix, **small) as c:
        c.refit(manual=True)
        doc = c.store.current()
    assert doc is not None and doc.note.startswith("refit of 100,200 accesses ("), doc.note
    loaded = re.search(
        r"loaded the window checkpoint of \d+ s ago: 1 categories, (\S+) bytes", caplog.text
    )
    assert loaded is not None, caplog.text
    assert re.fullmatch(r"\d{1,3}(,\d{3})+", loaded[1]), loaded[1]  # about 10 kB
