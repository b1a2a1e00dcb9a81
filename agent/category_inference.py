"""Request categories for traffic that carries no type or turn: ``CategoryInferrer``.

The workload-aware policy ranks blocks by request category, which the paper takes from
the request's type and turn. Engines whose clients send no such metadata (and traces
such as Mooncake's) have neither, so this module derives a category from what a prefix
cache can know when a request arrives: its block hashes and its prompt length.

- **Inferred turn.** A request whose cached prefix runs past the *common* blocks (those
  of a shared system prompt) continues an earlier conversation: its turn is one more than
  the turn of the request that created the last block it shares, capped at
  ``max_turn``. A block is common once ``common_branches`` requests have diverged right
  after it (their prefix ended there and their next block was new): a system prompt's
  last block is followed by many different suffixes. A conversation's next turn extends
  the previous prompt's blocks, so its prefix ends where that prompt ended, at a block no
  request had diverged after before. A prefix made only of common blocks is a first turn,
  however long. With one divergence (the default), the second request after a new system
  prompt is taken for a turn 2, and the next ones are not.
- **New tokens**: the prompt's tokens beyond the prefix it shares with earlier requests,
  bucketed by ``new_token_edges``. A chat follow-up adds a few dozen tokens; a document,
  an image or fresh search results add thousands, and such content is reused much less
  (on synthetic traces this separated categories better than the whole prompt's length).

The name is ``t{turn}_n{bucket}`` (e.g. ``t2_n1``): at most
``max_turn x (len(new_token_edges) + 1)`` categories. Memory is bounded: one small int
per remembered block, at most ``max_blocks`` blocks, least recently seen forgotten first.
Work is O(blocks) per request (one dict lookup per block). It must never do I/O, import
the control plane, or look at anything a cache would not know at the request's arrival.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

_TURN_BITS = 4
_TURN_MASK = (1 << _TURN_BITS) - 1
_BRANCH_MAX = 255


@dataclass(frozen=True)
class InferSettings:
    """Knobs of the inference; the defaults were chosen on synthetic traces of a seed
    never used for reported results (docs/policy.md, "Category inference")."""

    max_blocks: int = 1 << 20
    """Blocks remembered (least recently seen forgotten first)."""
    common_branches: int = 1
    """Divergences after a block that make it common (a shared system prompt's end)."""
    max_turn: int = 3
    """Inferred turns above this share one category."""
    new_token_edges: tuple[int, ...] = (128, 512, 2048, 8192)
    """Bucket edges of the new tokens (increasing)."""
    block_tokens: int = 16
    """Tokens per block: the shared prefix's tokens, and the prompt's when not given."""

    def __post_init__(self) -> None:
        if self.max_blocks < 1 or self.common_branches < 1 or self.block_tokens < 1:
            raise ValueError("max_blocks, common_branches and block_tokens must be >= 1")
        if not 1 <= self.max_turn <= _TURN_MASK:
            raise ValueError(f"max_turn must be in 1..{_TURN_MASK}")
        if list(self.new_token_edges) != sorted(set(self.new_token_edges)):
            raise ValueError("new_token_edges must be strictly increasing")

    def names(self) -> tuple[str, ...]:
        """Every name ``infer`` can return, turn-major."""
        return tuple(
            category_name(t, b)
            for t in range(1, self.max_turn + 1)
            for b in range(len(self.new_token_edges) + 1)
        )


def category_name(turn: int, bucket: int) -> str:
    return f"t{turn}_n{bucket}"


class CategoryInferrer:
    """Streaming inference: call ``infer`` once per request, in arrival order.

    Per remembered block one int packs the inferred turn of the request that created it
    (low bits) and how many requests diverged right after it (high bits, saturating).
    """

    __slots__ = ("_blocks", "settings")

    def __init__(self, settings: InferSettings | None = None) -> None:
        self.settings = settings or InferSettings()
        self._blocks: dict[int, int] = {}  # hash -> branches << 4 | turn; oldest first

    def __len__(self) -> int:
        return len(self._blocks)

    def infer(self, blocks: Sequence[int], n_tokens: int | None = None) -> str:
        """The category of a request arriving with prompt ``blocks`` (hashes, prompt
        order) of ``n_tokens`` tokens (default: blocks x ``block_tokens``); then remember
        what it shows. ``block_tokens`` must be the engine's (or trace's) block size."""
        s = self.settings
        table = self._blocks
        get = table.get
        shared = 0  # leading blocks seen before
        common = 0  # leading blocks up to the last common one among them
        packed = 0
        for b in blocks:
            v = get(b)
            if v is None:
                break
            shared += 1
            packed = v
            if v >> _TURN_BITS >= s.common_branches:
                common = shared
        turn = 1
        if shared > common:
            turn = min((packed & _TURN_MASK) + 1, s.max_turn)
        tokens = len(blocks) * s.block_tokens if n_tokens is None else n_tokens
        new = tokens - shared * s.block_tokens
        bucket = sum(1 for e in s.new_token_edges if new >= e)
        self._remember(blocks, shared, turn)
        return category_name(turn, bucket)

    def _remember(self, blocks: Sequence[int], shared: int, turn: int) -> None:
        table = self._blocks
        if 0 < shared < len(blocks):
            last = blocks[shared - 1]
            v = table[last]
            if v >> _TURN_BITS < _BRANCH_MAX:
                table[last] = v + (1 << _TURN_BITS)
        # Shared blocks move to the recent end; new ones join it with this request's turn.
        for i, b in enumerate(blocks):
            v = table.pop(b) if i < shared else turn
            table[b] = v
        excess = len(table) - self.settings.max_blocks
        if excess > 0:
            it = iter(table)
            for b in [next(it) for _ in range(excess)]:
                del table[b]
