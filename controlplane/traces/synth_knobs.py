"""What the two generative models share: the knobs every profile has, and token draws.

Owns ``ProfileKnobs``, the base of ``ToCKnobs`` (``synth_toc``) and ``ToBKnobs``
(``synth_tob``): each knob both models use is declared and documented here once, and each
profile sets its calibrated value. Owns ``lognormal_tokens``, the one way either model
draws a token count. It must never know a profile's own knobs or use global randomness.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from controlplane.traces.arrays import F64, I64


def lognormal_tokens(
    rng: np.random.Generator, mean: F64 | float, sigma: F64 | float, n: int, hi: int
) -> I64:
    """Lognormal token counts with the given mean, clipped to ``[1, hi]``."""
    sigma_arr = np.asarray(sigma, dtype=np.float64)
    mu = np.log(np.asarray(mean, dtype=np.float64)) - sigma_arr**2 / 2
    draws = rng.lognormal(mu, sigma_arr, n) if n else np.zeros(0)
    return np.clip(np.rint(draws), 1, hi).astype(np.int64)


@dataclass(frozen=True)
class ProfileKnobs:
    """The knobs of every profile; a profile's subclass gives ``output`` and ``warmup_s``
    its calibrated values."""

    output: tuple[float, float]
    """(mean, sigma) of the lognormal output tokens of a request."""
    warmup_s: float
    """Requests start this long before the window, so it opens mid-stream."""
    max_context: int = 32_768
    """Tokens of the longest prompt: a conversation or chain whose next prompt would pass
    it ends, and the new content of one prompt is capped at a fraction of it."""
    max_output: int = 8192
    """Output tokens of a request are capped at this."""

    def output_tokens(self, rng: np.random.Generator, n: int) -> I64:
        """The output lengths of ``n`` requests."""
        return lognormal_tokens(rng, *self.output, n, self.max_output)
