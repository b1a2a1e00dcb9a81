"""``wa``'s category queue of runs, read without taking: ``peek`` lists the first live
entries in key order ``(t, -offset, release number)``, across runs, merging the runs of
one stamp that interleave and skipping stale positions, and leaves the queue as it was.
"""

from __future__ import annotations

from agent.policies.wa_queue import Evictable, Run, TimeQueue


def queue_of(
    releases: list[tuple[float, list[int], list[int]]],
) -> tuple[TimeQueue, Evictable]:
    """A queue filled by these ``(t, blocks, offsets)`` releases, in order."""
    queue, evictable, release = TimeQueue(), {}, 0
    for t, blocks, offsets in releases:
        numbers = list(range(release, release + len(blocks)))
        queue.add(Run.numbered(t, blocks, offsets, numbers))
        evictable.update(zip(blocks, numbers, strict=True))
        release += len(blocks)
    return queue, evictable


def test_peek_lists_live_entries_in_key_order_across_runs() -> None:
    queue, evictable = queue_of(
        [
            (1.0, [10, 11, 12], [2, 1, 0]),  # tail first: in key order
            (2.0, [20, 21], [0, 1]),  # head first: sorted when filed
            (2.0, [30, 31], [5, 0]),  # same stamp, interleaves with the run before
            (3.0, [40], [0]),
        ]
    )
    del evictable[11]  # touched: its position goes stale
    expected = [
        (1.0, -2, 0, 10),
        (1.0, 0, 2, 12),
        (2.0, -5, 5, 30),
        (2.0, -1, 4, 21),
        (2.0, 0, 3, 20),
        (2.0, 0, 6, 31),
        (3.0, 0, 7, 40),
    ]
    assert queue.peek(evictable, 100) == expected
    assert queue.peek(evictable, 3) == expected[:3]
    assert queue.head(evictable) == expected[0]  # nothing was taken
    assert len(evictable) == 7


def test_peek_of_an_empty_or_all_stale_queue_is_empty() -> None:
    queue, evictable = queue_of([(1.0, [1, 2], [1, 0])])
    evictable.clear()
    assert queue.peek(evictable, 5) == []
    assert TimeQueue().peek({}, 5) == []
