"""The CPU ``wa`` evictor's decision on a radix tree's state: the reference that
``RadixOrder`` (and SGLang's ``RadixCache`` with it installed) must follow.

A radix tree evicts leaves only, and a parent joins the candidates once its last child is
gone. ``wa_victims`` replays that with a fresh ``WAPolicy`` per step, fed the candidate
leaves (category code, last access, depth, mark order) and asked for one victim; the
candidates marked superseded (``demoted``: their superseding stamp and mark order) go
first, the oldest stamp first.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

from agent.policies.wa import WAPolicy
from agent.policy_document import PolicyDocument


@dataclass(frozen=True)
class Leaf:
    """What the reference knows of a candidate: its side-table row and access time."""

    node: Hashable
    code: int
    t: float
    depth: int
    seq: int


def wa_first(leaves: Sequence[Leaf], names: Sequence[str], doc: PolicyDocument, now: float) -> Leaf:
    """The leaf ``wa`` evicts first among ``leaves`` at ``now``."""
    policy = WAPolicy(category_names=names, doc=doc)
    ordered = sorted(leaves, key=lambda leaf: (leaf.t, leaf.seq))  # release order
    for i, leaf in enumerate(ordered):
        policy.free([i], [leaf.depth], leaf.t, leaf.code)
    policy.touch([], now)  # the clock: the eviction pass's time
    (victim,) = policy.evict(1)
    return ordered[victim]


def wa_victims(
    candidates: Sequence[Leaf],
    tokens_wanted: int,
    *,
    names: Sequence[str],
    doc: PolicyDocument,
    now: float,
    size: Callable[[Hashable], int],
    parent_joins: Callable[[Hashable, set[Hashable]], Leaf | None],
    demoted: Mapping[Hashable, tuple[int, int]] | None = None,
) -> list[Hashable]:
    """Victims, in order, of one eviction pass of ``tokens_wanted`` tokens. ``size`` gives a
    node's tokens; ``parent_joins(victim, gone)`` gives the victim's parent as a new
    candidate once every child of it is gone (``gone``: victims so far), else None."""
    pool = {leaf.node: leaf for leaf in candidates}
    gone: set[Hashable] = set()
    out: list[Hashable] = []
    freed = 0
    while freed < tokens_wanted and pool:
        first = [pool[n] for n in pool if demoted and n in demoted]
        if first:
            leaf = min(first, key=lambda c: demoted[c.node])  # type: ignore[index]
        else:
            leaf = wa_first(list(pool.values()), names, doc, now)
        del pool[leaf.node]
        gone.add(leaf.node)
        out.append(leaf.node)
        freed += size(leaf.node)
        parent = parent_joins(leaf.node, gone)
        if parent is not None:
            pool[parent.node] = parent
    return out
