"""``RadixOrder``: kvwise's victim order as a radix-tree eviction strategy, and the per-node
side table that feeds it.

A radix prefix cache (SGLang's ``RadixCache``) evicts leaves: it heaps the evictable leaves
by ``strategy.get_priority(node)`` (smallest first), frees the smallest, and pushes a parent
left childless. ``RadixOrder`` is such a strategy. A node's key follows ``wa``'s victim
order (``agent.policies.wa_core``, same constants, same IEEE operations)::

    (lc_w - a_w * (now - t),  t,  -o,  q)

with ``w`` the category of the request that accessed the node last, ``t`` the node's own
``last_access_time`` (the engine's clock), ``o`` the node's depth in its prompt (its first
token, in pages) and ``q`` the order in which the node was last marked. ``now`` is fixed
by ``begin`` for one eviction pass, so every key of a pass is computed at the same time.

It also owns the side table (per node: category code, depth, mark order, content id),
keyed by the node object, filled by the engine integration from its hit, insert and split
paths and emptied when a node is evicted or the tree is reset. Hot reload: ``set_policy``
works out every constant of the document, then swaps them in at once (a document refused
changes nothing); the next ``get_priority`` uses them, and no node is re-marked.

Superseded branches: where the document's ``supersede`` is ``tree`` (the order is ``wa``'s,
so the rule applies whenever the document asks for it), the side table also runs the
replay's ``wa-superseded`` tree rule (``controlplane.replay.superseded``) on the tree's own
nodes. The tree gives each node's parent and children; the row adds what it does not:
the node's latest child (on the path of the last request through it: ``walked``,
``stored``), the stamp of its latest access (a hit or its insert), whether a branch
parted there since it was inserted, and the stamp of the parting that superseded it. A
request's first new node (``stored`` with ``parting``) below a node whose latest child is
another one, where no branch parted before, supersedes that child and its latest-child
chain as far as the accesses go on (the last request's path from the child on), up to a
node still marked, which keeps its first place (as the vLLM queue's
``agent.branches`` does). A superseded node not accessed since keys as
``(-inf, -inf, stamp, q)``: before every ``wa`` key, the oldest parting first; SGLang's
loop evicts leaves only, so a branch goes tail first, each node once its children are
gone. Rows leave with their nodes: nothing outgrows the tree. Only the engine's
scheduler thread calls it. It must never import an engine, do I/O or wait on another
thread.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any, Protocol

from agent.policies.wa_core import Const, checked_const, curve_label, log_weight
from agent.policy_document import BUILTIN_POLICY, PolicyDocument, SupersedeRule

RadixKeyTuple = tuple[float, float, int, int]
"""``(log reuse probability, last access, -depth, mark order)``: smaller is evicted first.
A superseded node's: ``(-inf, -inf, superseding stamp, mark order)``."""


class RadixNode(Protocol):
    """What the order reads of a tree node (SGLang's ``TreeNode``)."""

    @property
    def last_access_time(self) -> float: ...


class NodeMark:
    """One node's row of the side table. ``seen``: the stamp of its latest access;
    ``by``: of the parting that superseded it (superseded while ``by > seen``);
    ``latest``: its latest child (believed while that child has a row and names this
    node as its parent); ``parted``: a branch parted here since it was inserted."""

    __slots__ = ("block", "by", "code", "depth", "latest", "parted", "seen", "seq")

    def __init__(self, code: int, depth: int, seq: int, block: int) -> None:
        self.code = code
        self.depth = depth
        self.seq = seq
        self.block = block
        self.seen = seq
        self.by = 0
        self.latest: Any = None
        self.parted = False

    def __repr__(self) -> str:
        return f"NodeMark(code={self.code}, depth={self.depth}, seq={self.seq})"


def path_ids(namespace: bytes, segments: Sequence[bytes], last: int | None = None) -> list[int]:
    """Content ids of the nodes on a path from the root, ``segments`` being their token
    bytes in order (only the ``last`` ones when given): node ``i``'s id is 64 bits of a
    hash of the namespace (LoRA name, cache salt) and every token from the root to its end,
    as a signed int. A node split in two keeps its id for the lower half (same last token);
    content evicted and inserted again gets the same id, so its reuse after eviction is
    seen."""
    digest = hashlib.blake2b(namespace, digest_size=8, person=b"kvwise-radix")
    first = 0 if last is None else len(segments) - last
    out: list[int] = []
    for i, tokens in enumerate(segments):
        digest.update(tokens)
        if i >= first:
            out.append(int.from_bytes(digest.copy().digest(), "big", signed=True))
    return out


