"""How long one engine step takes: ``CostModel``, a roofline over a ``Profile``.

Owns the time of a continuous-batching step. A step computes some new prompt tokens
(prefill chunks) and one token for every decoding request. Its time is a fixed overhead
plus the larger of:

- compute: ``2 * params`` FLOPs per new token, plus attention, ``4 * layers *
  attention_dim`` FLOPs per (query token, context token) pair, at ``peak * prefill_mfu``;
  a chunk of ``n`` tokens after ``c`` tokens of context has ``n * c + n (n + 1) / 2``
  pairs, so prefill time grows with the uncached tokens and with their context;
- memory: the weights, read once a step, plus the KV of every context the step attends
  to, at ``bandwidth * bandwidth_efficiency``.

A run of decode-only steps has a closed form (``decode_seconds``): each step adds one
token to every running context, so both terms grow linearly step by step.

A profile whose numbers are each valid can still give steps of infinite (or zero)
seconds: a peak of 1e-300 TFLOP/s, or 1e300 of them and no step overhead. ``CostModel``
refuses such a profile (``ProfileError`` naming the fields of the term at fault): the
longest step the engine can take (a full token budget over the longest contexts of every
running slot), repeated ``STEP_HEADROOM`` times, must stay finite, and the shortest
(one decode token) must take some time, or simulated time would not advance.

It must never hold requests, a clock or any state besides the profile's constants.
"""

from __future__ import annotations

import math

from controlplane.simulate.profiles import Profile, ProfileError
from controlplane.traces.model import MAX_REQUEST_TOKENS

STEP_HEADROOM = float(1 << 40)
"""Steps whose total must stay finite: more than any simulation takes."""
LONGEST_CONTEXT = 2 * MAX_REQUEST_TOKENS
"""A request's longest context: its prompt and its output, each at most the bound."""
_TERM_FIELDS = {
    "compute per token": "params_billion, peak_tflops, prefill_mfu",
    "attention": "layers, attention_dim, peak_tflops, prefill_mfu",
    "weight reads": "params_billion, weight_bytes, hbm_tb_s, bandwidth_efficiency",
    "KV reads": "layers, kv_heads, head_dim, kv_bytes, hbm_tb_s, bandwidth_efficiency",
}


class CostModel:
    """Step times of one profile (module docstring)."""

    __slots__ = ("_kv_token_s", "_overhead_s", "_pair_s", "_token_s", "_weights_s", "profile")

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        flops = profile.peak_tflops * 1e12 * profile.prefill_mfu
        bandwidth = profile.hbm_tb_s * 1e12 * profile.bandwidth_efficiency
        self._token_s = 2.0 * profile.params_billion * 1e9 / flops
        self._pair_s = 4.0 * profile.layers * profile.attention_dim / flops
        self._weights_s = profile.weights_gb * 1e9 / bandwidth
        self._kv_token_s = profile.kv_bytes_per_token / bandwidth
        self._overhead_s = profile.step_overhead_ms / 1e3
        self._check_finite()

    def _check_finite(self) -> None:
        """``ProfileError`` unless step times stay finite and above zero (docstring)."""
        p = self.profile
        budget, context = p.max_batch_tokens, p.max_running * LONGEST_CONTEXT
        worst = {
            "compute per token": budget * self._token_s,
            "attention": (context + self.chunk_pairs(budget, LONGEST_CONTEXT)) * self._pair_s,
            "weight reads": self._weights_s,
            "KV reads": (context + budget) * self._kv_token_s,
        }
        over = [term for term, s in worst.items() if not math.isfinite(s * 4 * STEP_HEADROOM)]
        if over:
            terms = "; ".join(f"{term} ({_TERM_FIELDS[term]})" for term in over)
            raise ProfileError(
                f"profile {p.name!r} makes step times overflow a float: {terms}, over the "
                "longest step (max_batch_tokens, max_running)"
            )
        if self.decode_seconds(1, 1, 1) <= 0:
            raise ProfileError(
                f"profile {p.name!r} makes a step take no time: step_overhead_ms is 0 and "
                "peak_tflops and hbm_tb_s are so large that compute and memory round to 0"
            )

    def step_seconds(self, new_tokens: int, pairs: float, kv_tokens: float) -> float:
        """One step that computes ``new_tokens`` tokens with ``pairs`` attention pairs and
        reads the KV of ``kv_tokens`` tokens."""
        compute = new_tokens * self._token_s + pairs * self._pair_s
        memory = self._weights_s + kv_tokens * self._kv_token_s
        return self._overhead_s + max(compute, memory)

    @staticmethod
    def chunk_pairs(tokens: int, context: int) -> float:
        """Attention pairs of ``tokens`` new tokens after ``context`` tokens."""
        return tokens * context + tokens * (tokens + 1) / 2.0

    def prefill_seconds(self, uncached: int, cached: int) -> float:
        """A prompt's prefill alone on the engine: ``uncached`` tokens after ``cached``
        ones, in chunks of the profile's step budget (the time to its first token)."""
        budget = self.profile.max_batch_tokens
        total, context, left = 0.0, cached, uncached
        while left > 0:
            n = min(left, budget)
            total += self.step_seconds(n, self.chunk_pairs(n, context), context + n)
            context += n
            left -= n
        return total

    def decode_seconds(self, running: int, context: int, steps: int) -> float:
        """``steps`` decode-only steps of ``running`` requests whose contexts add up to
        ``context`` tokens at the first step (each step adds ``running`` tokens)."""
        if steps <= 0:
            return 0.0
        compute0 = running * self._token_s + context * self._pair_s
        memory0 = self._weights_s + context * self._kv_token_s
        return steps * self._overhead_s + _sum_of_max(
            compute0, running * self._pair_s, memory0, running * self._kv_token_s, steps
        )

    def decode_steps_within(self, running: int, context: int, seconds: float) -> int:
        """How many whole decode-only steps end within ``seconds``."""
        if seconds <= 0:
            return 0
        first = self.decode_seconds(running, context, 1)
        hi = max(1, int(seconds / first) + 1)  # steps only get longer: an upper bound
        lo = 0
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.decode_seconds(running, context, mid) <= seconds:
                lo = mid
            else:
                hi = mid - 1
        return lo


def _sum_of_max(a1: float, b1: float, a2: float, b2: float, n: int) -> float:
    """``sum(max(a1 + b1 * i, a2 + b2 * i) for i in range(n))`` in closed form."""

    def line(a: float, b: float, lo: int, hi: int) -> float:
        count = hi - lo
        return count * a + b * (lo + hi - 1) * count / 2.0 if count > 0 else 0.0

    if b1 == b2:
        return line(max(a1, a2), b1, 0, n)
    # The lines cross at x; the steeper one is the larger from there on.
    x = (a2 - a1) / (b1 - b2)
    cut = min(max(math.ceil(x), 0), n)
    if b1 > b2:
        return line(a2, b2, 0, cut) + line(a1, b1, cut, n)
    return line(a1, b1, 0, cut) + line(a2, b2, cut, n)
