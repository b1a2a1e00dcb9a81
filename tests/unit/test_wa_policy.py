"""``wa`` and ``wa-ref``: hand-computed golden victims, a differential test against a naive
O(N) evictor written here from the victim order in ``agent.policies.wa_core``, and a
replay through the engine.

Notation in comments: ``R = p (1 - exp(-a L)) exp(-a d)``, the reuse probability within
the life window of a block idle ``d`` seconds (docs/architecture.md, "A worked
timeline").
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.policies import create, names, wa_core, wa_queue
from agent.policies.base import EvictionPolicy
from agent.policies.wa import WAPolicy
from agent.policies.wa_core import Attribution, log_weight
from agent.policy_document import BUILTIN_POLICY, CategoryParams, PolicyDocument
from controlplane.replay import catalog as replay_catalog
from controlplane.replay.engine import replay_hits
from controlplane.replay.reference.wa_ref import WARefPolicy
from controlplane.traces.model import Trace
from tests.policy_samples import unchecked


def cp(rate: float, p: float, life: float) -> CategoryParams:
    return CategoryParams(rate=rate, p_reuse=p, life_s=life, source="fit")


def doc(
    version: int = 1, default: CategoryParams | None = None, **cats: CategoryParams
) -> PolicyDocument:
    return PolicyDocument(
        version=version,
        created_at=0.0,
        categories=cats,
        default=default if default is not None else BUILTIN_POLICY.default,
    )


def release(policy: EvictionPolicy, blocks: Sequence[int], now: float, code: int) -> None:
    """A request with prompt ``blocks`` (offset order) releases them tail first."""
    policy.free(list(reversed(blocks)), range(len(blocks) - 1, -1, -1), now, code)


# --- golden victims ------------------------------------------------------------------------


def test_registered_and_buildable_from_capacity_alone() -> None:
    # wa-ref is a comparison tool: replay's catalogue has it, the production registry not.
    assert "wa" in names() and "wa-ref" not in names()
    assert "wa-ref" in replay_catalog.names()
    for pol in (create("wa", 100), WARefPolicy(100)):
        assert isinstance(pol, EvictionPolicy)
        assert pol.policy is BUILTIN_POLICY  # type: ignore[attr-defined]
        assert pol.category_names == ()  # type: ignore[attr-defined]


# Category x (code 0) releases block 1 at ``t_x``, y (code 1) block 2 at ``t_y``; at
# ``now`` the block with the smaller R goes first.
TWO_CATEGORIES = {
    # x: R = 0.5 (1 - e^-0.1) e^-1 = 0.0175; y: R = 0.5 (1 - e^-1) e^-10 = 1.4e-5.
    "faster decaying goes first": (cp(0.1, 0.5, 1.0), cp(1.0, 0.5, 1.0), 0.0, 0.0, 10.0, [2, 1]),
    # x (slow) idle 10 s: R = 0.5 (1 - e^-0.1) e^-0.1 = 0.043; y (fast) idle 5 s:
    # R = 0.5 (1 - e^-10) e^-5 = 0.0034. LRU would take the slow one (below).
    "slow older outlives fast newer": (
        cp(0.01, 0.5, 10.0),
        cp(1.0, 0.5, 10.0),
        0.0,
        5.0,
        10.0,
        [2, 1],
    ),
    # Both idle 1 s. L = 1: x R = 0.9 (1 - e^-1) e^-1 = 0.209, y R = 0.5 (1 - e^-0.1)
    # e^-0.1 = 0.043: y first. L = 100: x R = 0.9 e^-1 = 0.331, y R = 0.5 (1 - e^-10)
    # e^-0.1 = 0.452: x first.
    "short life window": (cp(1.0, 0.9, 1.0), cp(0.1, 0.5, 1.0), 0.0, 0.0, 1.0, [2, 1]),
    "long life window": (cp(1.0, 0.9, 100.0), cp(0.1, 0.5, 100.0), 0.0, 0.0, 1.0, [1, 2]),
}


@pytest.mark.parametrize(
    ("x", "y", "t_x", "t_y", "now", "victims"),
    list(TWO_CATEGORIES.values()),
    ids=list(TWO_CATEGORIES),
)
def test_two_categories_order(
    x: CategoryParams, y: CategoryParams, t_x: float, t_y: float, now: float, victims: list[int]
) -> None:
    pol = WAPolicy(10, category_names=["x", "y"], doc=doc(x=x, y=y))
    release(pol, [1], t_x, 0)
    release(pol, [2], t_y, 1)
    pol.touch([], now)
    assert pol.evict(2) == victims


def test_lru_takes_the_older_block_where_wa_does_not() -> None:
    lru = create("lru", 10)
    release(lru, [1], 0.0, 0)
    release(lru, [2], 5.0, 1)
    assert lru.evict(1) == [1]


def test_offset_tie_break_tail_first_then_release_order() -> None:
    pol = WAPolicy(10)  # built-in curve: one category's blocks rank by age alone
    release(pol, [10, 11, 12], 0.0, 0)
    assert pol.evict(3) == [12, 11, 10]
    # Two requests at the same time: deepest offset first across both, then the block
    # released first (21 before 31).
    release(pol, [20, 21], 1.0, 0)
    release(pol, [30, 31, 32], 1.0, 0)
    assert pol.evict(5) == [32, 21, 31, 20, 30]
    # Same across categories sharing a curve (unknown codes 3 and 4 get the default).
    release(pol, [40, 41], 2.0, 3)
    release(pol, [50, 51, 52], 2.0, 4)
    release(pol, [60], 3.0, 3)
    assert pol.evict(6) == [52, 41, 51, 40, 50, 60]


def test_parameter_swap_changes_next_victim_without_rekeying() -> None:
    short = doc(1, x=cp(1.0, 0.9, 1.0), y=cp(0.1, 0.5, 1.0))
    long = doc(2, x=cp(1.0, 0.9, 100.0), y=cp(0.1, 0.5, 100.0))
    pol = WAPolicy(10, category_names=["x", "y"], doc=short)
    release(pol, [1, 2], 0.0, 0)
    release(pol, [3, 4], 0.0, 1)
    pol.touch([], 1.0)
    assert pol.evict(1) == [4]  # y's tail under the short window
    pol.set_policy(long)
    assert pol.policy is long
    assert pol.evict(1) == [2]  # now x's tail, although y still holds 3
    assert pol.evict(2) == [1, 3]
    with pytest.raises(TypeError):
        pol.set_policy({"version": 3})  # type: ignore[arg-type]


def wa_or_device(kind: str, category_names: Sequence[str], d: PolicyDocument) -> WAPolicy:
    if kind == "wa":
        return WAPolicy(10, category_names=category_names, doc=d)
    device_evictor = pytest.importorskip("agent.device_evictor")
    return device_evictor.DeviceEvictor.simulated(10, category_names=category_names, doc=d)


@pytest.mark.parametrize("kind", ["wa", "device"])
@pytest.mark.parametrize("known", [["x", "y"], ["y"]], ids=["named", "not-yet-named"])
@pytest.mark.parametrize(
    "params",
    [{"rate": -1.0, "life_s": 1000.0}, {"p_reuse": math.nan}, {"rate": math.inf}],
    ids=["overflows", "nan", "infinite-rate"],
)
def test_a_document_the_victim_order_cannot_use_is_refused_by_set_policy(
    kind: str, known: list[str], params: dict[str, float]
) -> None:
    """``set_policy`` kept the document and worked out its constants at the next eviction:
    a curve past the float range raised in ``evict``, on the engine thread, outside the
    agent's guard (a NaN one ordered blocks at random). It is refused in ``set_policy``,
    which changes nothing; so is a category the evictor has not named yet (``free``
    would work out its constant)."""
    good = doc(1, x=cp(1.0, 0.9, 1.0), y=cp(0.1, 0.5, 1.0))
    pol = wa_or_device(kind, known, good)
    for code in range(len(known)):
        release(pol, [10 * code + 1, 10 * code + 2], float(code), code)
    twin = copy.deepcopy(pol)
    with pytest.raises(ValueError, match="category 'x'"):
        pol.set_policy(
            PolicyDocument.model_construct(version=2, categories={"x": unchecked(**params)})
        )
    assert pol.policy is good
    assert pol.add_category("x") == twin.add_category("x")
    release(pol, [30], 5.0, pol.add_category("x"))
    release(twin, [30], 5.0, twin.add_category("x"))
    assert pol.evict(len(pol)) == twin.evict(len(twin))


def test_a_document_the_victim_order_cannot_use_is_refused_when_built() -> None:
    with pytest.raises(ValueError, match="the default curve"):
        WAPolicy(10, doc=PolicyDocument.model_construct(version=1, default=unchecked(rate=0.0)))


def test_unknown_category_uses_the_default_curve() -> None:
    # default: slow (a = 0.01); x: fast (a = 1). At now = 10, x's block goes first.
    d = doc(default=cp(0.01, 0.5, 10.0), x=cp(1.0, 0.5, 10.0))
    pol = WAPolicy(10, category_names=["x", "zzz"], doc=d)
    release(pol, [1], 0.0, 1)  # named, not in the document
    release(pol, [2], 0.0, 7)  # no name at all
    release(pol, [3], 0.0, 0)  # x
    pol.touch([], 10.0)
    # 1 and 2 share the default curve and time: release order decides between them.
    assert pol.evict(3) == [3, 1, 2]
    # A name added later turns code 1's blocks into x's, at the next eviction.
    pol2 = WAPolicy(10, doc=d)
    release(pol2, [1], 0.0, 0)
    release(pol2, [2], 0.0, 0)
    release(pol2, [3], 0.0, 1)
    pol2.touch([], 10.0)
    assert pol2.evict(1) == [1]  # all on the default curve: release order
    assert pol2.add_category("zzz") == 0
    assert pol2.add_category("x") == 1
    assert pol2.add_category("zzz") == 0
    assert pol2.category_names == ("zzz", "x")
    assert pol2.evict(1) == [3]  # the default curve alone would give 2


def test_a_code_named_again_judges_its_queued_blocks_by_the_new_name() -> None:
    # default: slow; x: fast. Code 0 was "y" (not in the document: the default curve) and
    # is named "x": its queued block 1 goes first; "y" is forgotten, "x" found at code 0.
    d = doc(default=cp(0.01, 0.5, 10.0), x=cp(1.0, 0.5, 10.0))
    pol = WAPolicy(10, category_names=["y", "z"], doc=d)
    release(pol, [2], 0.0, 1)
    release(pol, [1], 0.0, 0)
    pol.touch([], 10.0)
    pol.name_category(0, "x")
    pol.name_category(2, "y")  # the next code
    assert pol.category_names == ("x", "z", "y")
    assert pol.add_category("x") == 0 and pol.add_category("y") == 2
    assert pol.evict(1) == [1]  # the default curve alone would give 2, released first
    with pytest.raises(ValueError, match="neither given nor the next"):
        pol.name_category(4, "w")


def test_attribution_creator_vs_last() -> None:
    # Block 1 created by x (fast) at 0 and reused by y (slow) at 5; block 2 created by y
    # at 3. now = 10. "last": both in y, 2 is older. "creator": 1 is x's, idle 5 s:
    # R = 0.5 (1 - e^-10) e^-5 = 0.0034 < 2's R = 0.5 (1 - e^-0.1) e^-0.07 = 0.044.
    d = doc(x=cp(1.0, 0.5, 10.0), y=cp(0.01, 0.5, 10.0))
    victims = {}
    for attribution in ("last", "creator"):
        pol = WAPolicy(10, category_names=["x", "y"], doc=d, attribution=attribution)
        assert pol.attribution == attribution
        release(pol, [1], 0.0, 0)
        release(pol, [2], 3.0, 1)
        pol.touch([1], 5.0)
        release(pol, [1], 5.0, 1)
        pol.touch([], 10.0)
        victims[attribution] = pol.evict(1)
    assert victims == {"last": [2], "creator": [1]}
    with pytest.raises(ValueError, match="attribution"):
        WAPolicy(10, attribution="first")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["wa", "wa-ref"])
def test_in_use_blocks_are_never_evicted(name: str) -> None:
    pol = create(name, 10) if name == "wa" else WARefPolicy(10)
    release(pol, [1, 2, 3, 4], 0.0, 0)
    pol.touch([2, 4, 9], 1.0)  # 9 was never cached: it is in use from now on
    assert len(pol) == 5
    assert sorted(pol.evict(10)) == [1, 3]
    assert pol.evict(10) == []
    assert len(pol) == 3 and all(b in pol for b in (2, 4, 9)) and 1 not in pol
    release(pol, [2], 2.0, 0)
    assert pol.evict(10) == [2]


def test_score_is_log_of_the_papers_reuse_probability() -> None:
    for p in (cp(0.3, 0.7, 5.0), cp(2.0, 0.01, 0.5), cp(1e-3, 1.0, 600.0)):
        lc, a = log_weight(p)
        for d in (0.0, 0.25, 7.0, 90.0):
            assert math.isclose(math.exp(lc - a * d), p.reuse_prob(d), rel_tol=1e-12)
    assert log_weight(cp(1.0, 0.0, 5.0))[0] == -math.inf


def test_zero_probability_category_orders_by_age_then_offset() -> None:
    d = doc(z=cp(1.0, 0.0, 5.0), x=cp(1.0, 0.5, 5.0))
    pol = WAPolicy(10, category_names=["z", "x"], doc=d)
    release(pol, [1], 0.0, 1)
    release(pol, [2, 3], 1.0, 0)
    release(pol, [4, 5, 6], 2.0, 0)
    # Every z score is -inf: z's blocks go first, oldest first, tail first; x's last.
    assert pol.evict(6) == [3, 2, 6, 5, 4, 1]


# --- wa-ref golden behaviour -----------------------------------------------------------------


def test_wa_ref_never_hit_blocks_score_zero_and_go_deepest_first() -> None:
    d = doc(x=cp(0.1, 0.5, 5.0))
    ref = WARefPolicy(10, category_names=["x"], doc=d)
    release(ref, [1, 2], 1.0, 0)  # never hit: last access stays 0
    release(ref, [3, 4, 5], 50.0, 0)  # never hit, much newer
    ref.touch([1], 60.0)
    release(ref, [1], 60.0, 0)  # 1 is hit: stamped 60
    # Never-hit blocks tie (last access 0): deepest offset first, whatever their age.
    assert ref.evict(4) == [5, 2, 4, 3]
    assert ref.evict(1) == [1]
    # wa on the same operations: by age, tail first.
    wa = WAPolicy(10, category_names=["x"], doc=d)
    release(wa, [1, 2], 1.0, 0)
    release(wa, [3, 4, 5], 50.0, 0)
    wa.touch([1], 60.0)
    release(wa, [1], 60.0, 0)
    assert wa.evict(5) == [2, 5, 4, 3, 1]


def test_wa_ref_unknown_category_goes_first_and_creator_is_kept() -> None:
    d = doc(x=cp(0.1, 0.5, 5.0), y=cp(0.01, 0.9, 5.0))
    ref = WARefPolicy(10, category_names=["x", "y", "new"], doc=d)
    release(ref, [1], 0.0, 0)  # x
    release(ref, [2], 0.0, 1)  # y
    release(ref, [3], 5.0, 2)  # named but not in the document: priority 0
    ref.touch([3], 9.0)
    release(ref, [3], 9.0, 1)  # a hit by y: still the creator's ("new")
    ref.touch([1], 9.0)
    release(ref, [1], 9.0, 1)  # a hit by y: still x's
    ref.touch([], 10.0)
    # 3: -inf. 2 (y, never hit): log(0.9 (1 - e^-0.05)) - 0.01 * 10 = -3.23.
    # 1 (x, hit at 9): log(0.5 (1 - e^-0.5)) - 0.1 * 1 = -1.73.
    assert ref.evict(3) == [3, 2, 1]


# --- differential: the fast evictors against a naive O(N) scan ------------------------------


class NaiveWA:
    """Every evictable block with its ``(t, -offset, seq, code)``; each victim is the min of
    ``(lc - a (now - t), t, -offset, seq)`` over all of them. ``ref`` switches to the
    reference stamping (hits only, clock from 0, creator, unknown = priority 0)."""

    def __init__(
        self, names: Sequence[str], d: PolicyDocument, attribution: str, ref: bool = False
    ) -> None:
        self.names = list(names)
        self.doc = d
        self.ref = ref
        self.creator_mode = ref or attribution == "creator"
        self.clock = 0.0 if ref else -math.inf
        self.rec: dict[int, tuple[float, int, int, int]] = {}
        self.in_use: set[int] = set()
        self.creator: dict[int, int] = {}
        self.seq = 0

    def weight(self, code: int) -> tuple[float, float]:
        name = self.names[code] if 0 <= code < len(self.names) else None
        if self.ref:
            p = self.doc.categories.get(name) if name is not None else None
            if p is None:
                return -math.inf, 1.0
        else:
            p = self.doc.params_for(name) if name is not None else self.doc.default
        if p.p_reuse == 0.0:
            return -math.inf, p.rate
        return math.log(p.p_reuse) + math.log(-math.expm1(-p.rate * p.life_s)), p.rate

    def touch(self, blocks: Sequence[int], now: float) -> None:
        self.clock = max(self.clock, now)
        self.in_use.update(blocks)
        for b in blocks:
            self.rec.pop(b, None)

    def free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: int
    ) -> None:
        self.clock = max(self.clock, now)
        hits = {b for b in blocks if b in self}
        for i, (b, o) in enumerate(zip(blocks, offsets, strict=True)):
            self.rec.pop(b, None)
            self.in_use.discard(b)
            code = self.creator.setdefault(b, category) if self.creator_mode else category
            t = self.clock if (b in hits or not self.ref) else 0.0
            self.rec[b] = (t, -o, self.seq + i, code)
        self.seq += len(blocks)

    def evict(self, n: int) -> list[int]:
        victims = []
        for _ in range(min(max(n, 0), len(self.rec))):
            b = min(self.rec, key=self._order)
            del self.rec[b]
            self.creator.pop(b, None)
            victims.append(b)
        return victims

    def _order(self, b: int) -> tuple[float, float, int, int]:
        """``(lc - a (now - t), t, -offset, seq)`` of evictable ``b``: the least goes first."""
        t, no, q, code = self.rec[b]
        lc, a = self.weight(code)
        return (lc - a * (self.clock - t), t, no, q)

    def __len__(self) -> int:
        return len(self.rec) + len(self.in_use)

    def __contains__(self, block: object) -> bool:
        return block in self.rec or block in self.in_use


_params = st.builds(
    cp,
    rate=st.sampled_from([1e-3, 0.05, 0.7, 1.0, 40.0, 1e6]),
    p=st.sampled_from([0.0, 1e-6, 0.3, 0.5, 1.0]),
    life=st.sampled_from([0.01, 1.0, 5.0, 300.0]),
)
_docs = st.builds(
    lambda default, cats: PolicyDocument(version=1, categories=cats, default=default),
    _params,
    st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), _params, max_size=4),
)
_blocks = st.lists(st.integers(0, 24), min_size=0, max_size=8)
_dt = st.sampled_from([0.0, 0.0, 0.0, 1e-9, 0.5, 1.0, 3.0, 60.0, -2.0])
_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("free"),
            _blocks,
            st.booleans(),  # offsets tail first, or arbitrary
            st.lists(st.integers(0, 6), min_size=8, max_size=8),
            _dt,
            st.integers(-1, 5),
        ),
        st.tuples(st.just("touch"), _blocks, _dt),
        st.tuples(st.just("evict"), st.integers(0, 7)),
        st.tuples(st.just("policy"), _docs),
        st.tuples(st.just("name"), st.sampled_from(["a", "b", "c", "d", "e"])),
    ),
    max_size=60,
)


Op = tuple[Any, ...]


def _differential(fast: WAPolicy | WARefPolicy, naive: NaiveWA, ops: list[Op]) -> None:
    now = 0.0
    for op in ops:
        kind = op[0]
        if kind == "free":
            _, blocks, tail_first, offs, dt, code = op
            now += dt
            offsets: Sequence[int] = (
                range(len(blocks) - 1, -1, -1) if tail_first else offs[: len(blocks)]
            )
            fast.free(blocks, offsets, now, code)
            naive.free(blocks, offsets, now, code)
        elif kind == "touch":
            now += op[2]
            fast.touch(op[1], now)
            naive.touch(op[1], now)
        elif kind == "evict":
            assert fast.evict(op[1]) == naive.evict(op[1])
        elif kind == "policy":
            fast.set_policy(op[1])
            naive.doc = op[1]
        else:
            code = fast.add_category(op[1])
            if op[1] not in naive.names:
                naive.names.append(op[1])
            assert naive.names[code] == op[1]
        assert len(fast) == len(naive)
    assert all((b in fast) == (b in naive) for b in range(25))
    assert fast.evict(100) == naive.evict(100)
    assert len(fast) == len(naive)


@contextmanager
def _tiny_buffers(on: bool) -> Iterator[None]:
    """Compact, trim and chunk at every chance, so the small cases reach those paths."""
    with pytest.MonkeyPatch.context() as mp:
        if on:
            mp.setattr(wa_core, "COMPACT_SLACK", 0)
            mp.setattr(wa_queue, "_TRIM", 0)
            mp.setattr(wa_queue, "_CHUNK", 1)
        yield


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=_docs, ops=_ops, attribution=st.sampled_from(["last", "creator"]), tiny=st.booleans())
def test_wa_matches_naive_evictor(
    d: PolicyDocument, ops: list[Op], attribution: Attribution, tiny: bool
) -> None:
    with _tiny_buffers(tiny):
        fast = WAPolicy(0, category_names=["a", "b"], doc=d, attribution=attribution)
        _differential(fast, NaiveWA(["a", "b"], d, attribution), ops)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=_docs, ops=_ops, tiny=st.booleans())
def test_wa_ref_matches_naive_evictor(d: PolicyDocument, ops: list[Op], tiny: bool) -> None:
    with _tiny_buffers(tiny):
        fast = WARefPolicy(0, category_names=["a", "b"], doc=d)
        _differential(fast, NaiveWA(["a", "b"], d, "creator", ref=True), ops)


# --- replay ------------------------------------------------------------------------------------


def _trace() -> Trace:
    # chat at 0; two file requests at 1 and 2; the chat's next turn at 3 repeats its prompt.
    return Trace.from_requests(
        [[1, 2], [3, 4], [5, 6], [1, 2, 7]],
        [0.0, 1.0, 2.0, 3.0],
        types=["chat", "file", "file", "chat"],
        turns=[1, 1, 1, 2],
    )


def test_replay_golden_hits() -> None:
    trace = _trace()
    assert trace.category_names == ("chat_1", "chat_2", "file_1")
    chat, file = cp(0.01, 0.8, 60.0), cp(1.0, 0.01, 60.0)
    d = doc(chat_1=chat, chat_2=chat, file_1=file)
    # Capacity 4: after request 2 two blocks go. LRU takes the chat's (the oldest); wa
    # takes the older file request's (R = 0.01 e^-1 against 0.8 (1 - e^-0.6) e^-0.02),
    # so the next turn hits its whole prefix.
    for pol, expected in (
        (WAPolicy(4, category_names=trace.category_names, doc=d), [0, 0, 0, 2]),
        (WARefPolicy(4, category_names=trace.category_names, doc=d), [0, 0, 0, 2]),
        (create("lru", 4), [0, 0, 0, 0]),
        (create("wa", 4), [0, 0, 0, 0]),  # built-in curve: LRU order
    ):
        assert replay_hits(trace, pol, 4).tolist() == expected
        assert len(pol) == 4


@settings(max_examples=40, deadline=None)
@given(
    reqs=st.lists(st.lists(st.integers(0, 30), min_size=1, max_size=6), min_size=1, max_size=25),
    gaps=st.lists(st.sampled_from([0.0, 0.5, 2.0]), min_size=25, max_size=25),
    types=st.lists(st.sampled_from(["text", "file"]), min_size=25, max_size=25),
    capacity=st.integers(0, 12),
    d=_docs,
)
def test_replay_matches_naive(
    reqs: list[list[int]], gaps: list[float], types: list[str], capacity: int, d: PolicyDocument
) -> None:
    ts = [sum(gaps[: i + 1]) for i in range(len(reqs))]
    trace = Trace.from_requests(reqs, ts, types=types[: len(reqs)], turns=[1] * len(reqs))
    cats = list(trace.category_names)
    for fast, naive in (
        (WAPolicy(capacity, category_names=cats, doc=d), NaiveWA(cats, d, "last")),
        (WARefPolicy(capacity, category_names=cats, doc=d), NaiveWA(cats, d, "creator", True)),
    ):
        assert replay_hits(trace, fast, capacity).tolist() == (
            replay_hits(trace, naive, capacity).tolist()
        )