def prompt_block_hashes(tokens: bytes, block_bytes: int) -> list[int]:
    """Chained 64-bit hashes of a prompt's full blocks of ``block_bytes`` bytes each (what
    category inference reads: equal prefixes give equal leading hashes)."""
    out: list[int] = []
    prev = b""
    for start in range(0, len(tokens) - block_bytes + 1, block_bytes):
        h = hashlib.blake2b(prev + tokens[start : start + block_bytes], digest_size=8)
        prev = h.digest()
        out.append(int.from_bytes(prev, "big", signed=True))
    return out


class RadixOrder:
    """An eviction strategy (``get_priority``) ranking a radix tree's leaves by ``wa``.

    Categories are numbered by ``add_category`` (codes never change); ``set_policy``
    gives them their parameters. A node that was never marked ranks as category code -1
    (the document's default curve), depth 0, order 0.
    """

    __slots__ = (
        "_codes",
        "_consts",
        "_curves",
        "_default",
        "_doc",
        "_marks",
        "_names",
        "_seq",
        "_tree",
        "now",
    )

    def __init__(self, doc: PolicyDocument = BUILTIN_POLICY) -> None:
        self._names: list[str] = []
        self._codes: dict[str, int] = {}
        self._doc, self._default, self._curves, self._consts = doc, *self._constants_of(doc)
        self._marks: dict[object, NodeMark] = {}
        self._seq = 0
        self._tree = doc.supersede == "tree"
        self.now = -math.inf
        """The eviction clock (the engine's time at the start of the pass)."""

    # --- the engine's strategy surface ---------------------------------------------------
    def get_priority(self, node: RadixNode) -> RadixKeyTuple:
        """The node's eviction key; the smallest is evicted first."""
        t = node.last_access_time
        mark = self._marks.get(node)
        if mark is None:
            lc, a = self._default
            return (lc - a * (self.now - t), t, 0, 0)
        if mark.by > mark.seen:  # superseded, untouched since
            return (-math.inf, -math.inf, mark.by, mark.seq)
        lc, a = self._consts[mark.code]
        return (lc - a * (self.now - t), t, -mark.depth, mark.seq)

    def begin(self, now: float) -> None:
        """Start an eviction pass at ``now`` (the engine's clock): every key of the pass
        is computed at this time."""
        self.now = now

    # --- parameters and categories -------------------------------------------------------
    @property
    def policy(self) -> PolicyDocument:
        return self._doc

    @property
    def category_names(self) -> tuple[str, ...]:
        return tuple(self._names)

    def set_policy(self, doc: PolicyDocument) -> None:
        """Rank by ``doc`` from the next key on (whole document, no node re-marked). Its
        constants are all worked out first: a refusal raises having changed nothing."""
        if not isinstance(doc, PolicyDocument):
            raise TypeError(f"expected a PolicyDocument, got {type(doc).__name__}")
        self._doc, self._default, self._curves, self._consts = doc, *self._constants_of(doc)
        self._follow_supersede(doc.supersede)

    @property
    def supersede(self) -> SupersedeRule:
        """The superseded-branch rule in force (the document's ``supersede``)."""
        return "tree" if self._tree else "off"

    def _follow_supersede(self, rule: SupersedeRule) -> None:
        """Demote what ``rule`` supersedes from the next key on. Turned off, every mark and
        link is dropped (once, O(nodes)), so turned on again it starts afresh; a document
        that leaves it on keeps them."""
        tree = rule == "tree"
        if tree == self._tree:
            return
        self._tree = tree
        for mark in self._marks.values():
            mark.by, mark.latest, mark.parted = 0, None, False

    def _constants_of(self, doc: PolicyDocument) -> tuple[Const, dict[str, Const], list[Const]]:
        """``doc``'s constants: the default curve's, each category's it names (kept for
        ``add_category``), and each category's named so far, in code order; refused
        (``ValueError``) unless every one orders nodes (``checked_const``)."""
        default = checked_const(curve_label(None), log_weight, doc.default)
        curves = {
            name: checked_const(curve_label(name), log_weight, params)
            for name, params in doc.categories.items()
        }
        return default, curves, [curves.get(name, default) for name in self._names]

    def add_category(self, name: str) -> int:
        """The code of category ``name``, the next free one on first sight."""
        code = self._codes.get(name)
        if code is None:
            code = self._codes[name] = len(self._names)
            self._names.append(name)
            self._consts.append(self._curves.get(name, self._default))
        return code

    # --- side table ----------------------------------------------------------------------
    def mark(self, node: object, code: int, depth: int, block: int) -> None:
        """``node`` (prompt depth ``depth``, content id ``block``) was just accessed by a
        request of category ``code``: the last accessor's category becomes the node's."""
        self._seq = seq = self._seq + 1
        mark = self._marks.get(node)
        if mark is None:
            self._marks[node] = NodeMark(code, depth, seq, block)
        else:
            mark.code, mark.depth, mark.seq, mark.block, mark.seen = code, depth, seq, block, seq

    def marks(self, nodes: Sequence[object]) -> list[NodeMark | None]:
        get = self._marks.get
        return [get(n) for n in nodes]

    def mark_of(self, node: object) -> NodeMark | None:
        return self._marks.get(node)

    def split(self, upper: object, lower: object, upper_pages: int) -> None:
        """``lower`` was cut: ``upper`` (new, its first ``upper_pages`` pages) now stands
        above it. ``upper`` takes ``lower``'s category and order and content id 0 (not
        computed yet: see ``path_ids``); ``lower`` keeps its id (same last
        token), starts deeper and gets a fresh order number. ``upper`` also takes
        ``lower``'s latest access and supersession (the same content until now) and, as
        its latest child, ``lower``; where ``lower`` was its parent's latest child,
        ``upper`` is now. No branch has parted at ``upper`` yet."""
        mark = self._marks.get(lower)
        if mark is None:
            return
        up = self._marks[upper] = NodeMark(mark.code, mark.depth, mark.seq, 0)
        self._seq += 1
        mark.depth += upper_pages
        mark.seq = self._seq
        if self._tree:
            up.seen, up.by, up.latest = mark.seen, mark.by, lower
            above = self._marks.get(getattr(upper, "parent", None))
            if above is not None and above.latest is lower:
                above.latest = upper

    def forget(self, node: object) -> NodeMark | None:
        """``node`` left the tree (evicted): drop and return its row (a link to it is no
        longer believed: it has no row)."""
        return self._marks.pop(node, None)

    # --- superseded branches (the ``tree`` rule) -----------------------------------------
    def walked(self, nodes: Sequence[Any]) -> None:
        """A request's path went through ``nodes`` (each the child of the one before, the
        first a child of its own parent): each becomes its parent's latest child."""
        if not self._tree:
            return
        get = self._marks.get
        for node in nodes:
            above = get(node.parent)
            if above is not None:
                above.latest = node

    def stored(self, node: Any, parting: bool) -> int:
        """The request being cached added ``node`` (already marked) below its parent; with
        ``parting`` (its first new node, after its hits), the first parting at that
        parent supersedes the branch through the parent's latest child. ``node`` becomes
        the latest child. Returns how many nodes were marked superseded."""
        if not self._tree:
            return 0
        above = self._marks.get(node.parent)
        if above is None:  # below the root: a request without hits leaves nothing
            return 0
        marked = 0
        old = above.latest
        if parting and old is not None and old is not node and not above.parted:
            first = self._marks.get(old)
            if first is not None and old.parent is node.parent:
                above.parted = True
                marked = self._supersede(old, first)
        above.latest = node
        return marked

    def _supersede(self, node: Any, mark: NodeMark) -> int:
        """``node`` and its latest-child chain, as far as their accesses go on (each no
        older than the one above it: the path of the last request through ``node``),
        superseded now, up to a node still marked (it and the chain below it were marked
        together, and keep that place); how many."""
        self._seq = stamp = self._seq + 1
        get = self._marks.get
        marked = 0
        while mark.by <= mark.seen:
            mark.by = stamp
            marked += 1
            child = mark.latest
            below = get(child) if child is not None else None
            if below is None or below.seen < mark.seen or child.parent is not node:
                break
            node, mark = child, below
        return marked

    def superseded(self) -> list[Any]:
        """The nodes marked superseded and not accessed since, in key order (oldest
        parting first; the tree takes each once it is a leaf)."""
        rows = [(m.by, m.seq, n) for n, m in self._marks.items() if m.by > m.seen]
        return [n for _, _, n in sorted(rows, key=lambda row: row[:2])]

    def blocks(self) -> list[int]:
        """Content ids of every node with a row and a known id."""
        return [m.block for m in self._marks.values() if m.block]

    def clear(self) -> None:
        """The tree was reset: every row goes."""
        self._marks.clear()

    def __len__(self) -> int:
        """Nodes with a row (cached nodes the integration has seen)."""
        return len(self._marks)

    def __repr__(self) -> str:
        return f"RadixOrder(nodes={len(self._marks)}, v{self._doc.version})"
